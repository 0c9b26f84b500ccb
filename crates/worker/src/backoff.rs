//! Retry delays: exponential, capped, with jitter so that jobs that failed together (a receiver
//! that was down for a minute) do not all come back in the same instant.

use std::time::Duration;

/// Exponential backoff settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure, before jitter.
    pub base: Duration,
    /// The longest delay, before jitter.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        use crate::settings::defaults as d;
        Self { base: Duration::from_millis(d::BACKOFF_BASE_MS), max: Duration::from_secs(d::BACKOFF_MAX_SECS) }
    }
}

impl Backoff {
    /// The delay before the attempt after failed attempt number `attempt` (1-based):
    /// `min(max, base * 2^(attempt - 1))`, of which a random part in `[0, 1/2)` is taken off
    /// ("equal jitter": never less than half the nominal delay). `unit` is a random number in
    /// `[0, 1)`. A server's `Retry-After` is honoured when longer, up to `max`.
    #[must_use]
    pub fn delay(&self, attempt: i32, unit: f64, retry_after: Option<Duration>) -> Duration {
        let exponent = attempt.saturating_sub(1).clamp(0, 30);
        let nominal = self.base.saturating_mul(1u32 << exponent).min(self.max);
        let jittered = nominal.mul_f64(1.0 - unit.clamp(0.0, 1.0) / 2.0);
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.max)),
            None => jittered,
        }
    }

    /// [`Self::delay`] with a fresh random number.
    #[must_use]
    pub fn next(&self, attempt: i32, retry_after: Option<Duration>) -> Duration {
        self.delay(attempt, fastrand::f64(), retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(10) };

    #[test]
    fn doubles_per_attempt_up_to_the_cap() {
        assert_eq!(B.delay(1, 0.0, None), Duration::from_millis(100));
        assert_eq!(B.delay(2, 0.0, None), Duration::from_millis(200));
        assert_eq!(B.delay(5, 0.0, None), Duration::from_millis(1600));
        assert_eq!(B.delay(10, 0.0, None), Duration::from_secs(10));
        assert_eq!(B.delay(i32::MAX, 0.0, None), Duration::from_secs(10));
        assert_eq!(B.delay(0, 0.0, None), Duration::from_millis(100));
    }

    #[test]
    fn jitter_takes_off_at_most_half() {
        for i in 0..1000 {
            let unit = f64::from(i) / 1000.0;
            let d = B.delay(3, unit, None);
            assert!(d > Duration::from_millis(200) && d <= Duration::from_millis(400), "{d:?}");
        }
        let spread: std::collections::HashSet<_> = (0..50).map(|_| B.next(3, None)).collect();
        assert!(spread.len() > 10, "jitter spreads retries");
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        assert_eq!(B.delay(1, 0.0, Some(Duration::from_secs(3))), Duration::from_secs(3));
        assert_eq!(B.delay(1, 0.0, Some(Duration::from_secs(3600))), Duration::from_secs(10));
        assert_eq!(B.delay(5, 0.0, Some(Duration::from_millis(1))), Duration::from_millis(1600));
    }
}
