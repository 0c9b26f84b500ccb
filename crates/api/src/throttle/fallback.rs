//! The in-process buckets, used while Redis is unavailable: the same GCRA with every limit
//! divided by the number of API tasks, so the fleet as a whole still holds the limit.

use std::collections::HashMap;

use super::{Decision, KeyKind, Limit, Throttles, combine, gcra};

#[derive(Debug, Default)]
pub(super) struct LocalBuckets {
    tats: HashMap<String, i64>,
    checks_since_prune: u32,
}

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

impl Throttles {
    pub(super) fn check_local(
        &self,
        keys: &[String; 2],
        limits: &[(KeyKind, Limit); 2],
        ip_key: &str,
        ip_limit: (KeyKind, Limit),
    ) -> Decision {
        let tasks = self.settings.api_tasks;
        let now = now_us();
        let Ok(mut local) = self.local.lock() else { return Decision::Off };
        local.checks_since_prune += 1;
        if local.checks_since_prune > 10_000 {
            local.tats.retain(|_, tat| *tat > now);
            local.checks_since_prune = 0;
        }
        let group = |local: &mut LocalBuckets, entries: &[(&str, KeyKind, Limit)]| -> Decision {
            let mut outcomes = Vec::with_capacity(entries.len());
            for (key, kind, limit) in entries {
                let limit = limit.divided(tasks);
                match gcra::check(local.tats.get(*key).copied(), now, limit) {
                    gcra::Outcome::Refused { retry_after_us } => {
                        return Decision::Refused { kind: *kind, limit, retry_after_us };
                    }
                    gcra::Outcome::Admitted { tat, remaining, reset_us } => {
                        outcomes.push((key, *kind, limit, tat, remaining, reset_us));
                    }
                }
            }
            let mut tightest: Option<Decision> = None;
            for (key, kind, limit, tat, remaining, reset_us) in outcomes {
                local.tats.insert((*key).to_owned(), tat);
                let tighter = match tightest {
                    Some(Decision::Admitted { remaining: r, .. }) => remaining < r,
                    _ => true,
                };
                if tighter {
                    tightest = Some(Decision::Admitted { kind, limit, remaining, reset_us });
                }
            }
            tightest.unwrap_or(Decision::Off)
        };
        let first = group(&mut local, &[(&keys[0], limits[0].0, limits[0].1), (&keys[1], limits[1].0, limits[1].1)]);
        let second = group(&mut local, &[(ip_key, ip_limit.0, ip_limit.1)]);
        combine(first, second)
    }
}
