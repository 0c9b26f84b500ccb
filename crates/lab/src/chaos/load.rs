//! The suite's load: an open loop of the request mix (even requests post a message, odd ones read
//! an inbox page), each request's outcome, and their tally.
//!
//! A response is classified as the load lab classifies it
//! ([`breakwater_loadlab::classify::classify`]), so that the suite's figures and the lab's mean
//! the same: a 2xx is ok (unless its JSON body does not parse); a 429, or a 503 with the typed
//! envelope, is a refusal, counted by its `code`; anything else is an error, by kind
//! (`status_N`, `status_503_untyped`, `unparseable_body`). A request that gets no complete
//! response is an error of the kind the lab's client names it (`connect`, `timeout`, `reset`,
//! `io`, `bad_response`): a refused connection is an error, as in the lab, and `sigterm`, which
//! expects some while its port changes hands, reports them apart. The groupings the verdicts
//! read (the database's 503s, admission's, the throttles' 429s, server errors) are views of the
//! one classification ([`Tally`]).
//!
//! The load runs on the lab's engine ([`breakwater_loadlab::engine`]): its pacer, its client and
//! its classification. The suite adds what its verdicts read and a lab step does not keep: every
//! request apart (its number, when it was sent, how long it took, the message a 201 created),
//! and a header of its own on each, the `x-request-id` the `sigterm` accounting finds in the
//! API's log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use breakwater_loadlab::classify::{Outcome as Class, classify};
use breakwater_loadlab::client::{Reply, transport_kind};
use breakwater_loadlab::engine::{Arrival, BoxFuture, Engine, Req, Workload};
use breakwater_loadlab::sampler::Sampler;
use breakwater_loadlab::schedule::Pacer;
use breakwater_loadlab::tokens::TokenLine;
use breakwater_loadlab::{EngineConfig, Tokens};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use serde_json::{Value, json};
use uuid::Uuid;

use super::testbed::TenantData;

/// The probes' client (a status page read, a health check): single requests, not load.
pub(super) fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?)
}

/// The lab's error kind for a connection the server refused: nothing was sent.
pub(super) const REFUSED_AT_CONNECT: &str = "connect";

/// What one request got.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    /// A complete response: its status, the lab's classification of it (ok, refused by code, or
    /// an error by kind), and the id of the message a 201 created.
    Answered { status: u16, class: Class, created: Option<Uuid> },
    /// No complete response (a refused connection, a reset, a truncated body, a timeout): what the
    /// lab counts as an error of `kind`, and what the client said.
    Unanswered { kind: String, detail: String },
}

impl Outcome {
    /// What the engine's request got: its classification and, when it was answered, the
    /// response.
    fn from_engine(class: Class, reply: Option<Reply>) -> Self {
        match (class, reply) {
            (class, Some(r)) => {
                let created = if r.status == 201 { created_id(&r.body) } else { None };
                Self::Answered { status: r.status, class, created }
            }
            (Class::Error { kind }, None) => Self::Unanswered { detail: kind.clone(), kind },
            (class, None) => {
                Self::Unanswered { kind: "io".to_owned(), detail: format!("{class:?} without a response") }
            }
        }
    }

    /// Reads a probe's response whole and classifies it. `expect_json`: a 2xx must carry a JSON
    /// body.
    pub(super) async fn read(sent: reqwest::Result<reqwest::Response>, expect_json: bool) -> Self {
        let res = match sent {
            Ok(res) => res,
            Err(e) => return Self::unanswered(&e, format!("{e:?}")),
        };
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        match res.bytes().await {
            Ok(body) => {
                let created = if status == 201 { created_id(&body) } else { None };
                Self::Answered { status, class: classify(status, &headers, &body, expect_json), created }
            }
            Err(e) => Self::unanswered(&e, format!("body: {e:?}")),
        }
    }

    fn unanswered(e: &reqwest::Error, detail: String) -> Self {
        // reqwest's own timers (the request's, the connect's) are not hyper's or the OS's errors,
        // which the lab's names are read from.
        let kind = if e.is_timeout() { "timeout".to_owned() } else { transport_kind(e) };
        Self::Unanswered { kind, detail }
    }

    pub(super) fn is_ok(&self) -> bool {
        matches!(self, Self::Answered { class: Class::Ok, .. })
    }

