//! Adaptive admission control as tower layers.
//!
//! The operator configures a latency target, never a concurrency: the in-flight limit is derived
//! from the service (see `docs/ADMISSION.md`). Work beyond the limit waits in a small bounded
//! queue that takes turns between tenants; a full queue or an expired wait is a cheap, typed 503
//! with `Retry-After`. Slots are freed when the response body has been sent, on panic and on
//! client disconnect. Knows nothing of chat: any `http` tower service will do.
//!
//! ```
//! use breakwater_admission::{Admission, AdmissionConfig, ClassConfig, Route, ClassId};
//! use http::Request;
//!
//! type Body = http_body_util::Full<bytes::Bytes>;
//!
//! let mut config = AdmissionConfig::default();
//! let lists = config.add_class(ClassConfig::new("lists"));
//! let admission = Admission::new(config).expect("valid config");
//!
//! let layer = admission.layer(
//!     move |req: &Request<Body>| match req.uri().path() {
//!         "/health" | "/ready" | "/metrics" | "/v1/ops/status" => Route::Bypass,
//!         "/v1/conversations" | "/v1/contacts" => Route::Class(lists),
//!         _ => Route::Class(ClassId::DEFAULT),
//!     },
//!     |req: &Request<Body>| {
//!         req.headers().get("x-tenant").and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
//!     },
//! );
//! # let _ = layer;
//! let figures = admission.snapshot(); // serde::Serialize
//! assert_eq!(figures.load.in_flight, 0);
//! ```

mod body;
mod config;
mod controller;
mod fairness;
mod histogram;
mod keys;
mod layer;
mod pacing;
mod queue;
mod refusal;
mod snapshot;
mod state;

pub use body::{AdmissionBody, LongLived};
pub use config::{
    AdmissionConfig, Algorithm, ClassConfig, ClassId, ConfigError, LONGEST_RETRY_AFTER, Mode, ParseError,
};
pub use layer::{AdmissionLayer, AdmissionService, ResponseFuture, Route, client_timeout};
pub use pacing::{
    PaceableRefusal, PacedFuture, PacingConfig, PacingSnapshot, RetryPacing, RetryPacingLayer, RetryPacingService,
};
pub use refusal::{Refusal, RefusalReason, Render};
pub use snapshot::{ClassSnapshot, Load, ShedTotals, Snapshot};
pub use state::Admission;
