//! The machine the experiments run on: cgroups at the production task's shape, and the
//! PostgreSQL and Redis servers they talk to.

pub mod pinned;
pub mod services;