    /// A refusal's status (429 or 503) and code.
    pub(super) fn refusal(&self) -> Option<(u16, &str)> {
        match self {
            Self::Answered { status, class: Class::Refused { code, .. }, .. } => Some((*status, code.as_str())),
            _ => None,
        }
    }

    /// Whether it is a 503 refusal with one of `codes` (see [`TYPED_503`], [`SHED_503`]).
    pub(super) fn refused_503(&self, codes: &[&str]) -> bool {
        self.refusal().is_some_and(|(status, code)| status == 503 && codes.contains(&code))
    }

    /// How a report names it: the status (with a refusal's code), or the error's kind where the
    /// status alone does not say it: `401`, `503 load_shed`, `status_503_untyped`, `timeout`.
    pub(super) fn label(&self) -> String {
        match self {
            Self::Answered { status, class: Class::Refused { code, .. }, .. } => format!("{status} {code}"),
            Self::Answered { status, class: Class::Error { kind }, .. } if *kind != format!("status_{status}") => {
                kind.clone()
            }
            Self::Answered { status, .. } => status.to_string(),
            Self::Unanswered { kind, .. } => kind.clone(),
        }
    }
}

/// The `x-request-id` of request `i` of a run; a posted message's body is the same text, so a
/// request can be found both in the API's log and in the table.
pub(super) fn request_id(run: &str, i: usize) -> String {
    format!("chaos-{run}-{i}")
}

/// Whether request `i` of the load mix posts a message (even `i`); odd `i` reads an inbox page.
pub(super) fn posts(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// The id in a 201's body.
fn created_id(body: &[u8]) -> Option<Uuid> {
    serde_json::from_slice::<Value>(body).ok().and_then(|v| v["id"].as_str()?.parse().ok())
}

/// A request of an open-loop run: when it was sent (since the run began), how long it took,
/// and what it got.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    /// The request's number in its run (see [`request_id`]).
    pub(super) i: usize,
    pub(super) at: Duration,
    pub(super) took: Duration,
    pub(super) outcome: Outcome,
}

/// What a run sends: its request number `i`.
trait Requests: Send + Sync + 'static {
    fn request(&self, i: usize) -> Req;
}

/// The load mix: even `i` posts a message (its body and `x-request-id` the request's id), odd
/// `i` reads an inbox page; tenant by tenant in turn. Both routes answer JSON: a 2xx whose body
/// does not parse is an error.
struct Mix {
    run: &'static str,
    base: String,
    tenants: Vec<TenantData>,
}

impl Requests for Mix {
    fn request(&self, i: usize) -> Req {
        let tenant = i / 2 % self.tenants.len();
        let id = request_id(self.run, i);
        let mut req = if posts(i) {
            let t = &self.tenants[tenant];
            let conv = t.conversations[i / 4 % t.conversations.len()];
            let mut req = Req::get(format!("{}/v1/conversations/{conv}/messages", self.base), "post");
            req.method = Method::POST;
            req.body = Some(Bytes::from(json!({ "body": id }).to_string()));
            req
        } else {
            Req::get(format!("{}/v1/conversations?limit=10", self.base), "inbox")
        };
        req.tenant = Some(tenant);
        req.expect_json = true;
        if let Ok(v) = HeaderValue::from_str(&id) {
            req.headers.push((HeaderName::from_static("x-request-id"), v));
        }
        req
    }
}

/// GETs of `urls` in turn, with the run's one token if it has one.
struct Rotation {
    urls: Vec<String>,
    token: bool,
}

impl Requests for Rotation {
    fn request(&self, i: usize) -> Req {
        let mut req = Req::get(self.urls[i % self.urls.len()].clone(), "rotation");
        req.tenant = self.token.then_some(0);
        req
    }
}

/// Makes an arrival's request on the engine and keeps its sample.
struct Recorded<R> {
    requests: R,
    t0: Instant,
    samples: Mutex<Vec<Sample>>,
}

