//! A trivial HTTP server for measuring the generator itself (docs/PERFORMANCE.md, "Load lab
//! accuracy"): `GET /` answers a small JSON body at once, on one runtime thread, so the server
//! never is the limit at the rates measured. Listens on 127.0.0.1 only.
//!
//! `cargo run --release -p breakwater-loadlab --example trivial_server` prints the port it
//! bound (a free one, from the kernel; pass a port to choose).

use axum::routing::get;
use axum::{Json, Router};

fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let app = Router::new().route("/", get(|| async { Json(serde_json::json!({"ok": true})) }));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        println!("127.0.0.1:{port} pid {}", std::process::id());
        axum::serve(listener, app).await
    })
}
