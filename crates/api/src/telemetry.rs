//! Logs and traces, set up once per process by `breakwater-telemetry`: an env-filtered registry
//! with pretty or JSON output and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, OpenTelemetry
//! spans exported over OTLP/HTTP from the same registry.

pub use breakwater_telemetry::Telemetry;

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG` overrides the default (`info,sqlx=warn`).
///
/// # Errors
/// When the OTLP endpoint is not a valid URL.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    Telemetry::init(&breakwater_telemetry::Settings {
        service: "breakwater-api",
        logs: match format {
            LogFormat::Json => breakwater_telemetry::LogOutput::Json,
            LogFormat::Pretty => breakwater_telemetry::LogOutput::Pretty,
        },
        default_filter: "info,sqlx=warn",
        otlp_endpoint,
    })
}