impl<R: Requests> Workload for Recorded<R> {
    fn arrive(self: Arc<Self>, a: Arrival) -> BoxFuture {
        Box::pin(async move {
            let i = usize::try_from(a.n).unwrap_or(usize::MAX);
            let req = self.requests.request(i);
            let sent = Instant::now();
            let (class, reply) = a.request(a.intended, req).await;
            let sample = Sample {
                i,
                at: sent.saturating_duration_since(self.t0),
                took: sent.elapsed(),
                outcome: Outcome::from_engine(class, reply),
            };
            if let Ok(mut samples) = self.samples.lock() {
                samples.push(sample);
            }
        })
    }
}

impl<R> Recorded<R> {
    fn take(&self) -> Vec<Sample> {
        let mut samples = self.samples.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default();
        samples.sort_by_key(|s| s.i);
        samples
    }
}

/// The engine as the suite runs it: a fully open loop (no in-flight cap: a stall shows as
/// latency and connections, never as a slower sender), a pacer thread, a 20 s timeout.
fn engine(tokens: Tokens) -> Engine {
    let cfg = EngineConfig {
        pacer: Pacer::Thread,
        max_in_flight: None,
        timeout: Duration::from_secs(20),
        ..EngineConfig::default()
    };
    let start = Instant::now();
    Engine::new(cfg, tokens, Sampler::start(None, None, Duration::from_secs(1), start), start)
}

/// The testbed's tenants as the engine's tokens, in the same order.
fn tokens(tenants: &[TenantData]) -> anyhow::Result<Tokens> {
    let lines = tenants
        .iter()
        .map(|t| TokenLine {
            tenant_id: t.tenant.to_string(),
            user_id: t.user.to_string(),
            token: Some(t.token.clone()),
            weight: 1.0,
        })
        .collect();
    Tokens::from_lines(lines, "")
}

/// Runs `requests` open loop at `rate` for `duration` on the engine; every request's sample, in
/// order. A generator that could not keep the schedule is said on stderr (the samples' send
/// times show it too).
fn run_open<R: Requests>(
    run: &'static str,
    tokens: Tokens,
    requests: R,
    rate: f64,
    duration: Duration,
    t0: Instant,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let recorded = Arc::new(Recorded { requests, t0, samples: Mutex::new(Vec::new()) });
        let workload: Arc<dyn Workload> = Arc::clone(&recorded) as Arc<dyn Workload>;
        let step = engine(tokens).open_step(0, run.to_owned(), rate, duration, vec![(rate, workload)]).await;
        if !step.audit.valid {
            eprintln!("chaos {run}: the generator's audit failed: {}", step.audit.reasons.join("; "));
        }
        recorded.take()
    })
}

/// Open-loop load of the mix at `rate` for `duration`: requests are sent on schedule whether or
/// not the earlier ones have answered (so a stall shows as latency, not as a slower sender).
pub(super) fn open_loop(
    run: &'static str,
    base: String,
    tenants: Vec<TenantData>,
    rate: f64,
    duration: Duration,
    t0: Instant,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let tokens = match tokens(&tenants) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("chaos {run}: the tenants' tokens: {e}");
            return tokio::spawn(async { Vec::new() });
        }
    };
    run_open(run, tokens, Mix { run, base, tenants }, rate, duration, t0)
}

/// GETs of `urls` in turn at `rate` for `duration`, each with `authorization` if given; what
/// they got.
pub(super) fn rotation(
    run: &'static str,
    urls: Vec<String>,
    authorization: Option<&str>,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<tokio::task::JoinHandle<Vec<Sample>>> {
    let tokens = match authorization {
        Some(token) => Tokens::from_lines(
            vec![TokenLine {
                tenant_id: String::new(),
                user_id: String::new(),
                token: Some(token.to_owned()),
                weight: 1.0,
            }],
            "",
        )?,
        None => Tokens::none(),
    };
    let token = authorization.is_some();
    Ok(run_open(run, tokens, Rotation { urls, token }, rate, duration, Instant::now()))
}

/// 503s that say the database (or the handler's deadline) failed the request.
pub(super) const TYPED_503: &[&str] = &["db_unavailable", "db_saturated", "request_timeout"];

/// 503s of admission control: refusals under overload, by design.
pub(super) const SHED_503: &[&str] = &["load_shed", "queue_timeout"];

/// A run's outcomes counted as the lab counts them (ok; refusals by code; errors by kind), with
/// the groupings the verdicts read as views of those counts.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) ok: usize,
    /// Refusals by status (429 or 503) and code.
    refused: BTreeMap<(u16, String), usize>,
    /// Errors with a complete response, by status and kind.
    errors: BTreeMap<(u16, String), usize>,
    /// Requests without a complete response, by kind.
    unanswered: BTreeMap<String, usize>,
    /// What the client said of the first request without a complete response.
    first_failure: Option<String>,
}

