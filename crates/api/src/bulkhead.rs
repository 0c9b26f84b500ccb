//! The database bulkhead: at most `DB_POOL_SIZE` requests hold a database slot at once, and a
//! request that cannot get one within `DB_ACQUIRE_TIMEOUT_MS` is refused with 503
//! `db_saturated` at once instead of waiting (a pool-exhaustion error after fifteen seconds is
//! the failure this replaces).
//!
//! A request holds at most one connection at a time (its queries run one after another), so a
//! slot per request, sized like the pool, means the pool's own acquire never waits; and unlike
//! the pool, the slots can say how many requests are waiting, and how long the longest hold
//! was: a slot held for a client (a stalled body, say) would show there as seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Response;
use axum::middleware::Next;
use axum::response::IntoResponse as _;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::state::AppState;

/// Slots for database work.
#[derive(Debug)]
pub struct Bulkhead {
    slots: Arc<Semaphore>,
    size: usize,
    timeout: Duration,
    waiting: AtomicUsize,
    timeouts: AtomicU64,
    longest_hold_us: AtomicU64,
}

/// The published state of the bulkhead.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkheadStatus {
    /// Slots (the pool's size).
    pub size: usize,
    /// Slots held now.
    pub in_use: usize,
    /// Requests waiting for a slot now.
    pub waiting: usize,
    /// How long a request waits before 503 `db_saturated`, ms.
    pub acquire_timeout_ms: u64,
    /// Requests refused with `db_saturated` since start.
    pub acquire_timeouts: u64,
    /// The longest any request has held a slot since start, ms (from the slot to the handler's
    /// response). Bodies are read before the slot is taken, so a client that stalls its body
    /// cannot make this longer; a hold near `BODY_READ_TIMEOUT_MS` would say one did.
    pub longest_hold_ms: f64,
}

impl Bulkhead {
    /// `size` slots, waited for at most `timeout`.
    #[must_use]
    pub fn new(size: usize, timeout: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(size)),
            size,
            timeout,
            waiting: AtomicUsize::new(0),
            timeouts: AtomicU64::new(0),
            longest_hold_us: AtomicU64::new(0),
        }
    }

    /// The published state.
    #[must_use]
    pub fn status(&self) -> BulkheadStatus {
        BulkheadStatus {
            size: self.size,
            in_use: self.size.saturating_sub(self.slots.available_permits()),
            waiting: self.waiting.load(Ordering::Relaxed),
            acquire_timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            acquire_timeouts: self.timeouts.load(Ordering::Relaxed),
            longest_hold_ms: Duration::from_micros(self.longest_hold_us.load(Ordering::Relaxed)).as_secs_f64() * 1e3,
        }
    }
}

/// A slot while it is held. Dropping it frees the slot and counts the hold, also when the
/// handler's future is dropped (the request timeout, a client gone), so the longest hold cannot
/// miss the holds that end that way.
struct Held<'a> {
    _permit: OwnedSemaphorePermit,
    since: Instant,
    bulkhead: &'a Bulkhead,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let us = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.bulkhead.longest_hold_us.fetch_max(us, Ordering::Relaxed);
    }
}

/// Middleware: run the handler holding a slot, or refuse with `db_saturated`.
pub(crate) async fn hold_slot(State(state): State<AppState>, req: Request, next: Next) -> Response<Body> {
    let bulkhead = &*state.bulkhead;
    let permit = match bulkhead.slots.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            bulkhead.waiting.fetch_add(1, Ordering::Relaxed);
            let waited = tokio::time::timeout(bulkhead.timeout, bulkhead.slots.clone().acquire_owned()).await;
            bulkhead.waiting.fetch_sub(1, Ordering::Relaxed);
            match waited {
                Ok(Ok(p)) => p,
                _ => {
                    bulkhead.timeouts.fetch_add(1, Ordering::Relaxed);
                    return ApiError::DbSaturated.into_response();
                }
            }
        }
    };
    let held = Held { _permit: permit, since: Instant::now(), bulkhead };
    let response = next.run(req).await;
    drop(held);
    response
}

impl crate::figures::Publish for BulkheadStatus {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Lines, NOT_ALARMED, Unit};
        out.setting("bulkhead_slots", "Database bulkhead slots", self.size).ops("size");
        out.gauge("bulkhead_in_use", "Database bulkhead slots held", self.in_use).no_emf(NOT_ALARMED).ops("in_use");
        out.gauge("bulkhead_waiting", "Requests waiting for a database slot", self.waiting)
            .no_emf(NOT_ALARMED)
            .ops("waiting");
        out.counter("bulkhead_acquire_timeouts", "Requests refused with db_saturated", self.acquire_timeouts)
            .emf("BulkheadTimeouts", Unit::Count, Lines::Task)
            .ops("acquire_timeouts");
        out.gauge(
            "bulkhead_longest_hold_ms",
            "The longest any request has held a database slot since start, ms",
            self.longest_hold_ms,
        )
        .no_emf(NOT_ALARMED)
        .ops("longest_hold_ms");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hold_cut_short_by_the_request_timeout_still_counts() {
        let bulkhead = Arc::new(Bulkhead::new(1, Duration::from_millis(10)));
        let b = Arc::clone(&bulkhead);
        let handler = async move {
            let permit = b.slots.clone().acquire_owned().await.expect("a slot");
            let _held = Held { _permit: permit, since: Instant::now(), bulkhead: &b };
            std::future::pending::<()>().await;
        };
        // The timeout drops the handler's future while it holds the slot.
        assert!(tokio::time::timeout(Duration::from_millis(30), handler).await.is_err());
        let status = bulkhead.status();
        assert_eq!(status.in_use, 0, "the slot is free again");
        assert!(status.longest_hold_ms >= 30.0, "the dropped hold counts: {} ms", status.longest_hold_ms);
    }
}
