//! A step's requests: [`StepCtx`] holds what every request of a step shares; it sends a
//! request (a [`Req`]) under the step's in-flight cap, classifies and records it, and for a
//! client that honours `Retry-After` makes the attempts of one logical request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use tokio::sync::Semaphore;

use super::{Caller, ClientKey};
use crate::classify::{Outcome, classify};
use crate::client::{Http, Reply};
use crate::stats::{Sample, StepRecorder};
use crate::tokens::Tokens;

/// A request to make.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: Method,
    pub uri: String,
    pub tenant: Option<usize>,
    pub endpoint: &'static str,
    pub body: Option<Bytes>,
    pub expect_json: bool,
    pub idempotency_key: bool,
    /// Headers of the caller's own, sent as they are (a request id, say).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Req {
    pub fn get(uri: String, endpoint: &'static str) -> Self {
        Self {
            method: Method::GET,
            uri,
            tenant: None,
            endpoint,
            body: None,
            expect_json: false,
            idempotency_key: false,
            headers: Vec::new(),
        }
    }
}

/// The state of one step, shared by every request in it.
#[derive(Debug)]
pub struct StepCtx {
    pub http: Http,
    pub tokens: Arc<Tokens>,
    pub seed: u64,
    pub(super) rec: Mutex<StepRecorder>,
    pub(super) in_flight: AtomicU64,
    pub(super) peak: AtomicU64,
    pub(super) cap: Option<Arc<Semaphore>>,
    pub(super) cap_waits: AtomicU64,
    pub(super) honour: Option<crate::retry::Honouring>,
    /// When the step stops starting work.
    pub(super) ends: Instant,
}

impl StepCtx {
    /// One logical request: a single attempt, or with a retry policy, attempts until one is
    /// answered, the policy gives up, or an error ends it. Each attempt is recorded as a request;
    /// the logical request's attempts and time to success are recorded apart.
    pub async fn call(
        &self,
        intended: Instant,
        req: Req,
        caller: Option<&Caller>,
        rng: &mut impl rand::Rng,
    ) -> (Outcome, Option<Reply>) {
        let Some(honour) = &self.honour else {
            return self.request(intended, req, caller).await;
        };
        let client = caller.map_or(ClientKey::Token(req.tenant), |c| ClientKey::Caller(c.index));
        let mut attempts = 0;
        let mut when = intended;
        let mut last = None;
        loop {
            // A client told to wait sends nothing before then, this request included; a wait
            // that outlasts the step cuts the logical request off at the step's end, so that
            // one long Retry-After does not stretch the step (and dilute its rates).
            if let Some(until) = honour.paused_until(client) {
                if until > self.ends {
                    // Waiting until the step's end (not returning at once) keeps a closed-loop
                    // caller from coming straight back with its next request.
                    tokio::time::sleep_until(self.ends.into()).await;
                    honour.cut_off();
                    return last.unwrap_or_else(|| (Outcome::error("cut off at the step's end"), None));
                }
                tokio::time::sleep_until(until.into()).await;
                when = Instant::now();
            }
            attempts += 1;
            let (outcome, reply) = self.request(when, req.clone(), caller).await;
            match &outcome {
                Outcome::Ok => {
                    honour.succeeded(attempts, intended);
                    return (outcome, reply);
                }
                Outcome::Refused { .. } => {
                    let header = reply.as_ref().and_then(|r| crate::retry::header_retry_after(&r.headers));
                    honour.pause(client, honour.wait_for(header, rng));
                    if !honour.retries(attempts) {
                        honour.gave_up(attempts);
                        return (outcome, reply);
                    }
                }
                Outcome::Error { .. } => {
                    honour.gave_up(attempts);
                    return (outcome, reply);
                }
            }
            last = Some((outcome, reply));
        }
    }

    /// Sends one request (after waiting for a slot, if a cap is set) on the caller's own
    /// connection or the step's pool, classifies and records it. Latency is measured from
    /// `intended`, and also from the actual send.
    pub async fn request(&self, intended: Instant, req: Req, caller: Option<&Caller>) -> (Outcome, Option<Reply>) {
        let _permit = match &self.cap {
            Some(cap) => match Arc::clone(cap).try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    self.cap_waits.fetch_add(1, Ordering::Relaxed);
                    Arc::clone(cap).acquire_owned().await.ok()
                }
            },
            None => None,
        };
        let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(2 + req.headers.len());
        if let Some(t) = req.tenant.and_then(|i| self.tokens.tenants().get(i)) {
            headers.push((http::header::AUTHORIZATION, t.authorization.clone()));
        }
        if req.idempotency_key
            && let Ok(v) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
        {
            headers.push((HeaderName::from_static("idempotency-key"), v));
        }
        headers.extend(req.headers);
        let actual = Instant::now();
        let now_in = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now_in, Ordering::Relaxed);
        let http = caller.map_or(&self.http, |c| &c.http);
        let result = http.send(req.method, &req.uri, &headers, req.body).await;
        let end = Instant::now();
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let (outcome, reply) = match result {
            Ok(r) => (classify(r.status, &r.headers, &r.body, req.expect_json), Some(r)),
            Err(kind) => (Outcome::Error { kind }, None),
        };
        let sample = Sample { intended, actual, end, outcome: &outcome, tenant: req.tenant, endpoint: req.endpoint };
        if let Ok(mut rec) = self.rec.lock() {
            rec.record(&sample);
        }
        (outcome, reply)
    }
}
