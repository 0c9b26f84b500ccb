//! The engine: runs one open-loop step (pacer threads dispatching arrivals at their intended
//! times) or one closed-loop step (N callers in a loop), records every request and audits the
//! generator.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::classify::{Outcome, classify};
use crate::client::{Http, Reply};
use crate::procstat;
use crate::report::{Audit, LittlesLaw, Mode, StepReport};
use crate::sampler::Sampler;
use crate::schedule::{Arrivals, Pacer, Schedule, spawn_pacer};
use crate::stats::{Sample, StepRecorder, TenantCounts};
use crate::tokens::Tokens;

pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What one arrival does: a single request, or a whole journey.
pub trait Workload: Send + Sync + 'static {
    fn arrive(self: Arc<Self>, arrival: Arrival) -> BoxFuture;
}

/// One arrival: when it was meant to happen, its sequence number, the step it belongs to and,
/// in a closed loop, the caller that makes it.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub intended: Instant,
    pub n: u64,
    pub step: Arc<StepCtx>,
    pub caller: Option<Arc<Caller>>,
}

impl Arrival {
    /// The token to send: the caller's own, or for an open-loop arrival one picked by weight.
    pub fn tenant(&self, rng: &mut impl rand::Rng) -> Option<usize> {
        match &self.caller {
            Some(c) => c.tenant,
            None => self.step.tokens.pick(rng).map(|(i, _)| i),
        }
    }

    /// One logical request (see [`StepCtx::call`]), from this arrival's intended time.
    pub async fn call(&self, req: Req, rng: &mut impl rand::Rng) -> (Outcome, Option<Reply>) {
        self.step.call(self.intended, req, self.caller.as_deref(), rng).await
    }

    /// One request (see [`StepCtx::request`]) made by this arrival's caller, if any.
    pub async fn request(&self, intended: Instant, req: Req) -> (Outcome, Option<Reply>) {
        self.step.request(intended, req, self.caller.as_deref()).await
    }
}

/// A closed-loop caller: one client, as a k6 VU or a browser tab is. It keeps one token for the
/// whole step (picked by weight when the run has several) and its own kept-alive connection, so
/// a server can tell its requests apart from the others' as it would a real client's. An
/// honouring caller waits out `Retry-After` on its own.
#[derive(Debug)]
pub struct Caller {
    pub index: usize,
    pub tenant: Option<usize>,
    pub http: Http,
}

/// Who an honouring client is: a closed-loop caller, or for open-loop arrivals (each a new user
/// of the token's account) the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
    Caller(usize),
    Token(Option<usize>),
}

/// The default in-flight cap. A healthy target needs far fewer (10,000 req/s x 10 ms = 100),
/// and a generator starved of CPU that may open thousands of connections at once makes itself
/// slower still and collapses (measured: docs/PERFORMANCE.md). Raise it with
/// `--max-in-flight` for targets whose latency x rate is higher; reaching it is reported.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Settings shared by every step of a run.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub arrivals: Arrivals,
    pub pacer: Pacer,
    pub seed: u64,
    /// Cap on requests in flight (and so on connections). Reaching it is reported as
    /// generator saturation and marks the step invalid: the loop went partly closed. `None`
    /// keeps the loop fully open, at the risk of the generator's own collapse (thousands of
    /// connections opened at once) on a starved machine.
    pub max_in_flight: Option<usize>,
    /// A step whose send lag p99 exceeds this is generator-limited.
    pub max_send_lag_ms: f64,
    pub timeout: Duration,
    /// Open a connection per request instead of keeping them alive.
    pub new_connections: bool,
    /// Arrivals honour `Retry-After` as this policy says (`None`: a refusal ends the arrival, as
    /// for a client that ignores it and moves on to its next request).
    pub honour: Option<crate::retry::RetryPolicy>,
    /// Keep each step second by second (`StepReport::timeline`).
    pub timeline: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            arrivals: Arrivals::Constant,
            pacer: Pacer::Thread,
            seed: 1,
            max_in_flight: Some(DEFAULT_MAX_IN_FLIGHT),
            max_send_lag_ms: 10.0,
            timeout: Duration::from_secs(10),
            new_connections: false,
            honour: None,
            timeline: false,
        }
    }
}

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
        }
    }
}

