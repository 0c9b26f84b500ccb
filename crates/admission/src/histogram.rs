//! A small log-bucketed latency histogram: recording is a shift and an add, percentiles are a
//! scan of 86 counters. Resolution is about 19% (four buckets per octave), plenty for p50/p95.

use std::time::Duration;

/// Values below 2^16 ns (65 us) share the first bucket.
const MIN_SHIFT: u32 = 16;
/// Octaves above the first bucket: up to 2^(16+21) ns, about 137 s.
const OCTAVES: u32 = 21;
const SUB: u32 = 4;
const BUCKETS: usize = (1 + OCTAVES * SUB + 1) as usize;

#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    counts: [u32; BUCKETS],
    total: u32,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: [0; BUCKETS], total: 0 }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < (1 << MIN_SHIFT) {
        return 0;
    }
    let log2 = 63 - ns.leading_zeros();
    let octave = log2 - MIN_SHIFT;
    if octave >= OCTAVES {
        return BUCKETS - 1;
    }
    let frac = (ns >> (log2 - 2)) & 3;
    // Bounded by BUCKETS (86), so the cast cannot truncate.
    (1 + octave * SUB) as usize + frac as usize
}

/// A representative value of a bucket: the middle of its range.
fn value(index: usize) -> Duration {
    if index == 0 {
        return Duration::from_nanos(1 << (MIN_SHIFT - 1));
    }
    let i = u32::try_from(index - 1).unwrap_or(0);
    let octave = i / SUB;
    let frac = u64::from(i % SUB);
    let low = (1u64 << (MIN_SHIFT + octave)) * (4 + frac) / 4;
    let width = (1u64 << (MIN_SHIFT + octave)) / 4;
    Duration::from_nanos(low + width / 2)
}

impl Histogram {
    pub(crate) fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        let b = &mut self.counts[bucket(ns)];
        *b = b.saturating_add(1);
        self.total = self.total.saturating_add(1);
    }

    #[cfg(test)]
    pub(crate) fn count(&self) -> u32 {
        self.total
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.total = self.total.saturating_add(other.total);
    }

    #[cfg(test)]
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    /// The q-quantile (0..=1) of everything recorded in `self` and `other` together.
    pub(crate) fn quantile_with(&self, other: &Self, q: f64) -> Option<Duration> {
        let total = u64::from(self.total) + u64::from(other.total);
        if total == 0 {
            return None;
        }
        // Rank of the wanted sample, 1-based; float to integer is bounded by `total`.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, (a, b)) in self.counts.iter().zip(other.counts.iter()).enumerate() {
            seen += u64::from(*a) + u64::from(*b);
            if seen >= rank {
                return Some(value(i));
            }
        }
        Some(value(BUCKETS - 1))
    }

    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        self.quantile_with(&Self::EMPTY, q)
    }

    const EMPTY: Self = Self { counts: [0; BUCKETS], total: 0 };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_bucket_resolution() {
        let mut h = Histogram::default();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile(0.5).map(|d| d.as_secs_f64() * 1e3);
        let p95 = h.quantile(0.95).map(|d| d.as_secs_f64() * 1e3);
        let close = |got: Option<f64>, want: f64| got.is_some_and(|g| (g / want - 1.0).abs() < 0.15);
        assert!(close(p50, 50.0), "{p50:?}");
        assert!(close(p95, 95.0), "{p95:?}");
        assert_eq!(h.count(), 100);
    }

    #[test]
    fn extremes_land_in_the_end_buckets() {
        let mut h = Histogram::default();
        h.record(Duration::from_nanos(10));
        h.record(Duration::from_secs(100_000));
        assert!(h.quantile(0.0).is_some_and(|d| d < Duration::from_micros(65)));
        assert!(h.quantile(1.0).is_some_and(|d| d > Duration::from_secs(60)));
        h.clear();
        assert_eq!(h.quantile(0.5), None);
    }

    #[test]
    fn buckets_are_monotonic() {
        let mut last = 0;
        for ns in (0..40).map(|s| 1u64 << s).chain([3_000, 7_777_777, 123_456_789]) {
            let b = bucket(ns);
            assert!(b < BUCKETS);
            if ns.is_power_of_two() {
                assert!(b >= last);
                last = b;
            }
        }
        for i in 1..BUCKETS - 1 {
            assert!(value(i) < value(i + 1));
            let ns = u64::try_from(value(i).as_nanos()).unwrap_or(0);
            assert_eq!(bucket(ns), i);
        }
    }
}
