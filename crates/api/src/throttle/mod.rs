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
//! When Redis is slow (past a per-call budget of a few ms) or down, a circuit breaker opens and
//! the same GCRA runs in process with every limit divided by the number of API tasks, so the
//! fleet as a whole still holds the limit. It is logged once, counted, shown as `degraded` on
//! `/v1/ops/status`, and the breaker closes by itself when a probe to Redis succeeds. A Redis
//! outage never becomes a 5xx or unbounded traffic. Readiness does not depend on Redis.
//!
//! Known approximation: when the IP bucket refuses but the tenant and user buckets admitted
//! (two calls, two slots), those two buckets have been charged for a refused request.
//!
//! A bucket that refused stays refusing until its retry-after: GCRA's theoretical arrival time
//! only moves forward, on every task. Each process remembers those refusals (the mirror), and
//! [`ahead`] answers a request whose bucket is still refusing with its 429 before admission, so
//! a tenant over its own limit is told so before it can take a shared slot or queue place, and
//! without a Redis round trip.

pub mod ahead;
mod breaker;
pub mod gcra;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use breakwater_domain::{TenantId, UserId};
use serde::Serialize;

use crate::redis::{RedisConnection, RedisPool};
use breaker::Breaker;
pub use gcra::Limit;

const SCRIPT: &str = include_str!("gcra.lua");

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

/// A bucket the mirror remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum MirrorKey {
    Tenant(TenantId),
    User(TenantId, UserId),
    Ip(IpAddr),
}

/// Buckets that refused, until they admit again.
#[derive(Debug, Default)]
struct Mirror {
    refusing: HashMap<MirrorKey, (Instant, Limit)>,
    inserts: u32,
}

/// Buckets the mirror holds before it drops the ones admitting again.
const MIRROR_PRUNE_AT: usize = 4096;

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

#[derive(Debug, Default)]
struct LocalBuckets {
    tats: HashMap<String, i64>,
    checks_since_prune: u32,
}

/// The published state of the throttles.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThrottleStatus {
    /// `ok` (Redis), `degraded` (in-process fallback) or `off`.
    pub state: &'static str,
    /// The configured limits.
    pub limits: Limits,
    /// How many tenants have a plan override.
    pub tenant_overrides: usize,
    /// API tasks sharing the limits (the fallback's divisor).
    pub api_tasks: u32,
    /// The per-call Redis budget, in ms.
    pub redis_budget_ms: u64,
    /// Requests checked.
    pub checks: u64,
    /// Of those, checked in process because Redis was unavailable.
    pub fallback_checks: u64,
    /// Redis calls that failed or ran past the budget.
    pub redis_errors: u64,
    /// How often the breaker opened.
    pub breaker_opens: u64,
    /// Refusals per bucket kind.
    pub refused: RefusedTotals,
    /// Of those, answered before admission: the bucket was still refusing from an earlier
    /// refusal (the mirror), so neither admission nor Redis was asked.
    pub refused_ahead: u64,
}

/// Refusals per bucket kind.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RefusedTotals {
    /// By the tenant bucket.
    pub tenant: u64,
    /// By the user bucket.
    pub user: u64,
    /// By the IP bucket.
    pub ip: u64,
}

/// One `EVALSHA` of the script, loading it first when this Redis (or shard) has not seen it.
async fn evalsha<C: redis::aio::ConnectionLike + Send>(conn: &mut C, cmd: &redis::Cmd) -> redis::RedisResult<Vec<i64>> {
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::NoScriptError => {
            load_script(conn).await?;
            cmd.query_async(conn).await
        }
        result => result,
    }
}

