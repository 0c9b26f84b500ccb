//! Test helpers: a chat fixture whose inbox has a webhook, a local webhook receiver that
//! records deliveries by idempotency key, and worker options for quick tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use breakwater_domain::contacts::{self, NewContact};
use breakwater_domain::conversations::{self, NewConversation};
use breakwater_domain::jobs;
use breakwater_domain::tenants::{self, Role};
use breakwater_domain::webhooks::{self, WebhookPolicy, WebhookUrl};
use breakwater_domain::{Pool, TenantId, UserId};
use breakwater_worker::{Backoff, ClientOptions, Counts, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Runs `worker` in a task until the returned token is cancelled; the task returns its counts.
pub fn start(worker: &Worker) -> (CancellationToken, tokio::task::JoinHandle<Counts>) {
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (worker, stop) = (worker.clone(), stop.clone());
        async move { worker.run(stop).await.unwrap() }
    });
    (stop, run)
}

/// Waits until no job is ready, scheduled or running, or `limit` has passed.
pub async fn wait_idle(pool: &Pool, limit: Duration) {
    let started = std::time::Instant::now();
    loop {
        let s = jobs::stats(pool).await.unwrap();
        if s.ready + s.scheduled + s.running == 0 || started.elapsed() > limit {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// What the receiver answers for the n-th request (1-based) carrying a key.
pub type Script = Arc<dyn Fn(u32) -> (StatusCode, Option<u64>) + Send + Sync>;

#[derive(Default)]
pub struct Log {
    /// Requests per idempotency key (every request, including duplicates).
    pub by_key: HashMap<String, u32>,
    /// Requests in total.
    pub requests: u64,
    /// Requests whose signature did not verify.
    pub bad_signatures: u64,
}

/// A local webhook receiver.
pub struct Receiver {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Log>>,
}

#[derive(Clone)]
struct ReceiverState {
    secret: Arc<Mutex<String>>,
    log: Arc<Mutex<Log>>,
    script: Script,
    delay: Duration,
}

impl Receiver {
    /// Starts a receiver that answers per `script` after `delay`.
    pub async fn start(script: Script, delay: Duration) -> (Self, Arc<Mutex<String>>) {
        let secret = Arc::new(Mutex::new(String::new()));
        let log = Arc::new(Mutex::new(Log::default()));
        let state = ReceiverState { secret: secret.clone(), log: log.clone(), script, delay };
        let app = Router::new().route("/hook", post(receive)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (Self { addr, log }, secret)
    }

    /// Answers 200 to everything after `delay`.
    pub async fn ok(delay: Duration) -> (Self, Arc<Mutex<String>>) {
        Self::start(Arc::new(|_| (StatusCode::OK, None)), delay).await
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn snapshot(&self) -> (HashMap<String, u32>, u64, u64) {
        let log = self.log.lock().unwrap();
        (log.by_key.clone(), log.requests, log.bad_signatures)
    }
}

async fn receive(State(state): State<ReceiverState>, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let key = headers.get(webhooks::IDEMPOTENCY_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let signature = headers.get(webhooks::SIGNATURE_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
    let secret = state.secret.lock().unwrap().clone();
    let valid = webhooks::verify(&secret, signature, &body, chrono::Utc::now().timestamp(), 300);
    let nth = {
        let mut log = state.log.lock().unwrap();
        log.requests += 1;
        if !valid {
            log.bad_signatures += 1;
        }
        let n = log.by_key.entry(key).or_default();
        *n += 1;
        *n
    };
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    let (status, retry_after) = (state.script)(nth);
    let mut headers = HeaderMap::new();
    if let Some(s) = retry_after {
        headers.insert("retry-after", s.to_string().parse().unwrap());
    }
    (status, headers)
}

/// A tenant with an agent, an inbox whose webhook is `url`, a contact and `conversations`
/// conversations.
pub struct Fixture {
    pub tenant: TenantId,
    pub agent: UserId,
    pub inbox: Uuid,
    pub conversations: Vec<Uuid>,
    pub secret: String,
}

pub fn local_policy() -> WebhookPolicy {
    WebhookPolicy::development().allow_private(true)
}

pub async fn fixture(pool: &Pool, url: &str, conversations: usize) -> Fixture {
    let tenant = tenants::create_tenant(pool, "Acme").await.unwrap();
    let agent = tenants::create_user(pool, tenant, "Ann", "ann@example.com", Role::Agent).await.unwrap();
    let hook = WebhookUrl::validate(url, &local_policy()).await.unwrap();
    let inbox = tenants::create_inbox(pool, tenant, "Support", "api", Some(&hook)).await.unwrap();
    let secret = tenants::webhook_secret(pool, tenant, inbox).await.unwrap().unwrap();
    let contact = contacts::create(pool, tenant, NewContact { name: "Carl".into(), email: None }).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..conversations {
        let c = conversations::create(pool, tenant, NewConversation::open(contact.id, inbox)).await.unwrap();
        ids.push(c.id);
    }
    Fixture { tenant, agent, inbox, conversations: ids, secret }
}

/// Worker options for tests: short lease, fast polling and backoff, local webhooks allowed.
pub fn options(lease: Duration) -> WorkerOptions {
    WorkerOptions {
        concurrency: 8,
        batch: 8,
        poll_interval: Duration::from_millis(200),
        shutdown_budget: Duration::from_secs(2),
        backoff: Backoff { base: Duration::from_millis(100), max: Duration::from_secs(2) },
        client: ClientOptions {
            policy: local_policy(),
            request_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
        ..WorkerOptions::default().with_lease(lease)
    }
}

/// The database URL of `pool` (the `#[sqlx::test]` database), for child processes.
pub fn database_url(pool: &Pool) -> String {
    let base = std::env::var("DATABASE_URL").unwrap();
    let db = pool.connect_options().get_database().unwrap().to_owned();
    let (prefix, _) = base.rsplit_once('/').unwrap();
    format!("{prefix}/{db}")
}
