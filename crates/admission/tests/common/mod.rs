//! A simulated service with a known capacity, and an open-loop load generator, both on tokio's
//! clock so that tests run under `start_paused` (deterministic, simulated seconds in real
//! milliseconds).
#![allow(dead_code, unreachable_pub)]
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use breakwater_admission::{Admission, AdmissionBody, AdmissionService, ClassId, Refusal, RefusalReason, Route};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

pub type Body = Full<Bytes>;
pub type Classify = fn(&Request<Body>) -> Route;
pub type TenantKey = fn(&Request<Body>) -> Option<u64>;
pub type Admitted<S> = AdmissionService<S, Classify, TenantKey>;

/// What the load generators here call: admission's service, or one in front of it.
pub trait Callee:
    Service<Request<Body>, Response = Response<AdmissionBody<Body>>, Future: Send, Error: std::fmt::Debug + Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> Callee for S where
    S: Service<Request<Body>, Response = Response<AdmissionBody<Body>>, Future: Send, Error: std::fmt::Debug + Send>
        + Clone
        + Send
        + 'static
{
}

/// `workers` CPUs each taking `cpu_ms` (+-50% jitter) per request, then `io_ms` of waiting that
/// needs no CPU. Capacity = workers / cpu; the knee (Little's law) = capacity x (cpu + io).
#[derive(Clone)]
pub struct SimService {
    cpu: Arc<Semaphore>,
    workers: Arc<AtomicU64>,
    cpu_ms: Arc<AtomicU64>,
    io_ms: Arc<AtomicU64>,
    seq: Arc<AtomicU64>,
}

impl SimService {
    pub fn new(workers: u64, cpu_ms: u64, io_ms: u64) -> Self {
        Self {
            cpu: Arc::new(Semaphore::new(usize::try_from(workers).unwrap_or(1))),
            workers: Arc::new(AtomicU64::new(workers)),
            cpu_ms: Arc::new(AtomicU64::new(cpu_ms)),
            io_ms: Arc::new(AtomicU64::new(io_ms)),
            seq: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn capacity(&self) -> f64 {
        self.workers.load(Ordering::Relaxed) as f64 * 1000.0 / self.cpu_ms.load(Ordering::Relaxed) as f64
    }

    pub fn base_secs(&self) -> f64 {
        (self.cpu_ms.load(Ordering::Relaxed) + self.io_ms.load(Ordering::Relaxed)) as f64 / 1e3
    }

    /// The Little's-law optimum in-flight count.
    pub fn knee(&self) -> f64 {
        self.capacity() * self.base_secs()
    }

    pub fn set_workers(&self, workers: u64) {
        let now = self.workers.swap(workers, Ordering::Relaxed);
        if workers > now {
            self.cpu.add_permits(usize::try_from(workers - now).unwrap_or(0));
        } else if now > workers {
            // Take the CPUs away as they come free (FIFO, like any waiting request).
            let sem = self.cpu.clone();
            let n = u32::try_from(now - workers).unwrap_or(0);
            tokio::spawn(async move {
                if let Ok(p) = sem.acquire_many(n).await {
                    p.forget();
                }
            });
        }
    }

    pub fn set_io_ms(&self, io_ms: u64) {
        self.io_ms.store(io_ms, Ordering::Relaxed);
    }
}

impl Service<Request<Body>> for SimService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let cpu_ms = self.cpu_ms.load(Ordering::Relaxed);
        // Deterministic jitter in [0.5, 1.5) x cpu, at millisecond resolution (the timer's).
        let jitter = (splitmix(n) % 1000) as f64 / 1000.0 + 0.5;
        let cpu = Duration::from_millis(((cpu_ms as f64 * jitter).round() as u64).max(1));
        let io = Duration::from_millis(self.io_ms.load(Ordering::Relaxed));
        let sem = self.cpu.clone();
        Box::pin(async move {
            if let Ok(permit) = sem.acquire_owned().await {
                tokio::time::sleep(cpu).await;
                drop(permit);
            }
            tokio::time::sleep(io).await;
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    }
}

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn classify(req: &Request<Body>) -> Route {
    if req.uri().path() == "/health" { Route::Bypass } else { Route::Class(ClassId::DEFAULT) }
}

pub fn tenant(req: &Request<Body>) -> Option<u64> {
    req.headers().get("x-tenant").and_then(|v| v.to_str().ok()?.parse().ok())
}

pub fn admitted<S>(admission: &Admission, inner: S) -> Admitted<S> {
    admission.layer(classify as Classify, tenant as TenantKey).layer(inner)
}

/// One request's fate, as the client saw it.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub sent: Instant,
    pub latency: Duration,
    pub status: u16,
    pub tenant: Option<u64>,
    pub reason: Option<RefusalReason>,
    pub retry_after: Option<u32>,
}

pub type Log = Arc<Mutex<Vec<Record>>>;

/// Sends one request and records what came back, including the time to read the whole body.
pub async fn send<S>(svc: S, req: Request<Body>, log: Log)
where
    S: Service<Request<Body>, Response = Response<AdmissionBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let sent = Instant::now();
    let tenant = tenant(&req);
    let Ok(res) = svc.oneshot(req).await else { panic!("service failed") };
    let status = res.status().as_u16();
    let reason = res.extensions().get::<Refusal>().map(|r| r.reason);
    let retry_after = retry_after(&res);
    let _ = res.into_body().collect().await;
    let record = Record { sent, latency: sent.elapsed(), status, tenant, reason, retry_after };
    if let Ok(mut log) = log.lock() {
        log.push(record);
    }
}

