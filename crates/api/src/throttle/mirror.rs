//! The mirror: the buckets that refused, followed in process, so that a request whose bucket
//! would refuse it is answered its 429 ahead of admission (see [`super::ahead`]) without a Redis
//! round trip, and without taking an admission slot or queue place first.
//!
//! A bucket that refused (in Redis, or in the fallback) gets a door: a local copy of its GCRA,
//! set from the time the bucket gave and from each later answer for that bucket, and moved on
//! by each request the door lets through. While the copy says the bucket is empty, nothing
//! passes before the time the bucket gave, then one request per emission interval (the bucket's
//! own pace), and the rest are refused ahead; a bucket with room refuses nothing ahead. Without
//! the door, the mirror refused only until the bucket's next token (2 ms at 500/s), and a tenant
//! offering five times its plan sent nearly all of its excess into admission, where it took the
//! slots and the queue places of the tenants within theirs and was refused 503 instead of 429.
//!
//! The door refuses only what the bucket, as this task last heard of it, would refuse. It can be
//! wrong that way only when a request it let through never reached the bucket (admission refused
//! it: the copy charged it, the bucket did not). In a fleet, each task's door lets through up to
//! the whole rate, and Redis, which sees every task, still decides.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

use breakwater_domain::{TenantId, UserId};

use super::{Decision, KeyKind, Limit, Throttles, gcra, ip_bucket};

/// A bucket the mirror remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum MirrorKey {
    Tenant(TenantId),
    User(TenantId, UserId),
    Ip(IpAddr),
}

/// A bucket's door: its theoretical arrival time as this task last heard it, moved on by each
/// request the door let through since.
#[derive(Debug, Clone, Copy)]
struct Door {
    tat_us: i64,
    limit: Limit,
}

/// The doors of the buckets that refused, on a clock of microseconds since the mirror was made.
#[derive(Debug)]
pub(super) struct Mirror {
    epoch: Instant,
    doors: HashMap<MirrorKey, Door>,
    inserts: u32,
}

impl Default for Mirror {
    fn default() -> Self {
        Self { epoch: Instant::now(), doors: HashMap::new(), inserts: 0 }
    }
}

/// Buckets the mirror holds before it drops the ones that are full again.
const MIRROR_PRUNE_AT: usize = 4096;

impl Mirror {
    fn us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(i64::MAX)
    }

    /// `key`'s bucket, asked at `asked`, refused: it admits again `retry_after_us` later. The
    /// bucket gets a door, or its door is set again.
    fn refused(&mut self, key: MirrorKey, limit: Limit, asked: Instant, retry_after_us: i64) {
        let tat_us = self.us(asked).saturating_add(retry_after_us).saturating_add(limit.tolerance_us());
        self.doors.insert(key, Door { tat_us, limit });
        self.inserts += 1;
        if self.doors.len() > MIRROR_PRUNE_AT && self.inserts as usize > self.doors.len() / 2 {
            let now = self.us(Instant::now());
            self.doors.retain(|_, door| door.tat_us > now);
            self.inserts = 0;
        }
    }

    /// `key`'s bucket, asked at `asked`, admitted a request under `limit` (a tenant's plan may
    /// have changed since it refused) and is full again `reset_us` later. Only a bucket that
    /// refused before is followed: the others have no door.
    fn admitted(&mut self, key: MirrorKey, limit: Limit, asked: Instant, reset_us: i64) {
        let at = self.us(asked);
        if let Some(door) = self.doors.get_mut(&key) {
            *door = Door { tat_us: at.saturating_add(reset_us), limit };
        }
    }

    /// The door for a request through `keys` at `now`: the bucket that refuses it and how long
    /// until it would not (the longest, when several refuse); or `None`, and the request passes,
    /// charged to each door it went through.
    fn door(&mut self, keys: [(KeyKind, MirrorKey); 3], now: Instant) -> Option<(KeyKind, Limit, i64)> {
        if self.doors.is_empty() {
            return None;
        }
        let now = self.us(now);
        let mut refusal: Option<(KeyKind, Limit, i64)> = None;
        let mut charges: [Option<(MirrorKey, i64)>; 3] = [None; 3];
        for (slot, (kind, key)) in charges.iter_mut().zip(keys) {
            let Some(door) = self.doors.get(&key) else { continue };
            match gcra::check(Some(door.tat_us), now, door.limit) {
                gcra::Outcome::Refused { retry_after_us } => {
                    if refusal.is_none_or(|(_, _, longest)| retry_after_us > longest) {
                        refusal = Some((kind, door.limit, retry_after_us));
                    }
                }
                gcra::Outcome::Admitted { tat, .. } => *slot = Some((key, tat)),
            }
        }
        if refusal.is_none() {
            for (key, tat_us) in charges.into_iter().flatten() {
                if let Some(door) = self.doors.get_mut(&key) {
                    door.tat_us = tat_us;
                }
            }
        }
        refusal
    }
}

fn keys_of(tenant: TenantId, user: UserId, ip: IpAddr) -> [(KeyKind, MirrorKey); 3] {
    [
        (KeyKind::Tenant, MirrorKey::Tenant(tenant)),
        (KeyKind::User, MirrorKey::User(tenant, user)),
        (KeyKind::Ip, MirrorKey::Ip(ip_bucket(ip))),
    ]
}

impl MirrorKey {
    pub(super) fn of(kind: KeyKind, tenant: TenantId, user: UserId, ip: IpAddr) -> Self {
        match kind {
            KeyKind::Tenant => Self::Tenant(tenant),
            KeyKind::User => Self::User(tenant, user),
            KeyKind::Ip => Self::Ip(ip_bucket(ip)),
        }
    }
}

