//! Every figure the API publishes, each described once.
//!
//! A layer publishes its figures through [`Publish`], implemented next to its own status type,
//! on the list of [`breakwater_telemetry::figures`] (the model the worker uses too): for each
//! figure its Prometheus name, kind, help text, its series, and where it appears in the other
//! two views: its CloudWatch metric ([`crate::emf`]) and its member of `/v1/ops/status`. [`read`]
//! gathers them from every layer in one list, and the views are rendered from that list:
//! `/metrics` ([`crate::metrics`]) encodes it, the CloudWatch lines are computed from it, and
//! `/v1/ops/status` serialises the same status types the figures are read from. A new figure is
//! written in one place, its layer's [`Publish`].
//!
//! A figure that says nothing about a view is a mistake the API's tests catch
//! (`tests/figures.rs` renders the three views and checks each figure against each).

pub use breakwater_telemetry::figures::*;

use crate::state::AppState;

/// What a layer publishes: its figures, read now.
pub trait Publish {
    /// Adds the figures to `out`.
    fn publish(&self, out: &mut Figures);
}

/// Every figure of the API, read now, in the order `/metrics` lists them: the requests, the
/// layers, the job queue (`queue`: its cached figures, if ever read) and the runtime.
#[must_use]
pub fn read(state: &AppState, queue: Option<crate::queue_stats::Reading>) -> Figures {
    let mut out = Figures::default();
    state.metrics.publish_requests(&mut out);
    out.under("/layers/connections", |out| state.connections.publish(out));
    out.under("/layers/retry_pacing", |out| state.pacing.snapshot().publish(out));
    out.under("/layers/body", |out| state.body.status().publish(out));
    out.under("/layers/bulkhead", |out| state.bulkhead.status().publish(out));
    out.under("/layers/pool", |out| crate::routes::ops::Pool::read(state).publish(out));
    out.under("/layers/throttles", |out| state.throttles.status().publish(out));
    out.under("/layers/capacity", |out| state.admission.snapshot().publish(out));
    out.under("/layers/streams", |out| state.streams.status().publish(out));
    out.under("/layers/jobs", |out| {
        crate::queue_stats::JobFigures { reading: queue, failures: state.queue_stats.failures() }.publish(out);
    });
    state.metrics.publish_runtime(&mut out);
    out
}
