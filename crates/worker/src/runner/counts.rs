//! What a worker did: the live counters its tasks add to, and the [`Counts`] read from them.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::client::ClientCounts;

/// What a worker did (returned by [`Worker::run`](super::Worker::run), and logged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Jobs claimed.
    pub claimed: u64,
    /// Jobs completed.
    pub completed: u64,
    /// Failed attempts sent back to the queue with a backoff.
    pub retried: u64,
    /// Jobs that went dead here.
    pub dead: u64,
    /// Jobs released unfinished at shutdown.
    pub released: u64,
    /// Jobs whose lease this worker lost (expired and rescued elsewhere) while running them.
    pub lease_lost: u64,
    /// Other workers' jobs with expired leases that this worker's rescuer returned to the queue.
    pub rescued: u64,
    /// Finished jobs pruned by this worker.
    pub pruned: u64,
    /// Idempotency keys past their retention deleted by this worker.
    pub keys_pruned: u64,
    /// Live-inbox events past their retention (by age or per-tenant count) deleted by this worker.
    pub stream_events_pruned: u64,
    /// The webhook client's figures.
    pub client: ClientCounts,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) claimed: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dead: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) lease_lost: AtomicU64,
    pub(super) rescued: AtomicU64,
    pub(super) pruned: AtomicU64,
    pub(super) keys_pruned: AtomicU64,
    pub(super) stream_events_pruned: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self, client: ClientCounts) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            claimed: get(&self.claimed),
            completed: get(&self.completed),
            retried: get(&self.retried),
            dead: get(&self.dead),
            released: get(&self.released),
            lease_lost: get(&self.lease_lost),
            rescued: get(&self.rescued),
            pruned: get(&self.pruned),
            keys_pruned: get(&self.keys_pruned),
            stream_events_pruned: get(&self.stream_events_pruned),
            client,
        }
    }
}
