//! Hostile clients pay in their own time, never in shared resources: a body stalled on purpose
//! holds no admission slot and no database slot, and every other tenant is served meanwhile.

mod common;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Opens a connection and sends a request whose body declares `declared` bytes but carries only
/// `sent`: the headers and the first bytes arrive, the rest never does.
async fn stall(addr: std::net::SocketAddr, method: &str, path: &str, token: &str, sent: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{sent}"
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    stream
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_to_close(mut stream: TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut out)).await.expect("answered and closed in time").ok();
    String::from_utf8_lossy(&out).into_owned()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn stalled_bodies_hold_no_slot_and_every_other_tenant_is_served(pool: PgPool) {
    // Two database slots; the stalling agent opens ten times as many stalled writes.
    let app = common::spawn_with(pool.clone(), &["--db-pool-size", "2", "--body-read-timeout-ms", "1500"]).await;
    let attacker = common::tenant(&pool, "Attacker").await;
    let victim = common::tenant(&pool, "Victim").await;
    let ann = attacker.contact(&app, "Ann", "ann@example.com").await;
    let conv = attacker.conversation(&app, ann).await;
    let writes = [
        ("POST", "/v1/contacts".to_owned()),
        ("POST", "/v1/conversations".to_owned()),
        ("PATCH", format!("/v1/conversations/{conv}")),
        ("POST", format!("/v1/conversations/{conv}/messages")),
    ];
    let started = Instant::now();
    let mut stalled = Vec::new();
    for i in 0..20 {
        let (method, path) = &writes[i % writes.len()];
        stalled.push(stall(app.running.addr, method, path, &attacker.agent_token, "{\"bo").await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let status = app.ops("/v1/ops/status").await;
    let layers = &status.body["layers"];
    assert_eq!(layers["bulkhead"]["in_use"], 0, "a stalled body holds a database slot: {layers}");
    assert_eq!(layers["capacity"]["in_flight"], 0, "a stalled body holds an admission slot: {layers}");

    // Every other tenant is served, reads and writes, while the bodies stall.
    for i in 0..20 {
        let r = app.get("/v1/conversations?status=open", &victim.token).await;
        assert_eq!(r.status, StatusCode::OK, "read {i} during the stall: {}", r.text);
    }
    let r = app.post("/v1/contacts", &victim.token, json!({"name": "Vic"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "a write during the stall: {}", r.text);
    assert!(started.elapsed() < Duration::from_millis(1400), "the stall must still be on: {:?}", started.elapsed());

    // Each stalled request is answered 408 `body_timeout` at the read timeout, then closed.
    for stream in stalled {
        let answer = read_to_close(stream, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
        assert!(answer.to_lowercase().contains("connection: close"), "{answer}");
    }
    assert!(started.elapsed() >= Duration::from_millis(1500), "answered before the timeout: {:?}", started.elapsed());
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["body"]["timed_out"], 20, "{}", status.text);
    assert_eq!(status.body["layers"]["body"]["read_timeout_ms"], 1500);
    // Nothing held a database slot while its body stalled: a stalled write that had taken a slot
    // would have held it until its 408, at the read timeout.
    let bulkhead = &status.body["layers"]["bulkhead"];
    let longest = bulkhead["longest_hold_ms"].as_f64().expect("longest_hold_ms");
    assert!(
        longest < 1500.0,
        "a database slot was held for {longest} ms, as long as the body read timeout: {bulkhead}"
    );
    // Nothing the stalled requests carried was written.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM messages").fetch_one(&pool).await.expect("count");
    assert_eq!(n, 0);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_body_sent_slowly_within_the_timeout_is_served(pool: PgPool) {
    let app = common::spawn_with(pool.clone(), &["--body-read-timeout-ms", "2000"]).await;
    let t = common::tenant(&pool, "Acme").await;
    let body = json!({"name": "Slow but steady"}).to_string();
    let mut stream = TcpStream::connect(app.running.addr).await.expect("connect");
    let head = format!(
        "POST /v1/contacts HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        t.token,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    for chunk in body.as_bytes().chunks(8) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(chunk).await.expect("chunk");
    }
    let answer = read_to_close(stream, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_caller_back_before_its_retry_after_is_held_till_then_and_one_that_waits_is_not(pool: PgPool) {
    // One admission slot per class and no queue: while a slow request holds the default class's
    // slot, every other request of the class is refused at once (503 load_shed, Retry-After: 1).
    let app = common::spawn_with(
        pool.clone(),
        &["--admission", "static", "--admission-static-limit", "1", "--admission-queue", "0"],
    )
    .await;
    let t = common::tenant(&pool, "Acme").await;
    let other = common::tenant(&pool, "Other").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let blocker = common::lock_contacts(&pool, &[ann]).await;
    let slow = common::erase_in_background(&app, &t.token, ann);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let url = app.url(&format!("/v1/contacts/{ann}"));
    // One kept-alive connection per token: a caller is its identity on its connection.
    let client = |_: &str| reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client");
    let (ours, theirs, same_token_elsewhere) = (client("ours"), client("theirs"), client("elsewhere"));
    let timed = |c: &reqwest::Client, token: &str| {
        let req = c.get(&url).bearer_auth(token);
        async move {
            let started = Instant::now();
            let r = req.send().await.expect("sent");
            let retry_after = r.headers().get("retry-after").is_some();
            (r.status(), retry_after, started.elapsed())
        }
    };
    let (status, has_retry_after, took) = timed(&ours, &t.token).await;
    assert_eq!((status, has_retry_after), (StatusCode::SERVICE_UNAVAILABLE, true));
    assert!(took < Duration::from_millis(300), "a first refusal is answered at once: {took:?}");
    let refused_at = Instant::now();

    // Another caller is refused at once: it was told nothing yet; so is the same token on
    // another connection (another worker of the same client).
    let (status, _, took) = timed(&theirs, &other.token).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(took < Duration::from_millis(300), "another caller is not held: {took:?}");
    let (status, _, took) = timed(&same_token_elsewhere, &t.token).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(took < Duration::from_millis(300), "another connection of the token is not held: {took:?}");

    // Straight back, ignoring Retry-After: refused again, once the second has passed.
    let (status, _, took) = timed(&ours, &t.token).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(took >= Duration::from_millis(500), "an early caller's refusal is held: {took:?}");
    assert!(refused_at.elapsed() >= Duration::from_millis(950), "till the Retry-After: {:?}", refused_at.elapsed());
    assert!(took < Duration::from_millis(1500), "and no longer: {took:?}");

    // A caller that waits out its Retry-After, once there is room, is answered at once.
    drop(blocker);
    assert_eq!(slow.await.expect("joined").expect("sent"), StatusCode::ACCEPTED);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, took) = timed(&ours, &t.token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the contact is erased; the request was served");
    assert!(took < Duration::from_millis(300), "a caller that waited is not held: {took:?}");

    let status = app.ops("/v1/ops/status").await;
    let pacing = &status.body["layers"]["retry_pacing"];
    assert_eq!((pacing["early_total"].as_u64(), pacing["held_total"].as_u64()), (Some(1), Some(1)), "{}", status.text);
}

/// A caller on one kept-alive connection that sends its next request as soon as it has an answer.
struct Spinner {
    client: reqwest::Client,
    url: String,
    token: String,
}

impl Spinner {
    fn new(app: &common::TestApp, token: &str) -> Self {
        let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client");
        Self { client, url: app.url("/v1/conversations?status=open"), token: token.to_owned() }
    }

    /// The answer's status and `Retry-After`, and how long it took.
    async fn get(&self) -> (StatusCode, Option<String>, Duration) {
        let started = Instant::now();
        let r = self.client.get(&self.url).bearer_auth(&self.token).send().await.expect("sent");
        let retry = r.headers().get("retry-after").map(|v| v.to_str().expect("ascii").to_owned());
        (r.status(), retry, started.elapsed())
    }
}

/// A 429 made inside an admitted request still carries its admission slot and is never held. Once
/// the bucket is known to refuse, the throttles answer before admission with a 429 that holds
/// nothing, and that one is held like admission's own refusals for a caller that spins on it.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_throttle_refusal_is_held_only_when_it_holds_nothing(pool: PgPool) {
    let app = common::spawn_with(pool.clone(), &["--throttle-user-rate", "1", "--throttle-user-burst", "1"]).await;
    let t = common::tenant(&pool, "Acme").await;
    let spinner = Spinner::new(&app, &t.token);
    assert_eq!(spinner.get().await.0, StatusCode::OK, "the burst");
    let (status, _, took) = spinner.get().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "from Redis, inside the admitted request");
    assert!(took < Duration::from_millis(300), "a 429 holding a slot is not held: {took:?}");
    let (status, _, took) = spinner.get().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "answered ahead of admission");
    assert!(took < Duration::from_millis(300), "the pacer had told this caller nothing yet: {took:?}");
    let (status, _, took) = spinner.get().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(took >= Duration::from_millis(500), "straight back: held till its Retry-After: {took:?}");
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["retry_pacing"]["held_total"], 1, "{}", status.text);
    assert_eq!(status.body["layers"]["throttles"]["refused_ahead"], 2, "{}", status.text);
}

/// A bucket of four a second admits again within 250 ms, but its 429 says `Retry-After: 1`, and a
/// caller straight back is held until the second it was told, not until the bucket's next token:
/// held only till the token, 64 callers spinning on a tenant's 225/s plan got a 429 every few
/// milliseconds each, thousands a second, with the header saying a whole second.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn an_early_caller_is_held_as_long_as_its_retry_after_says_not_till_the_bucket_refills(pool: PgPool) {
    let app = common::spawn_with(pool.clone(), &["--throttle-user-rate", "4", "--throttle-user-burst", "1"]).await;
    let t = common::tenant(&pool, "Acme").await;
    let spinner = Spinner::new(&app, &t.token);
    assert_eq!(spinner.get().await.0, StatusCode::OK, "the burst");
    assert_eq!(spinner.get().await.0, StatusCode::TOO_MANY_REQUESTS, "from Redis, inside the admitted request");
    let (status, retry, _) = spinner.get().await;
    assert_eq!((status, retry.as_deref()), (StatusCode::TOO_MANY_REQUESTS, Some("1")), "answered ahead");
    let (status, _, took) = spinner.get().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "straight back, within the bucket's 250 ms");
    assert!(took >= Duration::from_millis(700), "held till the second it was told, not 250 ms: {took:?}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_client_that_stops_reading_is_cut_off_at_the_write_stall_timeout(pool: PgPool) {
    let app = common::spawn_with(pool.clone(), &["--write-stall-timeout-secs", "1"]).await;
    let t = common::tenant(&pool, "Acme").await;
    let other = common::tenant(&pool, "Other").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let conv = t.conversation(&app, ann).await;
    let body = "x".repeat(10_000);
    for _ in 0..100 {
        t.message(&app, conv, &body).await;
    }
    // Eight pipelined requests for a page of 1 MB, on a socket that never reads: more than the
    // kernel buffers on both sides can hold (the sender's at most 4 MiB here), so the server's
    // writes stop making progress.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let mut stream = socket.connect(app.running.addr).await.expect("connect");
    let head = format!(
        "GET /v1/conversations/{conv}/messages?limit=100 HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {}\r\n\r\n",
        t.token
    );
    stream.write_all(head.repeat(8).as_bytes()).await.expect("requests");
    let started = Instant::now();
    let closed_after = loop {
        let s = app.ops("/v1/ops/status").await;
        if s.body["layers"]["connections"]["write_stalls"] == 1 {
            break started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never cut off: {}", s.body["layers"]["connections"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The stalled response held no database slot, and another tenant is served.
    let s = app.ops("/v1/ops/status").await;
    assert_eq!(s.body["layers"]["bulkhead"]["in_use"], 0, "{}", s.body["layers"]["bulkhead"]);
    assert_eq!(s.body["layers"]["connections"]["write_stall_timeout_seconds"], 1);
    assert_eq!(app.get("/v1/conversations", &other.token).await.status, StatusCode::OK);
    // The client, reading at last, gets part of what was asked and then the end of the connection.
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got)).await.expect("closed");
    assert!(got.len() < 8 * 1_000_000, "the whole of it arrived ({} bytes): nothing stalled", got.len());
    assert!(closed_after >= Duration::from_millis(900), "cut off before the timeout: {closed_after:?}");
}
