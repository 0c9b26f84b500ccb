//! Per-tenant, per-user and per-IP throttles: the abuse ceiling, shared by every API task
//! through Redis.
//!
//! One Lua script (GCRA, on Redis's clock) checks the tenant and user buckets together in one
//! round trip; their keys are hash-tagged with the tenant so they share a cluster slot. The
//! per-IP bucket cannot share that slot, so it is a second call in the same pipeline (on a
//! Redis Cluster, `REDIS_CLUSTER`, a second call sent at the same time: a cluster refuses a
//! pipeline across slots). The
//! script is loaded once and called with `EVALSHA` (reloaded on `NOSCRIPT`); limits travel as
//! `ARGV`, never spliced into the script.
//!
//! When Redis is slow (past a per-call budget, `THROTTLE_REDIS_BUDGET_MS`) or down, a circuit
//! breaker opens and the same GCRA runs in process with every limit divided by the number of API
//! tasks, so the fleet as a whole still holds the limit. It is logged once, counted, shown as
//! `degraded` on `/v1/ops/status`, and the breaker closes by itself when a probe to Redis
//! succeeds. A Redis outage never becomes a 5xx or unbounded traffic. Readiness does not depend
//! on Redis.
//!
//! Known approximation: when the IP bucket refuses but the tenant and user buckets admitted
//! (two calls, two slots), those two buckets have been charged for a refused request.
//!
//! A bucket that refused stays refusing until its retry-after: GCRA's theoretical arrival time
//! only moves forward, on every task. Each process remembers the buckets that refused and
//! follows them at their pace (the mirror), and [`ahead`] answers a request such a bucket would
//! refuse with its 429 before admission, so a tenant over its own limit is told so before it
//! can take a shared slot or queue place, and without a Redis round trip.

pub mod ahead;
mod breaker;
mod fallback;
pub mod gcra;
mod mirror;
mod script;
mod status;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use breakwater_domain::{TenantId, UserId};
use serde::Serialize;

use crate::redis::RedisPool;
use breaker::Breaker;
use fallback::LocalBuckets;
pub use gcra::Limit;
use mirror::{Mirror, MirrorKey};
use script::SCRIPT;
pub use status::{RefusedTotals, ThrottleStatus};

/// Which bucket a decision is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    /// All of a tenant's traffic.
    Tenant,
    /// One user's traffic.
    User,
    /// One client address's traffic.
    Ip,
}

impl KeyKind {
    /// The name used in headers and envelopes.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::User => "user",
            Self::Ip => "ip",
        }
    }
}

/// The configured limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Limits {
    /// Per tenant (overridable per tenant by its plan).
    pub tenant: Limit,
    /// Per user.
    pub user: Limit,
    /// Per client IP.
    pub ip: Limit,
}

/// What the throttles decided for a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Admitted. `kind`'s bucket is the tightest; it has `remaining` requests left now and is
    /// full again in `reset_us`.
    Admitted {
        /// The tightest bucket.
        kind: KeyKind,
        /// Its limit.
        limit: Limit,
        /// Requests it still admits at once.
        remaining: u64,
        /// Microseconds until it is full.
        reset_us: i64,
    },
    /// Refused by `kind`'s bucket; retry after `retry_after_us`.
    Refused {
        /// The bucket that ran out.
        kind: KeyKind,
        /// Its limit.
        limit: Limit,
        /// Microseconds until a retry is admitted.
        retry_after_us: i64,
    },
    /// Throttles are switched off.
    Off,
}

/// Settings of the throttles.
#[derive(Debug, Clone)]
pub struct ThrottleSettings {
    /// Whether throttles run at all.
    pub enabled: bool,
    /// The default limits.
    pub limits: Limits,
    /// How many API tasks share the limits (the fallback divides by it).
    pub api_tasks: u32,
    /// The per-call budget for Redis.
    pub redis_budget: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
}

/// Live counters.
#[derive(Debug, Default)]
struct Counters {
    checks: AtomicU64,
    fallback_checks: AtomicU64,
    redis_errors: AtomicU64,
    refused_tenant: AtomicU64,
    refused_user: AtomicU64,
    refused_ip: AtomicU64,
    refused_ahead: AtomicU64,
}

/// The throttles of one API process.
#[derive(Debug)]
pub struct Throttles {
    settings: ThrottleSettings,
    redis: RedisPool,
    script: redis::Script,
    breaker: Breaker,
    overrides: RwLock<HashMap<TenantId, Limit>>,
    local: Mutex<LocalBuckets>,
    mirror: Mutex<Mirror>,
    counters: Counters,
}

