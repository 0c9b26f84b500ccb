//! The experiment harness: everything `cargo xtask` measures or breaks on purpose, as a library
//! that xtask's command line drives.
//!
//! - [`rig`]: the machine the experiments run on: a command pinned in a cgroup at the production
//!   task's shape (`pinned`), and PostgreSQL and Redis found, started or made private
//!   (`services`).
//! - [`plan`], [`record`], [`report`] and [`lab`]: the headline experiment (admission off, static
//!   and adaptive at the production shape). The plan says what runs; `lab` runs it and keeps
//!   what it measured in a `record::LabRecord` (`lab.json`); `report` turns a record into the
//!   goals table, markdown and charts without touching the machine, so a committed `lab.json`
//!   renders the same report anywhere.
//! - [`fleet`]: API tasks behind HAProxy configured as the stack's ALB, autoscaled like its ECS
//!   service, through a surge: the minute a new task takes to start.
//! - [`chaos`]: the reliability suite, one module per scenario, against private servers.
//! - [`bench_queries`]: the API's queries timed on the full skewed seed, with their plans.
//!
//! Nothing in the workspace depends on this crate but xtask.

pub mod bench_queries;
pub mod chaos;
pub mod fleet;
pub mod lab;
pub mod plan;
pub mod record;
pub mod report;
pub mod rig;