fn retry_after<B>(res: &Response<B>) -> Option<u32> {
    res.headers().get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()?.parse().ok())
}

pub fn request(path: &str, tenant: Option<u64>) -> Request<Body> {
    let mut b = Request::builder().uri(path);
    if let Some(t) = tenant {
        b = b.header("x-tenant", t.to_string());
    }
    b.body(Full::new(Bytes::new())).unwrap_or_default()
}

/// Open-loop traffic: `rate` requests per second from `tenant`, for `duration`, with arrivals
/// spread at random within each millisecond tick (mean rate exact).
#[derive(Clone, Copy, Debug)]
pub struct Traffic {
    pub rate: f64,
    pub tenant: Option<u64>,
}

pub async fn drive<S: Callee>(svc: &S, traffic: &[Traffic], duration: Duration, log: &Log, seed: u64) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut acc = vec![0.0f64; traffic.len()];
    let mut n = seed;
    while start.elapsed() < duration {
        tick.tick().await;
        for (t, a) in traffic.iter().zip(acc.iter_mut()) {
            n += 1;
            let u = (splitmix(n) % 10_000) as f64 / 5_000.0; // [0, 2): mean 1
            *a += t.rate / 1000.0 * u;
            while *a >= 1.0 {
                *a -= 1.0;
                tokio::spawn(send(svc.clone(), request("/", t.tenant), log.clone()));
            }
        }
    }
}

/// The default class's controller every 50 ms.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since the start of the run.
    pub t: f64,
    /// The limit in force (lower during a baseline probe).
    pub limit: f64,
    /// The controller's estimate.
    pub estimate: f64,
    /// Its no-load latency estimate, seconds.
    pub baseline: f64,
}

pub type Limits = Arc<Mutex<Vec<Sample>>>;

pub fn sample_limit(admission: &Admission, t0: Instant) -> (Limits, tokio::task::JoinHandle<()>) {
    let out = Arc::new(Mutex::new(Vec::new()));
    let (a, o) = (admission.clone(), out.clone());
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tick.tick().await;
            let c = &a.snapshot().classes[0];
            let sample = Sample {
                t: t0.elapsed().as_secs_f64(),
                limit: c.limit.unwrap_or(0) as f64,
                estimate: c.limit_estimate.unwrap_or(0.0),
                baseline: c.baseline_ms.unwrap_or(0.0) / 1e3,
            };
            if let Ok(mut o) = o.lock() {
                o.push(sample);
            }
        }
    });
    (out, task)
}

/// Lets every request already sent finish.
pub async fn settle() {
    tokio::time::sleep(Duration::from_secs(2)).await;
}

pub fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() as f64 - 1.0) * p).round() as usize;
    xs[i]
}

