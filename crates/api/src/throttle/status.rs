//! The throttles' published state: what `/v1/ops/status` shows of them, and their figures for
//! `/metrics` and the CloudWatch lines.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::{Limits, Throttles};

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
    /// Of those, answered before admission: the door of a bucket that refused earlier (the
    /// mirror) did not let the request through, so neither admission nor Redis was asked.
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

impl Throttles {
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
            "Of those, answered before admission: the door of a bucket that refused earlier did not let the request through",
            self.refused_ahead,
        )
        .no_emf("a part of ThrottleRefused, which counts them already")
        .ops("refused_ahead");
    }
}