/// The address a client's IP bucket is kept for: an IPv4 address as it is, an IPv6 one by its
/// /64 (what one subscriber or host is routed; a client choosing among the 2^64 addresses of its
/// network would otherwise get a fresh bucket on every request). An IPv4-mapped IPv6 address is
/// its IPv4 address.
#[must_use]
pub fn ip_bucket(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Throttles {
    /// Throttles over `redis` with `settings`.
    #[must_use]
    pub fn new(settings: ThrottleSettings, redis: RedisPool) -> Self {
        Self {
            settings,
            redis,
            script: redis::Script::new(SCRIPT),
            breaker: Breaker::new(3, Duration::from_secs(1)),
            overrides: RwLock::new(HashMap::new()),
            local: Mutex::new(LocalBuckets::default()),
            mirror: Mutex::new(Mirror::default()),
            counters: Counters::default(),
        }
    }

    /// Replaces the per-tenant overrides (loaded from the tenants' plans).
    pub fn set_overrides(&self, overrides: impl IntoIterator<Item = (TenantId, Limit)>) {
        let map: HashMap<_, _> = overrides.into_iter().collect();
        if let Ok(mut guard) = self.overrides.write() {
            *guard = map;
        }
    }

    /// Reloads the overrides from the database.
    ///
    /// # Errors
    /// A database error (the previous overrides stay in force).
    pub async fn refresh_overrides(&self, pool: &breakwater_domain::Pool) -> breakwater_domain::Result<()> {
        let rows = breakwater_domain::tenants::throttle_overrides(pool).await?;
        self.set_overrides(
            rows.into_iter().map(|o| (o.tenant, Limit { rate_per_sec: o.rate_per_sec, burst: o.burst })),
        );
        Ok(())
    }

    fn tenant_limit(&self, tenant: TenantId) -> Limit {
        self.overrides.read().ok().and_then(|m| m.get(&tenant).copied()).unwrap_or(self.settings.limits.tenant)
    }

    /// Checks (and charges) the tenant, user and IP buckets of one request.
    pub async fn check(&self, tenant: TenantId, user: UserId, ip: IpAddr) -> Decision {
        if !self.settings.enabled {
            return Decision::Off;
        }
        self.counters.checks.fetch_add(1, Ordering::Relaxed);
        // Before the call: Redis decides after this, so a refusal remembered from here never
        // outlasts the bucket's own.
        let asked = Instant::now();
        let limits = [(KeyKind::Tenant, self.tenant_limit(tenant)), (KeyKind::User, self.settings.limits.user)];
        let ip_limit = (KeyKind::Ip, self.settings.limits.ip);
        let p = &self.settings.key_prefix;
        let keys = [format!("{p}:{{t:{tenant}}}:tenant"), format!("{p}:{{t:{tenant}}}:user:{user}")];
        let ip_key = format!("{p}:{{ip:{}}}", ip_bucket(ip));

        let decision = if self.breaker.allows_call() {
            let call = self.check_redis(&keys, &limits, &ip_key, ip_limit);
            match tokio::time::timeout(self.settings.redis_budget, call).await {
                Ok(Ok(decision)) => {
                    if self.breaker.on_success() {
                        tracing::info!("Redis throttles recovered");
                    }
                    Some(decision)
                }
                Ok(Err(err)) => {
                    self.on_redis_failure(&format!("{err}"));
                    None
                }
                Err(_) => {
                    self.on_redis_failure("over the per-call budget");
                    None
                }
            }
        } else {
            None
        };
        let decision = decision.unwrap_or_else(|| {
            self.counters.fallback_checks.fetch_add(1, Ordering::Relaxed);
            self.check_local(&keys, &limits, &ip_key, ip_limit)
        });
        if let Decision::Refused { kind, .. } = decision {
            self.count_refusal(kind);
        }
        if let Decision::Refused { kind, .. } | Decision::Admitted { kind, .. } = decision {
            self.remember(decision, MirrorKey::of(kind, tenant, user, ip), asked);
        }
        decision
    }

    fn count_refusal(&self, kind: KeyKind) {
        let counter = match kind {
            KeyKind::Tenant => &self.counters.refused_tenant,
            KeyKind::User => &self.counters.refused_user,
            KeyKind::Ip => &self.counters.refused_ip,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn on_redis_failure(&self, why: &str) {
        self.counters.redis_errors.fetch_add(1, Ordering::Relaxed);
        if self.breaker.on_failure() {
            tracing::warn!(
                reason = why,
                api_tasks = self.settings.api_tasks,
                "Redis throttles unavailable: falling back to in-process limits divided by the API task count"
            );
        }
        if self.breaker.is_open() {
            // Opened, or a probe failed: the connection may be to a Redis that stopped answering
            // (a lost zone) or to a demoted primary; the next probe connects afresh.
            self.redis.reset();
        }
    }
}

/// Combines two groups' decisions: any refusal wins (the longest wait); else the tightest.
fn combine(a: Decision, b: Decision) -> Decision {
    match (a, b) {
        (Decision::Refused { retry_after_us: ra, .. }, Decision::Refused { retry_after_us: rb, .. }) => {
            if ra >= rb {
                a
            } else {
                b
            }
        }
        (Decision::Refused { .. }, _) => a,
        (_, Decision::Refused { .. }) => b,
        (Decision::Admitted { remaining: ra, .. }, Decision::Admitted { remaining: rb, .. }) => {
            if ra <= rb {
                a
            } else {
                b
            }
        }
        (Decision::Off, other) | (other, Decision::Off) => other,
    }
}

/// Keeps the overrides fresh: reloads them every `every` until the process ends.
pub fn spawn_override_refresh(throttles: std::sync::Arc<Throttles>, pool: breakwater_domain::Pool, every: Duration) {
    tokio::spawn(async move {
        let mut last_error: Option<Instant> = None;
        loop {
            if let Err(err) = throttles.refresh_overrides(&pool).await
                && last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60))
            {
                tracing::warn!(error = %err, "could not load tenant throttle overrides; keeping the previous ones");
                last_error = Some(Instant::now());
            }
            tokio::time::sleep(every).await;
        }
    });
}
