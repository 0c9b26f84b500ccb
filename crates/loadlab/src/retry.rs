//! Clients that honour `Retry-After`: after a refusal, a client sends nothing to the server until
//! the header's seconds (with jitter) have passed, its other requests included ("how long the
//! user agent ought to wait before making a follow-up request", RFC 9110); a client is one
//! closed-loop caller (its own token and connection) or, for open-loop arrivals, one token of the
//! run. A refused request is retried as SDK retry policies do: at most a few attempts, and
//! only while a retry budget shared by the whole population allows it (gRPC's retry throttling:
//! a bucket of tokens, one spent per refused attempt, a tenth of one earned per success, retries
//! only while more than half of it is left). What the person waiting sees is the logical
//! request: how many attempts it took and how long from its arrival to its success, the waits
//! included.

use std::collections::HashMap;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::engine::ClientKey;
use crate::stats::{Hist, Pcts};

/// How an honouring client retries.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts per logical request, the first included (3, as the AWS SDKs' standard mode).
    pub max_attempts: u32,
    /// The wait is `Retry-After` times a factor drawn from `[1, 1 + jitter]`.
    pub jitter: f64,
    /// The retry budget's size in tokens (gRPC's `maxTokens`, 10).
    pub budget_tokens: f64,
    /// Tokens earned per success (gRPC's `tokenRatio`, 0.1).
    pub budget_ratio: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 3, jitter: 0.2, budget_tokens: 10.0, budget_ratio: 0.1 }
    }
}

/// A step's logical requests, as an honouring client population saw them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogicalReport {
    /// Logical requests that ended (succeeded or gave up).
    pub requests: u64,
    /// Of those, succeeded.
    pub succeeded: u64,
    /// Gave up: out of attempts or budget after a refusal, or failed with an error.
    pub gave_up: u64,
    /// Attempts made for all of them.
    pub attempts: u64,
    /// Attempts per success (`attempts / succeeded`).
    pub attempts_per_success: f64,
    /// From the first attempt's intended time to the success's end.
    pub time_to_success: Pcts,
    /// Still waiting out a `Retry-After` that outlasted the step: cut off at its end, counted
    /// in none of the above (their wait is unknown, and the step's rates stay its own).
    #[serde(default)]
    pub cut_off: u64,
}

/// Per-step state of an honouring population.
#[derive(Debug)]
pub(crate) struct Honouring {
    pub(crate) policy: RetryPolicy,
    budget: Mutex<f64>,
    /// Per client, when it may send again.
    paused: Mutex<HashMap<ClientKey, Instant>>,
    rec: Mutex<Recorder>,
}

#[derive(Debug, Default)]
struct Recorder {
    requests: u64,
    succeeded: u64,
    gave_up: u64,
    attempts: u64,
    time_to_success: Hist,
    cut_off: u64,
}