impl Throttles {
    /// Follows a decision of the buckets asked at `asked`: a refusal gives its bucket a door, or
    /// sets it again; an admission sets the tightest bucket's door, if it has one.
    pub(super) fn remember(&self, decision: Decision, key: MirrorKey, asked: Instant) {
        let Ok(mut mirror) = self.mirror.lock() else { return };
        match decision {
            Decision::Refused { limit, retry_after_us, .. } => mirror.refused(key, limit, asked, retry_after_us),
            Decision::Admitted { limit, reset_us, .. } if !mirror.doors.is_empty() => {
                mirror.admitted(key, limit, asked, reset_us);
            }
            Decision::Admitted { .. } | Decision::Off => {}
        }
    }

    /// The refusal a request gets before admission: the door of one of its buckets does not let
    /// it through (see the module). Counted as that bucket's refusal.
    /// `None` when every door lets it through (then [`Self::check`] decides, after admission).
    pub fn refused_ahead(&self, tenant: TenantId, user: UserId, ip: IpAddr) -> Option<Decision> {
        if !self.settings.enabled {
            return None;
        }
        let (kind, limit, retry_after_us) = self.mirror.lock().ok()?.door(keys_of(tenant, user, ip), Instant::now())?;
        self.count_refusal(kind);
        self.counters.refused_ahead.fetch_add(1, Ordering::Relaxed);
        Some(Decision::Refused { kind, limit, retry_after_us })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const PLAN: Limit = Limit { rate_per_sec: 500.0, burst: 1000 };

    fn keys(tenant: TenantId) -> [(KeyKind, MirrorKey); 3] {
        keys_of(tenant, UserId(breakwater_domain::new_id()), IpAddr::from([10, 0, 0, 1]))
    }

    fn at(t0: Instant, us: u64) -> Instant {
        t0 + Duration::from_micros(us)
    }

    #[test]
    fn a_bucket_at_its_edge_lets_one_request_through_per_interval() {
        let mut mirror = Mirror::default();
        let (noisy, quiet) = (TenantId(breakwater_domain::new_id()), TenantId(breakwater_domain::new_id()));
        let t0 = Instant::now();
        mirror.refused(MirrorKey::Tenant(noisy), PLAN, t0, 2_000);
        assert!(mirror.door(keys(quiet), t0).is_none(), "another tenant passes");

        // 500/s: one every 2 ms, from the bucket's own 2 ms. Offered one every 0.5 ms for
        // 100 ms, the door lets 49 through and refuses the other 151 ahead.
        let passed = (0..200).filter(|i| mirror.door(keys(noisy), at(t0, i * 500)).is_none()).count();
        assert_eq!(passed, 49);
        let (kind, limit, retry_after_us) = mirror.door(keys(noisy), at(t0, 99_900)).expect("waits its turn");
        assert_eq!((kind, limit, retry_after_us), (KeyKind::Tenant, PLAN, 100));
    }

    #[test]
    fn the_bucket_s_own_answer_moves_the_door() {
        let mut mirror = Mirror::default();
        let noisy = TenantId(breakwater_domain::new_id());
        let key = MirrorKey::Tenant(noisy);
        let t0 = Instant::now();
        mirror.refused(key, PLAN, t0, 2_000);
        // Redis admitted a request asked at 1 ms (another task's tokens ran out later than this
        // one thought) and will be full 1.5 s on: 250 requests' room.
        mirror.admitted(key, PLAN, at(t0, 1_000), 1_500_000);
        let passed = (0..400).filter(|_| mirror.door(keys(noisy), at(t0, 1_000)).is_none()).count();
        assert_eq!(passed, 250, "the room Redis reported, then the door's pace");
        // The tenant's plan was halved meanwhile: Redis's next answer brings the new pace (at the
        // old one, the door would take a bucket at the new plan's edge for two seconds behind).
        let halved = Limit { rate_per_sec: 250.0, burst: 1000 };
        mirror.admitted(key, halved, at(t0, 2_000), halved.tolerance_us() + 4_000);
        let passed = (1..=40).filter(|i| mirror.door(keys(noisy), at(t0, 2_000 + i * 1_000)).is_none()).count();
        assert_eq!(passed, 10, "one per 4 ms at 250/s, over 40 ms");
        // A bucket not at its edge has no door, whatever Redis says of it.
        let quiet = MirrorKey::Tenant(TenantId(breakwater_domain::new_id()));
        mirror.admitted(quiet, PLAN, t0, PLAN.tolerance_us() + 2_000);
        assert!(!mirror.doors.contains_key(&quiet));
    }

    #[test]
    fn the_bucket_that_refuses_longest_answers_and_a_refused_request_is_not_charged() {
        let mut mirror = Mirror::default();
        let ks = keys(TenantId(breakwater_domain::new_id()));
        let t0 = Instant::now();
        let user = Limit { rate_per_sec: 100.0, burst: 200 };
        mirror.refused(ks[0].1, PLAN, t0, 2_000);
        mirror.refused(ks[1].1, user, t0, 30_000);
        let (kind, _, retry_after_us) = mirror.door(ks, at(t0, 1_000)).expect("both refuse");
        assert_eq!((kind, retry_after_us), (KeyKind::User, 29_000));
        // The refused request took no turn: the first request after the user's 30 ms passes
        // both doors; the next is the user's again, 10 ms on (the tenant's, 2 ms a turn, has
        // room from the 28 ms nobody passed).
        assert!(mirror.door(ks, at(t0, 30_000)).is_none());
        let (kind, _, retry_after_us) = mirror.door(ks, at(t0, 31_000)).expect("the user's next turn");
        assert_eq!((kind, retry_after_us), (KeyKind::User, 9_000));
        assert!(mirror.door(ks, at(t0, 40_000)).is_none());
    }
}
