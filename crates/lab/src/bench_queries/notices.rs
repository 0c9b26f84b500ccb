//! PostgreSQL's notices (auto_explain's plans), captured from sqlx's log.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// Captures PostgreSQL notices (sqlx logs them as tracing events), and nothing else: the rest of
/// sqlx's logging stays disabled, so it costs the timed queries nothing.
#[derive(Clone, Default)]
pub(super) struct Notices(Arc<Mutex<Vec<String>>>);

pub(super) const NOTICE_TARGET: &str = "sqlx::postgres::notice";

impl Notices {
    pub(super) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn register_callsite(&self, meta: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        if meta.target() == NOTICE_TARGET {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &tracing::Metadata<'_>, _: tracing_subscriber::layer::Context<'_, S>) -> bool {
        meta.target() == NOTICE_TARGET
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "message" {
                    self.0.push_str(value);
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let _ = write!(self.0, "{value:?}");
                }
            }
        }
        if event.metadata().target() == NOTICE_TARGET {
            let mut text = Text(String::new());
            event.record(&mut text);
            self.0.lock().expect("not poisoned").push(text.0);
        }
    }
}
