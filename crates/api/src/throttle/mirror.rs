//! The mirror: the buckets that refused, remembered in process until their retry-after, so that
//! a request whose bucket is still refusing is answered its 429 ahead of admission (see
//! [`super::ahead`]) without a Redis round trip.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use breakwater_domain::{TenantId, UserId};

use super::{Decision, KeyKind, Limit, Throttles, ip_bucket};

/// A bucket the mirror remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum MirrorKey {
    Tenant(TenantId),
    User(TenantId, UserId),
    Ip(IpAddr),
}

/// Buckets that refused, until they admit again.
#[derive(Debug, Default)]
pub(super) struct Mirror {
    refusing: HashMap<MirrorKey, (Instant, Limit)>,
    inserts: u32,
}

/// Buckets the mirror holds before it drops the ones admitting again.
const MIRROR_PRUNE_AT: usize = 4096;

impl Throttles {
    pub(super) fn remember_refusal(&self, key: MirrorKey, limit: Limit, asked: Instant, retry_after_us: i64) {
        let now = Instant::now();
        let until = asked + Duration::from_micros(u64::try_from(retry_after_us).unwrap_or(0));
        let Ok(mut mirror) = self.mirror.lock() else { return };
        mirror.refusing.insert(key, (until, limit));
        mirror.inserts += 1;
        if mirror.refusing.len() > MIRROR_PRUNE_AT && mirror.inserts as usize > mirror.refusing.len() / 2 {
            mirror.refusing.retain(|_, (until, _)| *until > now);
            mirror.inserts = 0;
        }
    }

    /// The refusal a request gets before admission: one of its buckets refused earlier and does
    /// not admit yet (the one that admits last, when several). Counted as that bucket's refusal.
    /// `None` when every bucket may admit it (then [`Self::check`] decides, after admission).
    pub fn refused_ahead(&self, tenant: TenantId, user: UserId, ip: IpAddr) -> Option<Decision> {
        if !self.settings.enabled {
            return None;
        }
        let now = Instant::now();
        let found = {
            let mirror = self.mirror.lock().ok()?;
            if mirror.refusing.is_empty() {
                return None;
            }
            [
                (KeyKind::Tenant, MirrorKey::Tenant(tenant)),
                (KeyKind::User, MirrorKey::User(tenant, user)),
                (KeyKind::Ip, MirrorKey::Ip(ip_bucket(ip))),
            ]
            .into_iter()
            .filter_map(|(kind, key)| mirror.refusing.get(&key).map(|(until, limit)| (kind, *until, *limit)))
            .filter(|(_, until, _)| *until > now)
            .max_by_key(|(_, until, _)| *until)
        }?;
        let (kind, until, limit) = found;
        self.count_refusal(kind);
        self.counters.refused_ahead.fetch_add(1, Ordering::Relaxed);
        let retry_after_us = i64::try_from(until.saturating_duration_since(now).as_micros()).unwrap_or(i64::MAX);
        Some(Decision::Refused { kind, limit, retry_after_us })
    }
}
