//! An in-process test server with known behaviour: a single-worker FIFO with an exact service
//! time, a one-off stall, a mix of refusals and errors, and a small fake of the chat API.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

#[derive(Clone)]
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<ServerState>,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

pub struct ServerState {
    /// Service time of the single worker behind `/queue`.
    pub service: Duration,
    /// When the single worker is next free. Completion times are computed from it exactly,
    /// so throughput is 1/service whatever the timer's granularity.
    next_free: Mutex<Instant>,
    /// Requests currently inside `/queue` (published on the ops status).
    queue_in_flight: AtomicU64,
    counter: AtomicU64,
    /// The `/stall` request with this sequence number sleeps for one second.
    pub stall_at: u64,
    /// Breaks the messages endpoint of the fake chat API.
    pub break_messages: AtomicBool,
    /// The next this many inbox lists are refused with 503 and `Retry-After: 1`.
    pub refuse_lists: AtomicU64,
    shed_total: AtomicU64,
    /// `/whoami`: the `Authorization` headers seen on each client connection (its peer address).
    pub seen: Mutex<std::collections::BTreeMap<SocketAddr, std::collections::BTreeSet<String>>>,
}

pub async fn start(service: Duration) -> TestServer {
    let state = Arc::new(ServerState {
        service,
        next_free: Mutex::new(Instant::now()),
        queue_in_flight: AtomicU64::new(0),
        counter: AtomicU64::new(0),
        stall_at: 50,
        break_messages: AtomicBool::new(false),
        refuse_lists: AtomicU64::new(0),
        shed_total: AtomicU64::new(0),
        seen: Mutex::default(),
    });
    let app = Router::new()
        .route("/fast", get(|| async { Json(json!({"ok": true})) }))
        .route("/queue", get(queue))
        .route("/stall", get(stall))
        .route("/mixed", get(mixed))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "late"
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(|| async { "ok" }))
        .route("/v1/ops/status", get(ops_status))
        .route("/v1/conversations", get(list_conversations))
        .route("/v1/conversations/{id}", get(get_conversation).patch(patch_conversation))
        .route("/v1/conversations/{id}/messages", get(list_messages).post(post_message))
        .route("/v1/contacts", get(list_contacts))
        .route("/whoami", get(whoami))
        .route("/echo", post(echo))
        .route(
            "/shed_long",
            get(|| async {
                (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "30")], Json(envelope("load_shed")))
            }),
        )
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.expect("serve");
    });
    TestServer { addr, state }
}

async fn queue(State(s): State<Arc<ServerState>>) -> &'static str {
    s.queue_in_flight.fetch_add(1, Ordering::Relaxed);
    let done = {
        let mut nf = s.next_free.lock().expect("lock");
        let start = (*nf).max(Instant::now());
        *nf = start + s.service;
        *nf
    };
    tokio::time::sleep_until(done.into()).await;
    s.queue_in_flight.fetch_sub(1, Ordering::Relaxed);
    "done"
}

async fn whoami(
    State(s): State<Arc<ServerState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    h: HeaderMap,
) -> &'static str {
    let token = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    s.seen.lock().expect("lock").entry(peer).or_default().insert(token);
    "ok"
}

async fn stall(State(s): State<Arc<ServerState>>) -> &'static str {
    if s.counter.fetch_add(1, Ordering::Relaxed) == s.stall_at {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    "ok"
}

fn envelope(code: &str) -> serde_json::Value {
    json!({"error": {"type": "service_unavailable", "code": code, "message": "busy",
        "recovery": {"retryable": true, "retry_after_seconds": 1}}})
}

/// One in five each: ok, a typed 503, a 429, a 500, and a 200 whose JSON body is cut short.
async fn mixed(State(s): State<Arc<ServerState>>) -> Response {
    match s.counter.fetch_add(1, Ordering::Relaxed) % 5 {
        0 => Json(json!({"ok": true})).into_response(),
        1 => {
            s.shed_total.fetch_add(1, Ordering::Relaxed);
            (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], Json(envelope("load_shed"))).into_response()
        }
        2 => (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")], Json(envelope("rate_limited")))
            .into_response(),
        3 => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        _ => ([(header::CONTENT_TYPE, "application/json")], "{\"items\":[").into_response(),
    }
}

async fn ops_status(State(s): State<Arc<ServerState>>) -> Json<serde_json::Value> {
    Json(json!({
        "capacity": {"limit": 1, "in_flight": s.queue_in_flight.load(Ordering::Relaxed).min(1),
                     "queue_depth": s.queue_in_flight.load(Ordering::Relaxed).saturating_sub(1),
                     "shed": {"load_shed": s.shed_total.load(Ordering::Relaxed)}},
        "pool": {"size": 10, "idle": 10, "waiting": 0},
        "version": "test"
    }))
}

fn authorized(h: &HeaderMap) -> bool {
    h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("Bearer "))
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, Json(json!({"error": {"type": "unauthorized", "code": "unauthorized"}}))).into_response()
}

async fn list_conversations(State(state): State<Arc<ServerState>>, h: HeaderMap) -> Response {
    if !authorized(&h) {
        return unauthorized();
    }
    if state.refuse_lists.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok() {
        let envelope = json!({"error": {"type": "service_unavailable", "code": "load_shed", "message": "busy",
                                        "recovery": {"retryable": true, "retry_after_seconds": 1}}});
        return (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], Json(envelope)).into_response();
    }
    let items: Vec<_> = (1..=5)
        .map(|i| {
            json!({"id": format!("00000000-0000-0000-0000-00000000000{i}"), "inbox_id": "i", "contact_id": "c",
                        "contact_name": "Ann", "assignee_id": null, "status": "open",
                        "last_activity_at": "2025-01-01T00:00:00Z", "last_message_preview": "hi"})
        })
        .collect();
    Json(json!({"items": items, "next_cursor": null})).into_response()
}

async fn get_conversation(h: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&h) {
        return unauthorized();
    }
    Json(json!({"id": id, "status": "open"})).into_response()
}

async fn patch_conversation(h: HeaderMap, Path(id): Path<String>, Json(b): Json<serde_json::Value>) -> Response {
    if !authorized(&h) {
        return unauthorized();
    }
    Json(json!({"id": id, "status": b["status"]})).into_response()
}

async fn list_messages(State(s): State<Arc<ServerState>>, h: HeaderMap) -> Response {
    if !authorized(&h) {
        return unauthorized();
    }
    if s.break_messages.load(Ordering::Relaxed) {
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": {"code": "internal"}}))).into_response();
    }
    Json(json!({"items": [{"id": "m1", "body": "hello"}], "next_cursor": null})).into_response()
}

async fn post_message(h: HeaderMap, Path(id): Path<String>, Json(b): Json<serde_json::Value>) -> Response {
    if !authorized(&h) {
        return unauthorized();
    }
    (StatusCode::CREATED, Json(json!({"id": "m2", "conversation_id": id, "body": b["body"]}))).into_response()
}

/// `POST /echo` only (a GET is 405): 201 with the JSON body's `body`, 422 when it has none.
async fn echo(Json(b): Json<serde_json::Value>) -> Response {
    match b["body"].as_str() {
        Some(text) => (StatusCode::CREATED, Json(json!({"body": text}))).into_response(),
        None => StatusCode::UNPROCESSABLE_ENTITY.into_response(),
    }
}

async fn list_contacts(h: HeaderMap) -> Response {
    if !authorized(&h) {
        return unauthorized();
    }
    Json(json!({"items": [{"id": "c1", "name": "Ann"}], "next_cursor": null})).into_response()
}