/// `SCRIPT LOAD` (on a cluster, the client sends it to every node, and needs every one to answer).
async fn load_script<C: redis::aio::ConnectionLike + Send>(conn: &mut C) -> redis::RedisResult<()> {
    redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query_async::<redis::Value>(conn).await.map(drop)
}

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
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
        if let Decision::Refused { kind, limit, retry_after_us } = decision {
            self.count_refusal(kind);
            let key = match kind {
                KeyKind::Tenant => MirrorKey::Tenant(tenant),
                KeyKind::User => MirrorKey::User(tenant, user),
                KeyKind::Ip => MirrorKey::Ip(ip_bucket(ip)),
            };
            self.remember_refusal(key, limit, asked, retry_after_us);
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

    fn remember_refusal(&self, key: MirrorKey, limit: Limit, asked: Instant, retry_after_us: i64) {
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

    async fn check_redis(
        &self,
        keys: &[String; 2],
        limits: &[(KeyKind, Limit); 2],
        ip_key: &str,
        ip_limit: (KeyKind, Limit),
    ) -> redis::RedisResult<Decision> {
        let mut conn = self.redis.get().await?;
        let hash = self.script.get_hash();
        let mut tenant = redis::cmd("EVALSHA");
        tenant.arg(hash).arg(2).arg(&keys[0]).arg(&keys[1]);
        for (_, l) in limits {
            tenant.arg(l.interval_us()).arg(l.tolerance_us());
        }
        let mut ip = redis::cmd("EVALSHA");
        ip.arg(hash).arg(1).arg(ip_key).arg(ip_limit.1.interval_us()).arg(ip_limit.1.tolerance_us());
        let replies: Vec<Vec<i64>> = match &mut conn {
            RedisConnection::Cluster(c) => {
                // Two slots, perhaps two shards: a cluster refuses a pipeline across slots, so
                // the two calls go out at once on the multiplexed connection instead.
                let mut other = c.clone();
                let (a, b) = tokio::join!(evalsha(c, &tenant), evalsha(&mut other, &ip));
                vec![a?, b?]
            }
            RedisConnection::Single(c) => {
                let mut pipe = redis::pipe();
                pipe.add_command(tenant).add_command(ip);
                match pipe.query_async(c).await {
                    Ok(r) => r,
                    Err(err) if err.kind() == redis::ErrorKind::NoScriptError => {
                        // First call on this Redis (or after a restart/flush): load, retry.
                        load_script(c).await?;
                        pipe.query_async(c).await?
                    }
                    Err(err) => return Err(err),
                }
            }
        };
        let kinds = [limits[0], limits[1]];
        let [first, second] = replies.as_slice() else {
            return Err(redis::RedisError::from((redis::ErrorKind::TypeError, "unexpected script reply")));
        };
        Ok(combine(reply(first, &kinds), reply(second, &[ip_limit])))
    }

    fn check_local(
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

    /// The published state.
    #[must_use]
    pub fn status(&self) -> ThrottleStatus {
        let c = &self.counters;
        ThrottleStatus {
            state: if !self.settings.enabled {
                "off"
            } else if self.breaker.is_open() {
                "degraded"
            } else {
                "ok"
            },
            limits: self.settings.limits,
            tenant_overrides: self.overrides.read().map(|m| m.len()).unwrap_or(0),
            api_tasks: self.settings.api_tasks,
            redis_budget_ms: u64::try_from(self.settings.redis_budget.as_millis()).unwrap_or(u64::MAX),
            checks: c.checks.load(Ordering::Relaxed),
            fallback_checks: c.fallback_checks.load(Ordering::Relaxed),
            redis_errors: c.redis_errors.load(Ordering::Relaxed),
            breaker_opens: self.breaker.opens(),
            refused: RefusedTotals {
                tenant: c.refused_tenant.load(Ordering::Relaxed),
                user: c.refused_user.load(Ordering::Relaxed),
                ip: c.refused_ip.load(Ordering::Relaxed),
            },
            refused_ahead: c.refused_ahead.load(Ordering::Relaxed),
        }
    }

    /// When the throttles last fell back, for tests: whether they are degraded now.
    #[must_use]
    pub fn is_degraded(&self) -> bool {
        self.settings.enabled && self.breaker.is_open()
    }
}

/// Reads one script reply: `{1, tightest, remaining, reset}` or `{0, refusing, retry_after, 0}`.
fn reply(r: &[i64], kinds: &[(KeyKind, Limit)]) -> Decision {
    let pick = |i: i64| kinds.get(usize::try_from(i - 1).unwrap_or(0)).copied().unwrap_or(kinds[0]);
    match r {
        [1, i, remaining, reset] => {
            let (kind, limit) = pick(*i);
            Decision::Admitted { kind, limit, remaining: u64::try_from(*remaining).unwrap_or(0), reset_us: *reset }
        }
        [0, i, retry, _] => {
            let (kind, limit) = pick(*i);
            Decision::Refused { kind, limit, retry_after_us: *retry }
        }
        _ => Decision::Off,
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

impl crate::figures::Publish for ThrottleStatus {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Kind, Lines, NOT_ALARMED, Unit};
        out.gauge(
            "throttle_degraded",
            "1 while throttles run in process (Redis unavailable)",
            u64::from(self.state == "degraded"),
        )
        .emf("ThrottleDegraded", Unit::None, Lines::Task)
        .no_ops("/v1/ops/status names the state (`ok`, `degraded` or `off`) in `state`: this is its `degraded`");
        out.counter("throttle_checks", "Requests checked by the throttles", self.checks)
            .no_emf(NOT_ALARMED)
            .ops("checks");
        out.counter("throttle_fallback_checks", "Requests checked in process", self.fallback_checks)
            .no_emf(NOT_ALARMED)
            .ops("fallback_checks");
        out.counter("throttle_redis_errors", "Redis throttle calls failed or over budget", self.redis_errors)
            .emf("ThrottleRedisErrors", Unit::Count, Lines::Task)
            .ops("redis_errors");
        let r = &self.refused;
        out.figure(Kind::Counter, "throttle_refused", "Requests refused by throttle bucket kind")
            .series(&[("kind", "tenant")], r.tenant)
            .series(&[("kind", "user")], r.user)
            .series(&[("kind", "ip")], r.ip)
            .emf("ThrottleRefused", Unit::Count, Lines::Task)
            .ops("refused/{kind}");
        out.counter(
            "throttle_refused_ahead",
            "Of those, answered before admission: the bucket was still refusing from an earlier 429",
            self.refused_ahead,
        )
        .no_emf("a part of ThrottleRefused, which counts them already")
        .ops("refused_ahead");
    }
}
