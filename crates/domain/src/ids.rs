//! Newtypes for the ids that scope every query.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The tenant a request acts for. Only the auth layer creates one, from a verified token, so a
/// repository function cannot be called without saying whose data it touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(pub Uuid);

/// The agent or admin (a `users` row of the tenant) a request acts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserId(pub Uuid);

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A new time-ordered (v7) key: inserts append to the right edge of the b-tree.
#[must_use]
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}
