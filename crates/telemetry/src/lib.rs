//! Logs and traces for every Breakwater binary: one `tracing` registry, filtered by `RUST_LOG`,
//! with the log output (pretty or JSON lines) and, when an OTLP endpoint is configured, an
//! OpenTelemetry layer exporting the same spans over OTLP/HTTP (protobuf).
//!
//! Traces are off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set. The endpoint is the collector's
//! base URL, as the OpenTelemetry specification defines the variable: spans are POSTed to
//! `{endpoint}/v1/traces`. `OTEL_EXPORTER_OTLP_HEADERS` and the batch processor's `OTEL_BSP_*`
//! variables are honoured by the SDK.
//!
//! Trace context crosses process boundaries as a W3C `traceparent`: read from incoming request
//! headers ([`set_parent_from_headers`]), written onto a job row by the request that enqueues it
//! ([`current_traceparent`]) and read back by the worker that runs it
//! ([`set_parent_from_traceparent`]).
//!
//! [`figures`] is the list of a process's figures, each described once, from which its three
//! views are rendered; [`prometheus`] holds what the API's and the worker's `/metrics` share;
//! [`emf`] writes metrics as CloudWatch embedded-metric-format log lines (for ECS, where nothing
//! scrapes `/metrics`).

pub mod emf;
pub mod figures;
pub mod prometheus;

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The variable that turns tracing export on.
pub const OTLP_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// How the logs are written (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogOutput {
    /// Human-readable, one line per event.
    Pretty,
    /// One JSON object per line, with the current span (log pipelines).
    Json,
}

/// The logging and tracing settings every binary reads, as one clap group: the same variables
/// with the same defaults in the API and the worker.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format: `pretty`, or `json` (one object per line, for log pipelines).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "pretty", global = true)]
    pub log_format: LogOutput,
    /// The OpenTelemetry collector's base URL (OTLP over HTTP, protobuf): spans are sent to
    /// `{endpoint}/v1/traces`. Unset or empty: no traces are exported. A job's span continues the
    /// trace of the request that enqueued it.
    #[arg(long, env = OTLP_ENDPOINT_VAR, global = true)]
    pub otel_exporter_otlp_endpoint: Option<String>,
}

impl LogArgs {
    /// Installs the telemetry these settings describe ([`Telemetry::init`]).
    ///
    /// # Errors
    /// When the endpoint is not a valid URL or the exporter cannot be built.
    pub fn init(&self, service: &'static str, default_filter: &str) -> anyhow::Result<Telemetry> {
        Telemetry::init(&Settings {
            service,
            logs: self.log_format,
            default_filter,
            otlp_endpoint: self.otel_exporter_otlp_endpoint.as_deref(),
        })
    }
}

/// What to set up.
#[derive(Debug, Clone)]
pub struct Settings<'a> {
    /// `service.name` of the exported spans.
    pub service: &'static str,
    /// The log format.
    pub logs: LogOutput,
    /// The filter when `RUST_LOG` is unset.
    pub default_filter: &'a str,
    /// The OTLP collector's base URL; `None` (or empty) exports nothing.
    pub otlp_endpoint: Option<&'a str>,
}

/// The installed telemetry. Call [`Telemetry::shutdown`] before the process exits: it flushes
/// the spans still in the batch processor's buffer.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the global subscriber (once per process: a second call keeps the first
    /// subscriber and exports nothing more) and, with an endpoint, the OTLP exporter.
    ///
    /// # Errors
    /// When the endpoint is not a valid URL or the exporter cannot be built.
    pub fn init(settings: &Settings<'_>) -> anyhow::Result<Self> {
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(settings.default_filter));
        let provider = match settings.otlp_endpoint.map(str::trim).filter(|e| !e.is_empty()) {
            Some(endpoint) => Some(provider(settings.service, endpoint)?),
            None => None,
        };
        let otel = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(settings.service)));
        let registry = tracing_subscriber::registry().with(filter).with(otel);
        let installed = match settings.logs {
            LogOutput::Json => {
                registry.with(tracing_subscriber::fmt::layer().json().with_current_span(true)).try_init().is_ok()
            }
            LogOutput::Pretty => registry.with(tracing_subscriber::fmt::layer().compact()).try_init().is_ok(),
        };
        if !installed {
            // Already installed (tests start several apps in one process): the first one stays.
            if let Some(p) = provider {
                let _ = p.shutdown();
            }
            return Ok(Self { provider: None });
        }
        if let Some(p) = &provider {
            opentelemetry::global::set_tracer_provider(p.clone());
            tracing::info!(service = settings.service, "exporting traces over OTLP/HTTP");
        }
        Ok(Self { provider })
    }

    /// Whether spans are exported.
    #[must_use]
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans finished so far now (tests; the batch processor otherwise exports
    /// every few seconds).
    pub fn flush(&self) {
        if let Some(p) = &self.provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!(error = %e, "flushing traces failed");
        }
    }

    /// Flushes the buffered spans and stops the exporter, waiting at most `timeout`.
    pub fn shutdown(self, timeout: Duration) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "flushing traces at shutdown failed");
        }
    }
}

fn provider(service: &'static str, endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig as _;
    // The specification's OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the traces path is appended.
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(Duration::from_secs(5))
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// The W3C `traceparent` of the current span, when it is being traced (with an exporter and a
/// sampled trace); `None` otherwise.
#[must_use]
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the remote span a W3C `traceparent` names (a job's enqueuing request).
/// An invalid value is ignored: the span starts a trace of its own.
pub fn set_parent_from_traceparent(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Makes `span` a child of the caller's span when the request carries a valid W3C
/// `traceparent` (and `tracestate`) header.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untraced_span_has_no_traceparent() {
        // No OpenTelemetry layer installed: nothing to propagate.
        let span = tracing::info_span!("x");
        let _g = span.enter();
        assert_eq!(current_traceparent(), None);
    }

    #[test]
    fn a_traceparent_round_trips_through_a_span() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let span = tracing::info_span!("job");
            set_parent_from_traceparent(&span, parent);
            let child = span.in_scope(|| current_traceparent().expect("traced"));
            assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "same trace: {child}");
            assert!(!child.contains("00f067aa0ba902b7"), "its own span id: {child}");
            let garbage = tracing::info_span!("other");
            set_parent_from_traceparent(&garbage, "not-a-traceparent");
            let own = garbage.in_scope(|| current_traceparent().expect("traced"));
            assert!(!own.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "a trace of its own: {own}");
        });
    }
}
