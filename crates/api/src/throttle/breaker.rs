//! A small circuit breaker for the Redis throttles: after `threshold` consecutive failures it
//! opens for `cooldown`, then lets one probe through; the probe's success closes it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    epoch: Instant,
    failures: AtomicU32,
    /// Milliseconds since `epoch` until which the breaker is open; 0 when closed.
    open_until_ms: AtomicU64,
    open: AtomicBool,
    probing: AtomicBool,
    opens: AtomicU64,
}

impl Breaker {
    pub(super) fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold,
            cooldown,
            epoch: Instant::now(),
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            opens: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether this call may go to Redis: always when closed; when open, one probe per cooldown.
    pub(super) fn allows_call(&self) -> bool {
        if !self.open.load(Ordering::Relaxed) {
            return true;
        }
        if self.now_ms() < self.open_until_ms.load(Ordering::Relaxed) {
            return false;
        }
        // Cooldown over: exactly one caller probes.
        !self.probing.swap(true, Ordering::AcqRel)
    }

    /// Records a success; returns true when it closed an open breaker.
    pub(super) fn on_success(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        self.open.swap(false, Ordering::AcqRel)
    }

    /// Records a failure; returns true when it opened the breaker (the moment to log).
    pub(super) fn on_failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let was_probing = self.probing.swap(false, Ordering::AcqRel);
        if failures >= self.threshold || was_probing {
            let until = self.now_ms() + u64::try_from(self.cooldown.as_millis()).unwrap_or(u64::MAX);
            self.open_until_ms.store(until, Ordering::Relaxed);
            if !self.open.swap(true, Ordering::AcqRel) {
                self.opens.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    pub(super) fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_probes_once_and_closes_on_success() {
        let b = Breaker::new(3, Duration::from_millis(30));
        assert!(b.allows_call());
        assert!(!b.on_failure());
        assert!(!b.on_failure());
        assert!(b.on_failure(), "the third failure opens it");
        assert!(b.is_open() && !b.allows_call());
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.allows_call(), "one probe after the cooldown");
        assert!(!b.allows_call(), "only one");
        assert!(!b.on_failure(), "a failed probe re-opens without counting a new opening");
        assert!(b.is_open() && !b.allows_call());
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.allows_call());
        assert!(b.on_success(), "a successful probe closes it");
        assert!(!b.is_open() && b.allows_call());
        assert_eq!(b.opens(), 1);
    }
}
