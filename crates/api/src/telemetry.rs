//! Logs and traces, set up once per process by `breakwater-telemetry`: an env-filtered registry
//! with pretty or JSON output and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, OpenTelemetry
//! spans exported over OTLP/HTTP from the same registry.

pub use breakwater_telemetry::{LogArgs, Telemetry};

/// The API's service name in exported spans.
pub const SERVICE: &str = "breakwater-api";
/// The filter when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info,sqlx=warn";

/// Installs the global subscriber. `RUST_LOG` overrides the default (`info,sqlx=warn`).
///
/// # Errors
/// When the OTLP endpoint is not a valid URL.
pub fn init(log: &LogArgs) -> anyhow::Result<Telemetry> {
    log.init(SERVICE, DEFAULT_FILTER)
}