impl Honouring {
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            budget: Mutex::new(policy.budget_tokens),
            paused: Mutex::new(HashMap::new()),
            rec: Mutex::new(Recorder::default()),
        }
    }

    /// Until when `client` holds its requests back, if it is told to wait.
    pub(crate) fn paused_until(&self, client: ClientKey) -> Option<Instant> {
        let paused = self.paused.lock().ok()?;
        paused.get(&client).copied().filter(|t| *t > Instant::now())
    }

    /// `client` was told to wait `wait`: none of its requests go out before then.
    pub(crate) fn pause(&self, client: ClientKey, wait: Duration) {
        if let Ok(mut paused) = self.paused.lock() {
            let until = Instant::now() + wait;
            let e = paused.entry(client).or_insert(until);
            *e = (*e).max(until);
        }
    }

    /// The wait a refusal's `Retry-After` asks for, with the policy's jitter.
    pub(crate) fn wait_for(&self, retry_after: Option<Duration>, rng: &mut impl Rng) -> Duration {
        let base = retry_after.unwrap_or(Duration::from_secs(1));
        base.mul_f64(1.0 + rng.random_range(0.0..=self.policy.jitter.max(0.0)))
    }

    /// After a refused attempt (`attempts` made so far): whether to retry it. Spends a budget
    /// token either way.
    pub(crate) fn retries(&self, attempts: u32) -> bool {
        let p = &self.policy;
        let allowed = {
            let Ok(mut tokens) = self.budget.lock() else { return false };
            *tokens = (*tokens - 1.0).max(0.0);
            *tokens > p.budget_tokens / 2.0
        };
        attempts < p.max_attempts && allowed
    }

    pub(crate) fn succeeded(&self, attempts: u32, first_intended: Instant) {
        if let Ok(mut tokens) = self.budget.lock() {
            *tokens = (*tokens + self.policy.budget_ratio).min(self.policy.budget_tokens);
        }
        if let Ok(mut r) = self.rec.lock() {
            r.requests += 1;
            r.succeeded += 1;
            r.attempts += u64::from(attempts);
            r.time_to_success.record(first_intended.elapsed());
        }
    }

    pub(crate) fn gave_up(&self, attempts: u32) {
        if let Ok(mut r) = self.rec.lock() {
            r.requests += 1;
            r.gave_up += 1;
            r.attempts += u64::from(attempts);
        }
    }

    /// A logical request's next attempt would go out after the step's end.
    pub(crate) fn cut_off(&self) {
        if let Ok(mut r) = self.rec.lock() {
            r.cut_off += 1;
        }
    }

    pub(crate) fn report(&self) -> LogicalReport {
        let Ok(r) = self.rec.lock() else { return LogicalReport::default() };
        LogicalReport {
            requests: r.requests,
            succeeded: r.succeeded,
            gave_up: r.gave_up,
            attempts: r.attempts,
            attempts_per_success: if r.succeeded == 0 { 0.0 } else { r.attempts as f64 / r.succeeded as f64 },
            time_to_success: r.time_to_success.summary(),
            cut_off: r.cut_off,
        }
    }
}

/// The `Retry-After` of a response, in whole seconds.
pub(crate) fn header_retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_wait_is_the_header_with_jitter_and_retries_stop_at_the_attempt_limit() {
        let h = Honouring::new(RetryPolicy::default());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let wait = h.wait_for(Some(Duration::from_secs(2)), &mut rng);
        assert!((Duration::from_secs(2)..=Duration::from_millis(2400)).contains(&wait), "{wait:?}");
        assert!(h.retries(1));
        assert!(!h.retries(3), "three attempts at most");
    }

    #[test]
    fn the_budget_stops_retries_when_most_attempts_are_refused_and_refills_with_successes() {
        let h = Honouring::new(RetryPolicy::default());
        // Ten tokens; retries only while more than five are left.
        let allowed = (0..10).filter(|_| h.retries(1)).count();
        assert_eq!(allowed, 4, "tokens 9, 8, 7, 6 allow a retry; 5 and below do not");
        for _ in 0..70 {
            h.succeeded(1, Instant::now());
        }
        assert!(h.retries(1), "seventy successes earn seven tokens back");
        let r = h.report();
        assert_eq!((r.requests, r.succeeded, r.attempts), (70, 70, 70));
        assert!((r.attempts_per_success - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_paused_client_holds_every_request_back_and_others_do_not() {
        let h = Honouring::new(RetryPolicy::default());
        h.pause(ClientKey::Caller(1), Duration::from_secs(5));
        h.pause(ClientKey::Caller(1), Duration::from_secs(1));
        let until = h.paused_until(ClientKey::Caller(1)).expect("paused");
        assert!(until > Instant::now() + Duration::from_secs(4), "a shorter wait does not shorten it");
        assert_eq!(h.paused_until(ClientKey::Caller(2)), None);
        assert_eq!(h.paused_until(ClientKey::Token(Some(1))), None, "a caller is not its token");
    }
}
