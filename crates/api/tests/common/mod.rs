//! Test harness: the real app on a random port over a fresh database, and builders for data.
#![allow(dead_code, unreachable_pub)]

pub mod sse;

use std::time::Duration;

use breakwater_api::Running;
use breakwater_api::auth::{Claims, JwtKeys};
use breakwater_api::config::{Config, DEV_JWT_SECRET};
use breakwater_domain::tenants::{self, Role};
use breakwater_domain::{TenantId, UserId};
use reqwest::{Method, StatusCode};
use secrecy::SecretString;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

/// Locks these contacts' rows until the returned transaction ends (rolled back or dropped): a
/// request that writes one of them (an erasure) waits, holding its admission slot and its
/// database connection. How the tests make a request slow on purpose.
pub async fn lock_contacts(pool: &PgPool, ids: &[Uuid]) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.expect("tx");
    sqlx::query("SELECT 1 FROM contacts WHERE id = ANY($1) FOR UPDATE")
        .bind(ids)
        .execute(&mut *tx)
        .await
        .expect("lock");
    tx
}

/// Starts an erasure of `contact` in the background: with the contact's row locked
/// ([`lock_contacts`]), it waits holding its admission slot and its database connection.
pub fn erase_in_background(
    app: &TestApp,
    token: &str,
    contact: Uuid,
) -> tokio::task::JoinHandle<reqwest::Result<StatusCode>> {
    let req = app.http.delete(app.url(&format!("/v1/contacts/{contact}"))).bearer_auth(token);
    tokio::spawn(async move { req.send().await.map(|r| r.status()) })
}

/// The tenant and user throttles out of the way of a test that sends bursts from one user.
pub const WITHOUT_USER_AND_TENANT_THROTTLES: [&str; 8] = [
    "--throttle-user-rate",
    "100000",
    "--throttle-user-burst",
    "100000",
    "--throttle-tenant-rate",
    "100000",
    "--throttle-tenant-burst",
    "100000",
];

/// Static admission with one slot in the default class: one slow request fills it.
pub const ONE_STATIC_SLOT: [&str; 4] = ["--admission", "static", "--admission-static-limit", "1"];

/// A served app.
pub struct TestApp {
    pub base: String,
    /// The ops listener's base URL (`/ready`, `/metrics`, `/v1/ops/status`).
    pub ops_base: String,
    pub http: reqwest::Client,
    pub pool: PgPool,
    pub running: Running,
}

/// Starts the app on 127.0.0.1:0 with `extra` arguments over the defaults.
pub async fn spawn_with(pool: PgPool, extra: &[&str]) -> TestApp {
    // Every test process shares 127.0.0.1's IP bucket in the shared Redis: keep it out of the way
    // (the throttle tests set their own limits after these).
    let mut args = vec!["--bind-addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0", "--log-format", "pretty"];
    if !extra.contains(&"--app-env") {
        args.extend(["--app-env", "development"]);
    }
    // Slow CI machines: a generous Redis budget so the breaker does not open on scheduling noise.
    if !extra.contains(&"--throttle-redis-budget-ms") {
        args.extend(["--throttle-redis-budget-ms", "500"]);
    }
    // Each app gets its own Redis key space unless a test shares one on purpose.
    let prefix = format!("test-{}", Uuid::now_v7());
    if !extra.contains(&"--throttle-key-prefix") {
        args.extend(["--throttle-key-prefix", prefix.as_str()]);
    }
    if !extra.contains(&"--throttle-ip-rate") {
        args.extend(["--throttle-ip-rate", "100000", "--throttle-ip-burst", "100000"]);
    }
    args.extend_from_slice(extra);
    let config = Config::from_args(args).expect("config parses");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let running = breakwater_api::start_with_pool(config, pool.clone(), Some(listener)).await.expect("starts");
    // Streams open once the task's listener has connected (until then they are refused).
    let waited = std::time::Instant::now();
    while !running.state.streams.status().listener_connected && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let base = format!("http://{}", running.addr);
    let ops_base = format!("http://{}", running.ops_addr);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    TestApp { base, ops_base, http, pool, running }
}

