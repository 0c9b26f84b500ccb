//! The engine: runs one open-loop step (pacer threads dispatching arrivals at their intended
//! times) or one closed-loop step (N callers in a loop), records every request and audits the
//! generator.
//!
//! `request` makes a step's requests (with a retrying client's attempts) and records them,
//! `audit` is the self-audit of a finished step, and `tenants` keeps the per-tenant totals of a
//! run.

mod audit;
mod request;
mod tenants;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

pub use self::request::{Req, StepCtx};
use crate::classify::Outcome;
use crate::client::{Http, Reply};
use crate::procstat;
use crate::report::{Mode, StepReport};
use crate::sampler::Sampler;
use crate::schedule::{Arrivals, Pacer, Schedule, spawn_pacer};
use crate::stats::{StepRecorder, TenantCounts};
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
/// slower still and collapses (measured: docs/lab/history/a6e0c72-load-lab-accuracy.md).
/// Raise it with `--max-in-flight` for targets whose latency x rate is higher; reaching it is
/// reported.
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

/// A step that has begun: its shared state, its mode, when it started, and the generator's CPU
/// seconds and connections opened by then.
struct Begun {
    ctx: Arc<StepCtx>,
    mode: Mode,
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

    fn begin(&self, index: usize, mode: Mode, cap: Option<usize>, duration: Duration) -> Begun {
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
        Begun { ctx, mode, start, cpu0: procstat::cpu_seconds(None), conns0: self.http.connections_opened() }
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
        let b = self.begin(index, Mode::Open, self.cfg.max_in_flight, duration);
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
        self.finish(index, label, Some(offered_rps), None, duration, &b)
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
        let b = self.begin(index, Mode::Closed, None, duration);
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
        self.finish(index, label, None, Some(concurrency), duration, &b)
    }

    /// Ends step `b`: reads its recorder, audits it, adds its per-tenant counts to the run's
    /// totals and reports it.
    fn finish(
        &self,
        index: usize,
        label: String,
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
        let audit = self.audit(b, &rec, send_lag.p99_ms, cpu1, elapsed_s, &server);
        self.add_tenant_counts(&rec);
        let sent = completed;
        StepReport {
            index,
            label,
            mode: b.mode,
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
}