/// The state of one step, shared by every request in it.
#[derive(Debug)]
pub struct StepCtx {
    pub http: Http,
    pub tokens: Arc<Tokens>,
    pub seed: u64,
    rec: Mutex<StepRecorder>,
    in_flight: AtomicU64,
    peak: AtomicU64,
    cap: Option<Arc<Semaphore>>,
    cap_waits: AtomicU64,
    honour: Option<crate::retry::Honouring>,
    /// When the step stops starting work.
    ends: Instant,
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
        let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(2);
        if let Some(t) = req.tenant.and_then(|i| self.tokens.tenants().get(i)) {
            headers.push((http::header::AUTHORIZATION, t.authorization.clone()));
        }
        if req.idempotency_key
            && let Ok(v) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
        {
            headers.push((HeaderName::from_static("idempotency-key"), v));
        }
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

/// Runs steps one after another and keeps what spans them: the sampler and per-tenant totals.
#[derive(Debug)]
pub struct Engine {
    pub http: Http,
    pub tokens: Arc<Tokens>,
    pub cfg: EngineConfig,
    pub sampler: Sampler,
    pub run_start: Instant,
    tenants: Mutex<BTreeMap<usize, TenantCounts>>,
}

struct Begun {
    ctx: Arc<StepCtx>,
    start: Instant,
    cpu0: Option<f64>,
    conns0: u64,
}

impl Engine {
    pub fn new(cfg: EngineConfig, tokens: Tokens, sampler: Sampler, run_start: Instant) -> Self {
        Self {
            http: if cfg.new_connections {
                Http::new(cfg.timeout).without_keep_alive()
            } else {
                Http::new(cfg.timeout)
            },
            tokens: Arc::new(tokens),
            cfg,
            sampler,
            run_start,
            tenants: Mutex::new(BTreeMap::new()),
        }
    }

    fn begin(&self, index: usize, cap: Option<usize>, duration: Duration) -> Begun {
        self.sampler.set_step(Some(index));
        let start = Instant::now();
        let ctx = Arc::new(StepCtx {
            http: self.http.clone(),
            tokens: Arc::clone(&self.tokens),
            seed: self.cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(index as u64),
            rec: Mutex::new(if self.cfg.timeline { StepRecorder::with_timeline(start) } else { StepRecorder::new() }),
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            cap: cap.map(|c| Arc::new(Semaphore::new(c))),
            cap_waits: AtomicU64::new(0),
            honour: self.cfg.honour.map(crate::retry::Honouring::new),
            ends: start + duration,
        });
        Begun { ctx, start, cpu0: procstat::cpu_seconds(None), conns0: self.http.connections_opened() }
    }

    /// One open-loop step: each stream is (arrivals per second, what an arrival does).
    /// `offered_rps` is the request rate the streams add up to.
    pub async fn open_step(
        &self,
        index: usize,
        label: String,
        offered_rps: f64,
        duration: Duration,
        streams: Vec<(f64, Arc<dyn Workload>)>,
    ) -> StepReport {
        let b = self.begin(index, self.cfg.max_in_flight, duration);
        let handle = tokio::runtime::Handle::current();
        let tracker = TaskTracker::new();
        let stop = Arc::new(AtomicBool::new(false));
        let mut pacers = Vec::new();
        let n_streams = streams.len().max(1) as u64;
        for (i, (rate, workload)) in streams.into_iter().enumerate() {
            let schedule = Schedule::new(self.cfg.arrivals, rate, b.ctx.seed.wrapping_add(i as u64 * 7919));
            let (ctx, tracker, handle) = (Arc::clone(&b.ctx), tracker.clone(), handle.clone());
            // Arrival numbers interleave the streams: unique, and consecutive within a stream
            // modulo the stream count (round-robin over URLs relies on it).
            let mut n: u64 = i as u64;
            let mut dispatch = move |intended: Instant| {
                let a = Arrival { intended, n, step: Arc::clone(&ctx), caller: None };
                n += n_streams;
                tracker.spawn_on(Arc::clone(&workload).arrive(a), &handle);
            };
            match self.cfg.pacer {
                Pacer::Thread => {
                    let p = spawn_pacer(schedule, b.start, duration, Arc::clone(&stop), dispatch);
                    pacers.push(tokio::task::spawn_blocking(move || p.join().unwrap_or(0)));
                }
                Pacer::Runtime => {
                    let start = b.start;
                    pacers.push(tokio::spawn(async move {
                        let mut sent = 0;
                        for offset in schedule {
                            if offset >= duration {
                                break;
                            }
                            let intended = start + offset;
                            if intended > Instant::now() {
                                tokio::time::sleep_until(intended.into()).await;
                            }
                            dispatch(intended);
                            sent += 1;
                        }
                        sent
                    }));
                }
            }
        }
        for p in pacers {
            let _arrivals = p.await;
        }
        tracker.close();
        tracker.wait().await;
        self.finish(index, label, Mode::Open, Some(offered_rps), None, duration, &b)
    }

