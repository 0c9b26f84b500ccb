//! GCRA (the generic cell rate algorithm) in integer microseconds.
//!
//! A bucket is one number, its theoretical arrival time (TAT). With emission interval `T = 1/rate`
//! and tolerance `tau = T * (burst - 1)`, a request at `now` is admitted when
//! `max(TAT, now) - now <= tau`, and then `TAT = max(TAT, now) + T`. A client hammering a fresh
//! bucket for `t` seconds is admitted exactly `burst + floor(rate * t)` times.
//!
//! The same arithmetic runs in Redis (`gcra.lua`, on Redis's clock, shared by every API task)
//! and in process (the fallback while Redis is unavailable), so degrading changes where the
//! state lives, not what the limit means.

/// A rate limit: sustained rate and burst.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct Limit {
    /// Sustained requests per second.
    pub rate_per_sec: f64,
    /// Requests allowed at once from a full bucket.
    pub burst: u32,
}

impl Limit {
    /// The emission interval `T`, in microseconds (at least 1).
    #[must_use]
    #[allow(clippy::cast_possible_truncation)] // clamped into i64's range first
    pub fn interval_us(&self) -> i64 {
        let t = (1e6 / self.rate_per_sec.max(1e-6)).round().clamp(1.0, 9.0e15);
        t as i64
    }

    /// The tolerance `tau = T * (burst - 1)`, in microseconds.
    #[must_use]
    pub fn tolerance_us(&self) -> i64 {
        self.interval_us().saturating_mul(i64::from(self.burst.max(1) - 1))
    }

    /// This limit split across `tasks` processes (the in-process fallback's share).
    #[must_use]
    pub fn divided(&self, tasks: u32) -> Self {
        let tasks = tasks.max(1);
        Self { rate_per_sec: self.rate_per_sec / f64::from(tasks), burst: (self.burst / tasks).max(1) }
    }

    /// The window of the IETF `RateLimit-Policy` header: seconds to refill a whole burst.
    #[must_use]
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped positive and finite first
    pub fn window_secs(&self) -> u64 {
        (f64::from(self.burst) / self.rate_per_sec.max(1e-6)).ceil().clamp(1.0, 9.0e15) as u64
    }
}

/// The outcome of one bucket check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; the bucket's new TAT, how many more requests it admits right now, and
    /// microseconds until it is full again.
    Admitted {
        /// New theoretical arrival time.
        tat: i64,
        /// Further requests admitted at once.
        remaining: u64,
        /// Microseconds until the bucket is full.
        reset_us: i64,
    },
    /// Refused; microseconds until a request would be admitted.
    Refused {
        /// Microseconds to wait.
        retry_after_us: i64,
    },
}

/// Checks one bucket whose stored TAT is `tat` (None: never used) at `now`.
#[must_use]
pub fn check(tat: Option<i64>, now: i64, limit: Limit) -> Outcome {
    let t = limit.interval_us();
    let tau = limit.tolerance_us();
    let tat = tat.unwrap_or(now).max(now);
    if tat - now > tau {
        return Outcome::Refused { retry_after_us: tat - now - tau };
    }
    let new_tat = tat + t;
    let ahead = new_tat - now;
    let remaining = if ahead <= tau { u64::try_from((tau - ahead) / t + 1).unwrap_or(0) } else { 0 };
    Outcome::Admitted { tat: new_tat, remaining, reset_us: ahead }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A client that retries the instant it is allowed to, for `duration_us`; returns how many
    /// requests were admitted.
    fn hammer(limit: Limit, duration_us: i64) -> u64 {
        let mut tat = None;
        let mut admitted = 0;
        let mut now = 1_000_000_000;
        let end = now + duration_us;
        while now <= end {
            match check(tat, now, limit) {
                Outcome::Admitted { tat: t, .. } => {
                    tat = Some(t);
                    admitted += 1;
                }
                Outcome::Refused { retry_after_us } => now += retry_after_us,
            }
        }
        admitted
    }

    #[test]
    fn burst_then_rate() {
        let limit = Limit { rate_per_sec: 10.0, burst: 5 };
        // 5 at once, then one per 100 ms for 2 s = 20 more.
        assert_eq!(hammer(limit, 2_000_000), 5 + 20);
    }

    #[test]
    fn remaining_counts_down_and_retry_after_is_exact() {
        let limit = Limit { rate_per_sec: 2.0, burst: 3 };
        let now = 10_000_000;
        let mut tat = None;
        for expected in [2, 1, 0] {
            match check(tat, now, limit) {
                Outcome::Admitted { tat: t, remaining, .. } => {
                    assert_eq!(remaining, expected);
                    tat = Some(t);
                }
                Outcome::Refused { .. } => panic!("refused within the burst"),
            }
        }
        let Outcome::Refused { retry_after_us } = check(tat, now, limit) else { panic!("admitted past the burst") };
        assert_eq!(retry_after_us, 500_000);
        assert!(matches!(check(tat, now + retry_after_us, limit), Outcome::Admitted { .. }));
        assert!(matches!(check(tat, now + retry_after_us - 1, limit), Outcome::Refused { .. }));
    }

    proptest! {
        #[test]
        fn admits_burst_plus_rate_times_duration(rate in 1u32..200, burst in 1u32..50, secs in 1i64..5) {
            let limit = Limit { rate_per_sec: f64::from(rate), burst };
            let admitted = hammer(limit, secs * 1_000_000);
            let expected = u64::from(burst) + u64::from(rate) * u64::try_from(secs).expect("positive");
            prop_assert!(admitted.abs_diff(expected) <= 1, "admitted {admitted}, expected {expected}");
        }

        #[test]
        fn divided_limits_never_exceed_the_whole(rate in 1u32..1000, burst in 1u32..1000, tasks in 1u32..16) {
            let whole = Limit { rate_per_sec: f64::from(rate), burst };
            let part = whole.divided(tasks);
            prop_assert!(part.rate_per_sec * f64::from(tasks) <= whole.rate_per_sec + 1e-9);
            prop_assert!(part.burst >= 1);
        }
    }
}