pub async fn spawn(pool: PgPool) -> TestApp {
    spawn_with(pool, &[]).await
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Reply {
    /// The envelope's `error.code`.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("<no envelope>")
    }

    pub fn items(&self) -> &Vec<Value> {
        self.body["items"].as_array().expect("a list")
    }
}

impl TestApp {
    pub async fn call(&self, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> Reply {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        read(req.send().await.expect("request sent")).await
    }

    pub async fn get(&self, path: &str, token: &str) -> Reply {
        self.call(Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    pub async fn patch(&self, path: &str, token: &str, body: Value) -> Reply {
        self.call(Method::PATCH, path, Some(token), Some(body)).await
    }

    pub async fn delete(&self, path: &str, token: &str) -> Reply {
        self.call(Method::DELETE, path, Some(token), None).await
    }

    /// Sends a prepared request.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        read(req.send().await.expect("request sent")).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A URL on the ops listener.
    pub fn ops_url(&self, path: &str) -> String {
        format!("{}{path}", self.ops_base)
    }

    /// GETs a path of the ops listener.
    pub async fn ops(&self, path: &str) -> Reply {
        read(self.http.get(self.ops_url(path)).send().await.expect("request sent")).await
    }
}

pub async fn read(res: reqwest::Response) -> Reply {
    let status = res.status();
    let headers = res.headers().clone();
    let text = res.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, headers, body, text }
}

pub fn token_for(tenant: TenantId, user: UserId, role: Role) -> String {
    let keys = JwtKeys::new(&SecretString::from(DEV_JWT_SECRET));
    let exp = u64::try_from(chrono::Utc::now().timestamp()).expect("after 1970") + 3600;
    keys.mint(&Claims::new(tenant.0, user.0, role, exp)).expect("mint")
}

/// A tenant with an admin, an agent, two inboxes and their tokens.
pub struct Tenant {
    pub id: TenantId,
    pub admin: UserId,
    pub agent: UserId,
    pub inbox: Uuid,
    pub other_inbox: Uuid,
    pub token: String,
    pub agent_token: String,
}

pub async fn tenant(pool: &PgPool, name: &str) -> Tenant {
    let id = tenants::create_tenant(pool, name).await.expect("tenant");
    let admin = tenants::create_user(pool, id, "Ada Admin", "ada@example.com", Role::Admin).await.expect("admin");
    let agent = tenants::create_user(pool, id, "Alan Agent", "alan@example.com", Role::Agent).await.expect("agent");
    let inbox = tenants::create_inbox(pool, id, "Website", "web", None).await.expect("inbox");
    let other_inbox = tenants::create_inbox(pool, id, "Email", "email", None).await.expect("inbox");
    Tenant {
        id,
        admin,
        agent,
        inbox,
        other_inbox,
        token: token_for(id, admin, Role::Admin),
        agent_token: token_for(id, agent, Role::Agent),
    }
}

impl Tenant {
    pub async fn contact(&self, app: &TestApp, name: &str, email: &str) -> Uuid {
        let r = app.post("/v1/contacts", &self.token, json!({"name": name, "email": email})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        id_of(&r.body)
    }

    pub async fn conversation(&self, app: &TestApp, contact: Uuid) -> Uuid {
        let r =
            app.post("/v1/conversations", &self.token, json!({"contact_id": contact, "inbox_id": self.inbox})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        id_of(&r.body)
    }

    pub async fn message(&self, app: &TestApp, conversation: Uuid, body: &str) -> Uuid {
        let r =
            app.post(&format!("/v1/conversations/{conversation}/messages"), &self.token, json!({"body": body})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        id_of(&r.body)
    }
}

pub fn id_of(v: &Value) -> Uuid {
    v["id"].as_str().and_then(|s| s.parse().ok()).expect("an id")
}

/// Walks every page of a list, returning all items.
pub async fn walk(app: &TestApp, path: &str, token: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut next: Option<String> = None;
    loop {
        let url = match &next {
            Some(c) => format!("{path}{sep}cursor={c}"),
            None => path.to_owned(),
        };
        let r = app.get(&url, token).await;
        assert_eq!(r.status, StatusCode::OK, "{url}: {}", r.text);
        out.extend(r.items().iter().cloned());
        match r.body["next_cursor"].as_str() {
            Some(c) => next = Some(c.to_owned()),
            None => return out,
        }
    }
}