    /// One closed-loop step: `concurrency` callers, each a client of its own (one token, its
    /// own connection) sending its next request as soon as the last one is answered, for
    /// `duration`.
    pub async fn closed_step(
        &self,
        index: usize,
        label: String,
        concurrency: usize,
        duration: Duration,
        workload: Arc<dyn Workload>,
    ) -> StepReport {
        let b = self.begin(index, None, duration);
        let end = b.start + duration;
        let mut set = tokio::task::JoinSet::new();
        for c in 0..concurrency {
            let (ctx, w) = (Arc::clone(&b.ctx), Arc::clone(&workload));
            let mut rng = SmallRng::seed_from_u64(ctx.seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let tenant = ctx.tokens.pick(&mut rng).map(|(i, _)| i);
            let caller = Arc::new(Caller { index: c, tenant, http: ctx.http.own_connections() });
            set.spawn(async move {
                let mut n = c as u64;
                while Instant::now() < end {
                    let a = Arrival {
                        intended: Instant::now(),
                        n,
                        step: Arc::clone(&ctx),
                        caller: Some(Arc::clone(&caller)),
                    };
                    Arc::clone(&w).arrive(a).await;
                    n += concurrency as u64;
                }
            });
        }
        while set.join_next().await.is_some() {}
        self.finish(index, label, Mode::Closed, None, Some(concurrency), duration, &b)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        index: usize,
        label: String,
        mode: Mode,
        offered_rps: Option<f64>,
        concurrency: Option<usize>,
        duration: Duration,
        b: &Begun,
    ) -> StepReport {
        self.sampler.set_step(None);
        let cpu1 = procstat::cpu_seconds(None);
        let ctx = &b.ctx;
        let Ok(rec) = ctx.rec.lock() else {
            panic!("a request task panicked while recording");
        };
        let dur_s = duration.as_secs_f64();
        let elapsed_s = rec.last_end().map_or(dur_s, |e| e.saturating_duration_since(b.start).as_secs_f64().max(dur_s));
        let completed = rec.completed();
        let ok = rec.ok_stats();
        let refused = rec.refused_stats();
        let errors = rec.error_stats();
        let share = |n: u64| {
            if completed == 0 { 0.0 } else { n as f64 / completed as f64 }
        };
        let send_lag = rec.send_lag();
        let achieved_rps = completed as f64 / elapsed_s;
        let goodput_rps = ok.count as f64 / elapsed_s;
        let server = self.sampler.summary(index);

        // The self-audit.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let cpu_s = match (b.cpu0, cpu1) {
            (Some(a), Some(z)) => Some((z - a).max(0.0)),
            _ => None,
        };
        let cpu_cores = cpu_s.map(|c| c / elapsed_s);
        let cap_waits = ctx.cap_waits.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        let mut warnings = Vec::new();
        if mode == Mode::Open {
            if send_lag.p99_ms > self.cfg.max_send_lag_ms {
                reasons.push(format!(
                    "send lag p99 {:.2}ms > {}ms: the generator fell behind its schedule",
                    send_lag.p99_ms, self.cfg.max_send_lag_ms
                ));
            }
            if cap_waits > 0 {
                reasons.push(format!(
                    "in-flight cap {} reached: {cap_waits} requests waited for a slot (the loop went partly closed)",
                    self.cfg.max_in_flight.unwrap_or_default()
                ));
            }
        }
        if let Some(c) = cpu_cores
            && c > 0.9 * cores as f64
        {
            reasons.push(format!("generator CPU {c:.2} of {cores} cores"));
        } else if let Some(c) = cpu_cores
            && c > 0.5 * cores as f64
        {
            warnings.push(format!("generator CPU {c:.2} of {cores} cores: it competes with the target"));
        }
        let expected = achieved_rps * rec.corrected_seconds() / completed.max(1) as f64;
        let generator = rec.busy_seconds() / elapsed_s;
        let server_in_flight = server_queue(&server);
        let mut hidden = None;
        if expected > 1.5 * generator + 1.0 {
            hidden = Some(format!(
                "{:.1} requests in flight by L = lambda W but {generator:.1} sent: {:.1} waited inside the generator before sending",
                expected,
                expected - generator
            ));
        } else if let Some(srv) = server_in_flight
            && generator > 1.5 * srv + 1.0
        {
            hidden = Some(format!(
                "{generator:.1} requests in flight from the generator but the server counts {srv:.1}: ~{:.1} queue unseen (accept backlog, sockets, a proxy)",
                generator - srv
            ));
        }
        let audit = Audit {
            valid: reasons.is_empty(),
            reasons,
            cpu_s,
            cpu_us_per_request: cpu_s.map(|c| c * 1e6 / completed.max(1) as f64),
            cpu_cores,
            connections_opened: self.http.connections_opened().saturating_sub(b.conns0),
            peak_in_flight: ctx.peak.load(Ordering::Relaxed),
            in_flight_cap: if mode == Mode::Open { self.cfg.max_in_flight } else { None },
            cap_waits,
            littles_law: LittlesLaw {
                expected_in_flight: expected,
                generator_in_flight: generator,
                server_in_flight,
                hidden_queueing: hidden,
            },
            warnings,
        };
        if let Ok(mut t) = self.tenants.lock() {
            for (i, c) in rec.tenant_counts() {
                let e = t.entry(i).or_insert_with(|| TenantCounts {
                    sent: 0,
                    ok: 0,
                    refused: 0,
                    refused_by_code: BTreeMap::new(),
                    errors: 0,
                    ok_latency: crate::stats::Hist::coarse(),
                });
                e.sent += c.sent;
                e.ok += c.ok;
                e.refused += c.refused;
                for (code, n) in c.refused_by_code {
                    *e.refused_by_code.entry(code).or_default() += n;
                }
                e.errors += c.errors;
                e.ok_latency.add(&c.ok_latency);
            }
        }
        let sent = completed;
        StepReport {
            index,
            label,
            mode,
            offered_rps,
            concurrency,
            started_s: b.start.saturating_duration_since(self.run_start).as_secs_f64(),
            duration_s: dur_s,
            elapsed_s,
            sent,
            sent_rps: sent as f64 / dur_s,
            completed,
            achieved_rps,
            goodput_rps,
            refused_share: share(refused.stats.count),
            error_share: share(errors.stats.count),
            ok,
            refused,
            errors,
            all: rec.all_stats(),
            send_lag,
            endpoints: rec.endpoint_stats(),
            audit,
            server,
            logical: ctx.honour.as_ref().map(crate::retry::Honouring::report),
            timeline: rec.timeline(),
        }
    }

