//! The floor of a refusal's cost: a bare hyper server (no tower, no router, no admission) that
//! answers every request but `/health` with the API's own 503 `load_shed`, byte for byte the same envelope and
//! headers. `cargo xtask lab` runs it pinned at the API's shape beside the API refusing everything
//! (`ADMISSION=static`, `ADMISSION_STATIC_LIMIT=0`), so the ratio of their CPU per refusal says
//! what Breakwater's refusal path adds to the HTTP stack and the kernel's own work.
//!
//! `cargo run --release -p breakwater-loadlab --example canned_refusal -- [PORT]` prints the
//! address it bound (port 0, the default, lets the kernel pick one). 127.0.0.1 only. Like the
//! API, it runs tokio's multi-threaded runtime with its default worker count.

use std::convert::Infallible;

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
    let mut res = Response::new(Full::new(Bytes::from_static(ENVELOPE.as_bytes())));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = res.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    h.insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
    Ok(res)
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
