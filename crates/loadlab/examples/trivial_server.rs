//! A trivial HTTP server for measuring the generator itself
//! (docs/lab/history/a6e0c72-load-lab-accuracy.md) and for trying the lab without the API. Listens on 127.0.0.1 only, on one
//! runtime thread.
//!
//! - `GET /` answers a small JSON body at once: never the limit at the rates measured.
//! - `GET /queue` is a single worker with an exact service time (default 4 ms, so 250 req/s):
//!   a FIFO whose completion times are computed, not slept in turn, so its throughput is
//!   exactly 1/service time. Ramp it to see a knee and a wall.
//! - `GET /v1/ops/status` publishes the worker's `capacity.limit`, `in_flight`, `queue_depth`.
//!
//! `cargo run --release -p breakwater-loadlab --example trivial_server -- [PORT] [SERVICE_MS]`
//! prints the address it bound (port 0, the default, lets the kernel pick a free one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

struct Worker {
    service: Duration,
    next_free: std::sync::Mutex<Instant>,
    inside: AtomicU64,
}

async fn queue(State(w): State<Arc<Worker>>) -> &'static str {
    w.inside.fetch_add(1, Ordering::Relaxed);
    let done = match w.next_free.lock() {
        Ok(mut nf) => {
            let start = (*nf).max(Instant::now());
            *nf = start + w.service;
            *nf
        }
        Err(_) => Instant::now(),
    };
    tokio::time::sleep_until(done.into()).await;
    w.inside.fetch_sub(1, Ordering::Relaxed);
    "done"
}

async fn ops(State(w): State<Arc<Worker>>) -> Json<serde_json::Value> {
    let inside = w.inside.load(Ordering::Relaxed);
    Json(json!({"capacity": {"limit": 1, "in_flight": inside.min(1), "queue_depth": inside.saturating_sub(1)}}))
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let service_ms: f64 = args.next().and_then(|p| p.parse().ok()).unwrap_or(4.0);
    let worker = Arc::new(Worker {
        service: Duration::from_secs_f64(service_ms / 1000.0),
        next_free: std::sync::Mutex::new(Instant::now()),
        inside: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let app = Router::new()
            .route("/", get(|| async { Json(json!({"ok": true})) }))
            .route("/queue", get(queue))
            .route("/v1/ops/status", get(ops))
            .with_state(worker);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        println!("127.0.0.1:{port} pid {}", std::process::id());
        axum::serve(listener, app).await
    })
}
