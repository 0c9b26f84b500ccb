//! The floor of a refusal's cost: a bare hyper server (no tower, no router, no admission) that
//! answers every request but `/health` with the API's own 503 `load_shed`, byte for byte the same envelope and
//! headers. `cargo xtask lab` runs it pinned at the API's shape beside the API refusing everything
//! (`ADMISSION=static`, `ADMISSION_STATIC_LIMIT=0`), so the ratio of their CPU per refusal says
//! what Breakwater's refusal path adds to the HTTP stack and the kernel's own work.
//!
//! `GET /work?us=N&per_sec=R` stands for served work behind an ideal admission: at most R a second
//! (1,000 by default, with a tenth of a second's burst) spin on the thread's CPU clock for N µs
//! (200 by default) and answer 200; the rest get the same 503 at once. Offered beside refusals, it
//! holds the quota as full as served requests hold the API's, so the refusals' latency then is the
//! floor that the quota's pauses set under any refusal path (`docs/lab/experiments/shed-floor/`).
//!
//! `cargo run --release -p breakwater-loadlab --example canned_refusal -- [PORT]` prints the
//! address it bound (port 0, the default, lets the kernel pick one). 127.0.0.1 only. Like the
//! API, it runs tokio's multi-threaded runtime with its default worker count.

use std::convert::Infallible;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// The envelope the API renders for a refusal of a class admitting nothing.
const ENVELOPE: &str = r#"{"error":{"type":"service_unavailable","code":"load_shed","message":"over capacity (in-flight 0/0, queue 0/0)","recovery":{"retryable":true,"retry_after_seconds":1}}}"#;

async fn refuse(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // The liveness probe answers, as the API's does, so that the lab can wait for it.
    if req.uri().path() == "/health" {
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    }
    if req.uri().path() == "/work" {
        let us = query(&req, "us").unwrap_or(200);
        if admit(query(&req, "per_sec").unwrap_or(1000)) {
            spin(Duration::from_micros(us));
            return Ok(Response::new(Full::new(Bytes::from_static(b"{}"))));
        }
    }
    let mut res = Response::new(Full::new(Bytes::from_static(ENVELOPE.as_bytes())));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = res.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    h.insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
    Ok(res)
}

/// The query parameter `name` as a number.
fn query(req: &Request<hyper::body::Incoming>, name: &str) -> Option<u64> {
    let pairs = req.uri().query()?.split('&');
    pairs.filter_map(|p| p.split_once('=')).find(|(k, _)| *k == name).and_then(|(_, v)| v.parse().ok())
}

/// The work's admission: a GCRA of `per_sec` a second with a tenth of a second's burst, on the
/// wall clock (nanoseconds since the first request). Its state, the theoretical arrival time.
static TAT: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn admit(per_sec: u64) -> bool {
    let interval = 1_000_000_000 / per_sec.max(1);
    let burst = 100_000_000;
    let now = u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX);
    TAT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
        let tat = tat.max(now);
        (tat <= now + burst).then_some(tat + interval)
    })
    .is_ok()
}

/// Uses `cpu` of this thread's CPU time: a quota's pause in the middle does not count, as it
/// would not for a handler's real work.
fn spin(cpu: Duration) {
    let now = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
    };
    let start = now();
    while now() - start < cpu {
        std::hint::spin_loop();
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("127.0.0.1:{} pid {}", listener.local_addr()?.port(), std::process::id());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(refuse)).await;
        });
    }
}