impl SimService {
    /// Takes one CPU for `ms` milliseconds: work done before admission decides (parsing,
    /// routing, the refusal itself), which refused requests cost too.
    pub async fn charge(&self, ms: u64) {
        if let Ok(_permit) = self.cpu.acquire().await {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// Charges every arrival `ms` of the simulated CPU before the inner service sees it, so that
/// refusals cost what they cost a real process: a closed loop that spins on them takes the CPU
/// from admitted work.
#[derive(Clone)]
pub struct ArrivalCost<S> {
    pub inner: S,
    pub sim: SimService,
    pub ms: u64,
}

impl<S> Service<Request<Body>> for ArrivalCost<S>
where
    S: Service<Request<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let (inner, sim, ms) = (self.inner.clone(), self.sim.clone(), self.ms);
        Box::pin(async move {
            sim.charge(ms).await;
            inner.oneshot(req).await
        })
    }
}

/// `callers` closed-loop callers for `duration`, each on a task of its own: caller `c` (counting
/// from 0) sends as tenant and caller `who(c)`, reads each answer to the end and sends its next
/// request at once, but after a refusal it first waits for what `refused(tally, c, retry_after)`
/// returns, which may also note the refusal in the caller's `tally`. Returns the 200s answered
/// at or after `from`, and every caller's tally.
async fn closed_loop<S, T, F>(
    svc: &S,
    callers: usize,
    duration: Duration,
    from: Duration,
    who: fn(usize) -> usize,
    refused: F,
) -> (usize, Vec<T>)
where
    S: Callee,
    T: Default + Send + 'static,
    F: Fn(&mut T, usize, Option<u32>) -> Option<Duration> + Clone + Send + 'static,
{
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..callers {
        let (svc, refused) = (svc.clone(), refused.clone());
        tasks.spawn(async move {
            let (mut ok, mut tally) = (0, T::default());
            while start.elapsed() < duration {
                let (status, retry_after) = call_as(svc.clone(), who(c), who(c)).await;
                if status == http::StatusCode::OK {
                    ok += usize::from(start.elapsed() >= from);
                } else if let Some(wait) = refused(&mut tally, c, retry_after) {
                    tokio::time::sleep(wait).await;
                }
            }
            (ok, tally)
        });
    }
    let (mut ok, mut tallies) = (0, Vec::new());
    while let Some(joined) = tasks.join_next().await {
        if let Ok((n, tally)) = joined {
            ok += n;
            tallies.push(tally);
        }
    }
    (ok, tallies)
}

/// One request from `caller` as `tenant`, read to the end: its status and its `Retry-After`.
async fn call_as<S: Callee>(svc: S, tenant: usize, caller: usize) -> (http::StatusCode, Option<u32>) {
    let req = Request::builder()
        .uri("/")
        .header("x-tenant", tenant.to_string())
        .header("x-caller", caller.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap_or_default();
    let Ok(res) = svc.oneshot(req).await else { panic!("service failed") };
    let status = res.status();
    let retry_after = retry_after(&res);
    let _ = res.into_body().collect().await;
    (status, retry_after)
}

/// `callers` closed-loop callers that ignore `Retry-After`: each sends its next request as soon
/// as the last is answered, for `duration`. All of them one caller and one tenant, like one
/// token's worth of k6 VUs. Returns the 200s answered at or after `from`.
pub async fn spin<S: Callee>(svc: &S, callers: usize, duration: Duration, from: Duration) -> usize {
    let (ok, _) = closed_loop(svc, callers, duration, from, |_| 1, |_: &mut (), _, _| None).await;
    ok
}

pub fn caller(req: &Request<Body>) -> Option<u64> {
    req.headers().get("x-caller").and_then(|v| v.to_str().ok()?.parse().ok())
}

/// What a population of honouring callers saw: the 200s answered at or after `from`, and every
/// `Retry-After` it was given.
#[derive(Debug, Default)]
pub struct Honoured {
    pub ok: usize,
    pub retry_after: Vec<u32>,
}

/// `callers` closed-loop callers that honour `Retry-After`, as SDK retry policies do: after a
/// refusal a caller sends nothing until the header's seconds, times a jitter factor in
/// [1, 1.2), have passed. Each is a caller and tenant of its own. For `duration`. The loop is
/// `spin`'s (`closed_loop`); what is its own is the wait after a refusal.
pub async fn honour<S: Callee>(svc: &S, callers: usize, duration: Duration, from: Duration) -> Honoured {
    let wait = move |seen: &mut Vec<u32>, c: usize, header: Option<u32>| {
        let secs = header?;
        seen.push(secs);
        let jitter = 1.0 + (splitmix((c + callers * seen.len()) as u64) % 1_000) as f64 / 5_000.0;
        Some(Duration::from_secs(u64::from(secs)).mul_f64(jitter))
    };
    let (ok, seen) = closed_loop(svc, callers, duration, from, |c| c, wait).await;
    Honoured { ok, retry_after: seen.concat() }
}