impl Tally {
    /// Every refusal, whatever its code (the lab's refused count).
    pub(super) fn refusals(&self) -> usize {
        self.refused.values().sum()
    }

    fn refused_503(&self, codes: &[&str]) -> usize {
        self.refused
            .iter()
            .filter(|((status, code), _)| *status == 503 && codes.contains(&code.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// 503s of the database or the handler's deadline ([`TYPED_503`]).
    pub(super) fn typed_503(&self) -> usize {
        self.refused_503(TYPED_503)
    }

    /// Admission's 503s ([`SHED_503`]).
    pub(super) fn shed(&self) -> usize {
        self.refused_503(SHED_503)
    }

    /// 429s, the throttles', whatever their code.
    pub(super) fn throttled(&self) -> usize {
        self.refused.iter().filter(|((status, _), _)| *status == 429).map(|(_, n)| n).sum()
    }

    /// 503 refusals with a code in neither [`TYPED_503`] nor [`SHED_503`]: none the load mix has
    /// a reason to get (`streams_full` is the streams'), so the verdicts hold them against the
    /// server as they hold a 5xx.
    pub(super) fn other_503(&self) -> usize {
        self.refusals() - self.typed_503() - self.shed() - self.throttled()
    }

    /// Errors the server answered, other than a 4xx: a 5xx (an untyped 503 included), or a 2xx
    /// whose body does not parse.
    pub(super) fn server_errors(&self) -> usize {
        self.errors.iter().filter(|((status, _), _)| !(400..500).contains(status)).map(|(_, n)| n).sum()
    }

    fn other_4xx(&self) -> usize {
        self.errors.values().sum::<usize>() - self.server_errors()
    }

    /// Requests without a complete response, refused connections included.
    pub(super) fn failed(&self) -> usize {
        self.unanswered.values().sum()
    }

    /// Requests without a complete response of one kind (see [`REFUSED_AT_CONNECT`]).
    pub(super) fn failed_with(&self, kind: &str) -> usize {
        self.unanswered.get(kind).copied().unwrap_or(0)
    }

    /// Whatever was not ok, by refusal (`503 load_shed`) or error kind (`status_500`, `reset`).
    pub(super) fn not_ok(&self) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for ((status, code), n) in &self.refused {
            *by.entry(format!("{status} {code}")).or_default() += n;
        }
        for ((_, kind), n) in &self.errors {
            *by.entry(kind.clone()).or_default() += n;
        }
        for (kind, n) in &self.unanswered {
            *by.entry(kind.clone()).or_default() += n;
        }
        by
    }
}

pub(super) fn tally<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> Tally {
    let mut t = Tally::default();
    for s in samples {
        match &s.outcome {
            Outcome::Answered { class: Class::Ok, .. } => t.ok += 1,
            Outcome::Answered { status, class: Class::Refused { code, .. }, .. } => {
                *t.refused.entry((*status, code.clone())).or_default() += 1;
            }
            Outcome::Answered { status, class: Class::Error { kind }, .. } => {
                *t.errors.entry((*status, kind.clone())).or_default() += 1;
            }
            Outcome::Unanswered { kind, detail } => {
                *t.unanswered.entry(kind.clone()).or_default() += 1;
                t.first_failure.get_or_insert_with(|| detail.clone());
            }
        }
    }
    t
}

pub(super) fn describe(t: &Tally) -> String {
    let mut s = format!(
        "{} ok, {} typed 503 (database/deadline), {} shed 503 (admission), {} 429, {} other 503, {} other 4xx, \
         {} server errors, {} without a complete response",
        t.ok,
        t.typed_503(),
        t.shed(),
        t.throttled(),
        t.other_503(),
        t.other_4xx(),
        t.server_errors(),
        t.failed()
    );
    let not_ok = t.not_ok();
    if !not_ok.is_empty() {
        s.push_str(&format!(" (by code and kind: {not_ok:?})"));
    }
    if let Some(f) = &t.first_failure {
        s.push_str(&format!("; first failure: {}", f.chars().take(200).collect::<String>()));
    }
    s
}

/// The nearest-rank `p`th percentile (`p` in whole percent).
pub(super) fn percentile(mut v: Vec<Duration>, p: usize) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[(v.len() * p).div_ceil(100).clamp(1, v.len()) - 1]
}

/// `part` of `whole`, 0 when `whole` is 0.
pub(super) fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

pub(super) fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Closed-loop throughput of the load mix (16 callers for 3 s, the engine's goodput): what
/// "half of capacity" is measured against.
pub(super) async fn capacity(base: &str, tenants: &[TenantData]) -> anyhow::Result<f64> {
    let mix = Recorded {
        requests: Mix { run: "capacity", base: base.to_owned(), tenants: tenants.to_vec() },
        t0: Instant::now(),
        samples: Mutex::new(Vec::new()),
    };
    let step =
        engine(tokens(tenants)?).closed_step(0, "capacity".to_owned(), 16, Duration::from_secs(3), Arc::new(mix)).await;
    Ok(step.goodput_rps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(outcome: Outcome) -> Sample {
        Sample { i: 0, at: Duration::ZERO, took: Duration::ZERO, outcome }
    }

    fn answered(status: u16, body: &str) -> Sample {
        let class = classify(status, &reqwest::header::HeaderMap::new(), body.as_bytes(), true);
        sample(Outcome::Answered { status, class, created: None })
    }

    fn refused(status: u16, code: &str) -> Sample {
        answered(status, &format!(r#"{{"error":{{"type":"service_unavailable","code":"{code}"}}}}"#))
    }

    fn unanswered(kind: &str) -> Sample {
        sample(Outcome::Unanswered { kind: kind.to_owned(), detail: format!("{kind} (detail)") })
    }

    #[test]
    fn the_verdicts_groups_are_views_of_the_labs_classification() {
        let samples = [
            answered(201, r#"{"id":"0190d4a4-5b6c-7d8e-9f00-112233445566"}"#),
            answered(200, r#"{"items":["#),
            refused(503, "db_unavailable"),
            refused(503, "queue_timeout"),
            refused(429, "rate_limited"),
            answered(429, ""),
            refused(503, "streams_full"),
            answered(503, "<html>"),
            answered(500, ""),
            answered(404, r#"{"error":{"type":"not_found","code":"not_found"}}"#),
            unanswered(REFUSED_AT_CONNECT),
            unanswered("reset"),
        ];
        let t = tally(&samples);
        assert_eq!(t.ok, 1);
        assert_eq!((t.refusals(), t.typed_503(), t.shed(), t.throttled(), t.other_503()), (5, 1, 1, 2, 1));
        // The unparseable 2xx, the untyped 503 and the 500; the 404 apart.
        assert_eq!((t.server_errors(), t.other_4xx()), (3, 1));
        assert_eq!((t.failed(), t.failed_with(REFUSED_AT_CONNECT)), (2, 1));
        assert_eq!(t.not_ok().get("429 rate_limited"), Some(&2));
        assert_eq!(t.first_failure.as_deref(), Some("connect (detail)"));
    }

    #[test]
    fn a_503_refusal_is_matched_by_its_code() {
        assert!(refused(503, "db_saturated").outcome.refused_503(TYPED_503));
        assert!(!refused(503, "db_saturated").outcome.refused_503(SHED_503));
        assert!(!refused(429, "rate_limited").outcome.refused_503(&["rate_limited"]));
        assert!(!answered(503, "<html>").outcome.refused_503(TYPED_503));
    }

    #[test]
    fn an_outcome_is_named_by_its_status_its_code_or_its_kind() {
        assert_eq!(refused(503, "load_shed").outcome.label(), "503 load_shed");
        assert_eq!(answered(401, "").outcome.label(), "401");
        assert_eq!(answered(503, "<html>").outcome.label(), "status_503_untyped");
        assert_eq!(answered(200, "{").outcome.label(), "unparseable_body");
        assert_eq!(unanswered("timeout").outcome.label(), "timeout");
    }
}
