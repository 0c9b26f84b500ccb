//! Tracing set up once: an env-filtered registry with pretty or JSON output.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG` overrides the default (`info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry.with(tracing_subscriber::fmt::layer().json().with_current_span(true)).try_init(),
        LogFormat::Pretty => registry.with(tracing_subscriber::fmt::layer().compact()).try_init(),
    };
    // Already installed (tests): keep the first one.
    drop(result);
}
