//! Breakwater's load lab: an open-loop load generator that finds the knee, the saturation
//! throughput and the capacity at an objective, counts refusals apart from errors, audits its
//! own accuracy, and gates on whole curves.
//!
//! It speaks HTTP like any client and depends on no other crate of the workspace.
//!
//! Entry points (what the CLI and `cargo xtask lab` call):
//! - [`runs::ramp`], [`runs::sweep`], [`runs::profile`], [`runs::smoke_only`] run a load and
//!   return a [`report::Report`];
//! - [`analysis::analyze`] reads a ramp's curve;
//! - [`compare::compare`] is the regression gate;
//! - [`report::Report::table`] and [`html::render`] present a report.

pub mod analysis;
pub mod classify;
pub mod client;
pub mod compare;
mod dur;
pub mod engine;
pub mod html;
pub mod procstat;
pub mod profiles;
pub mod report;
pub mod retry;
pub mod runs;
pub mod sampler;
pub mod schedule;
pub mod smoke;
pub mod stats;
pub mod step;
pub mod streams;
pub mod timeline;
pub mod tokens;
pub mod workload;

pub use analysis::{Analysis, AnalysisConfig};
pub use compare::{Comparison, Thresholds, compare};
pub use engine::EngineConfig;
pub use report::Report;
pub use runs::{ProfileConfig, RampConfig, RunError, Sampling, SweepConfig, UrlSteps};
pub use schedule::Arrivals;
pub use tokens::Tokens;