    /// Per-tenant results over every step so far, heaviest first, and Jain's index.
    pub fn tenant_reports(&self) -> (Vec<crate::report::TenantReport>, Option<f64>) {
        let Ok(t) = self.tenants.lock() else {
            return (Vec::new(), None);
        };
        let total: u64 = t.values().map(|c| c.sent).sum();
        let mut out: Vec<_> = t
            .iter()
            .filter_map(|(i, c)| {
                let tenant = self.tokens.tenants().get(*i)?;
                Some(crate::report::TenantReport {
                    tenant_id: tenant.tenant_id.clone(),
                    weight: tenant.weight,
                    sent: c.sent,
                    share: c.sent as f64 / total.max(1) as f64,
                    ok: c.ok,
                    refused: c.refused,
                    refused_by_code: c.refused_by_code.clone(),
                    errors: c.errors,
                    refused_share: c.refused as f64 / c.sent.max(1) as f64,
                    ok_p99_ms: c.ok_latency.summary().p99_ms,
                })
            })
            .collect();
        out.sort_by_key(|t| std::cmp::Reverse(t.sent));
        let admitted: Vec<f64> = out.iter().map(|t| t.ok as f64 / t.sent.max(1) as f64).collect();
        let fairness = if out.len() > 1 { crate::report::jain(&admitted) } else { None };
        (out, fairness)
    }
}

/// The server's own count of requests it holds: `in_flight` plus `queue_depth`, preferring
/// the `capacity` section's totals.
fn server_queue(server: &BTreeMap<String, crate::report::SeriesSummary>) -> Option<f64> {
    let pick = |suffix: &str| {
        server
            .get(&format!("capacity.{suffix}"))
            .or_else(|| {
                server
                    .iter()
                    .filter(|(k, _)| k.ends_with(&format!(".{suffix}")) || k.as_str() == suffix)
                    .min_by_key(|(k, _)| k.len())
                    .map(|(_, v)| v)
            })
            .map(|v| v.mean)
    };
    let in_flight = pick("in_flight")?;
    Some(in_flight + pick("queue_depth").unwrap_or(0.0))
}
