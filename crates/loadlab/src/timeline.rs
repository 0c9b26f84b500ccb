//! A step second by second: what was offered in each second and how what ended in it ended, for
//! runs whose interest is a change inside one long step (a surge, a task joining a fleet, a
//! fault) rather than the step's totals.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::classify::Outcome;
use crate::stats::Hist;

/// One second of a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the step began.
    pub second: u32,
    #[serde(flatten)]
    pub counts: Counts,
    /// The 2xx's latency from the intended send (coordinated omission corrected), ms.
    pub ok_p50_ms: f64,
    pub ok_p99_ms: f64,
}

/// A second's requests: those meant to be sent in it, and how those that ended in it ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests meant to be sent in this second (by the schedule).
    pub offered: u64,
    /// Of the requests that ended in this second: 2xx, refusals by code, errors by kind.
    pub ok: u64,
    pub refused: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
}

impl Counts {
    /// Adds `other`'s requests to these (the same second of several loads).
    pub fn add(&mut self, other: &Self) {
        self.offered += other.offered;
        self.ok += other.ok;
        for (code, n) in &other.refused {
            *self.refused.entry(code.clone()).or_default() += n;
        }
        for (kind, n) in &other.errors {
            *self.errors.entry(kind.clone()).or_default() += n;
        }
    }
}

#[derive(Debug, Default)]
struct Acc {
    counts: Counts,
    ok_latency: Option<Hist>,
}

/// Accumulates a step's seconds.
#[derive(Debug)]
pub struct Timeline {
    origin: Instant,
    seconds: Vec<Acc>,
}

impl Timeline {
    pub fn new(origin: Instant) -> Self {
        Self { origin, seconds: Vec::new() }
    }

    fn at(&mut self, t: Instant) -> &mut Acc {
        let i = usize::try_from(t.saturating_duration_since(self.origin).as_secs()).unwrap_or(usize::MAX).min(1 << 20);
        if self.seconds.len() <= i {
            self.seconds.resize_with(i + 1, Acc::default);
        }
        &mut self.seconds[i]
    }

    pub fn record(&mut self, intended: Instant, end: Instant, outcome: &Outcome) {
        self.at(intended).counts.offered += 1;
        let acc = self.at(end);
        match outcome {
            Outcome::Ok => {
                acc.counts.ok += 1;
                acc.ok_latency.get_or_insert_with(Hist::coarse).record(end.saturating_duration_since(intended));
            }
            Outcome::Refused { code, .. } => *acc.counts.refused.entry(code.clone()).or_default() += 1,
            Outcome::Error { kind } => *acc.counts.errors.entry(kind.clone()).or_default() += 1,
        }
    }

    pub fn seconds(&self) -> Vec<Second> {
        self.seconds
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let p = a.ok_latency.as_ref().map(Hist::summary).unwrap_or_default();
                Second {
                    second: u32::try_from(i).unwrap_or(u32::MAX),
                    counts: a.counts.clone(),
                    ok_p50_ms: p.p50_ms,
                    ok_p99_ms: p.p99_ms,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_request_is_offered_in_its_intended_second_and_ends_in_its_last() {
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let mut t = Timeline::new(t0);
        t.record(s(100), s(300), &Outcome::Ok);
        t.record(s(900), s(1_200), &Outcome::Ok);
        t.record(s(1_500), s(1_510), &Outcome::Refused { code: "load_shed".into(), retry_after: true });
        t.record(s(2_100), s(2_200), &Outcome::error("status_502"));
        let secs = t.seconds();
        assert_eq!(secs.iter().map(|x| x.counts.offered).collect::<Vec<_>>(), vec![2, 1, 1]);
        assert_eq!(secs.iter().map(|x| x.counts.ok).collect::<Vec<_>>(), vec![1, 1, 0]);
        assert_eq!(secs[1].counts.refused.get("load_shed"), Some(&1));
        assert_eq!(secs[2].counts.errors.get("status_502"), Some(&1));
        assert!((secs[1].ok_p99_ms - 300.0).abs() < 5.0, "{}", secs[1].ok_p99_ms);
    }

    #[test]
    fn a_seconds_counts_are_members_of_its_own_json_and_add_up() {
        let mut t = Timeline::new(Instant::now());
        let now = Instant::now();
        t.record(now, now, &Outcome::Refused { code: "load_shed".into(), retry_after: true });
        t.record(now, now, &Outcome::error("timeout"));
        let second = t.seconds().remove(0);
        let json = serde_json::to_string(&second).expect("serialises");
        assert_eq!(
            json,
            r#"{"second":0,"offered":2,"ok":0,"refused":{"load_shed":1},"errors":{"timeout":1},"ok_p50_ms":0.0,"ok_p99_ms":0.0}"#
        );
        assert_eq!(serde_json::from_str::<Second>(&json).expect("parses"), second);
        let mut sum = second.counts.clone();
        sum.add(&second.counts);
        assert_eq!((sum.offered, sum.refused["load_shed"], sum.errors["timeout"]), (4, 2, 2));
    }
}
