//! Connection handling: keep-alive outlives the header timeout, slow headers are cut off,
//! shutdown drains in-flight requests with readiness off first, and the edge sheds connections
//! past the cap (canned 503, health still served, reset when refusals saturate, or the backlog)
//! and refuse a new connection's first request while too many are unanswered.

mod common;

use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

async fn get_health(stream: &mut TcpStream) -> std::io::Result<String> {
    stream.write_all(b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n").await?;
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn idle_keep_alive_outlives_the_header_timeout_and_slow_headers_do_not(pool: PgPool) {
    let app = common::spawn_with(
        pool,
        &["--header-read-timeout-secs", "1", "--keep-alive-timeout-secs", "3", "--request-timeout-secs", "2"],
    )
    .await;
    let addr = app.running.addr;

    // An idle keep-alive connection is reused after longer than the header timeout...
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    assert!(get_health(&mut conn).await.expect("first").starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(
        get_health(&mut conn).await.expect("reuse").starts_with("HTTP/1.1 200"),
        "closed before the keep-alive timeout"
    );

    // ...and closed by the server once idle past the keep-alive timeout.
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n =
        tokio::time::timeout(Duration::from_secs(6), conn.read(&mut buf)).await.expect("closed in time").unwrap_or(0);
    assert_eq!(n, 0, "expected EOF");
    assert!(started.elapsed() >= Duration::from_millis(2500), "closed too early: {:?}", started.elapsed());

    // A client trickling its headers is cut off at the header timeout.
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET /health HTTP/1.1\r\nho").await.expect("partial");
    let started = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf)).await.expect("cut in time").unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() < Duration::from_millis(2500), "slow headers held {:?}", started.elapsed());

    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["connections"]["header_read_timeout_seconds"], 1);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn shutdown_turns_readiness_off_then_drains_in_flight_requests(pool: PgPool) {
    let app = common::spawn(pool.clone()).await;
    let t = common::tenant(&pool, "Acme").await;
    let url = app.url("/v1/contacts");
    let token = t.token.clone();
    let http = app.http.clone();
    // A request that is in flight when shutdown begins: it holds a row lock so the handler waits.
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let blocker = common::lock_contacts(&pool, &[ann]).await;
    let erase_url = app.url(&format!("/v1/contacts/{ann}"));
    let in_flight = tokio::spawn({
        let http = http.clone();
        let token = token.clone();
        async move { http.delete(erase_url).bearer_auth(token).send().await.map(|r| r.status()) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let ready_url = app.ops_url("/ready");
    let state = app.running.state.clone();
    let shutdown = tokio::spawn(app.running.shutdown(Duration::from_millis(500)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(state.is_shutting_down());
    let r = http.get(&ready_url).send().await.expect("ready answers while draining");
    assert_eq!(r.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);

    // Release the lock: the in-flight request completes normally.
    tokio::time::sleep(Duration::from_millis(600)).await;
    blocker.rollback().await.expect("release");
    let status = in_flight.await.expect("task").expect("in-flight request got a response");
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    shutdown.await.expect("task").expect("clean shutdown");
    assert!(http.get(&url).send().await.is_err(), "listener still open after shutdown");
}

/// The balancer's probe does not wait for the request runtime: with that runtime stuck (here its
/// only thread, this test's, is blocked), `/ready` on the ops listener is answered from the ops
/// thread and its own connections, while `/health` on the public port waits for the runtime.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn readiness_answers_while_the_request_runtime_is_stuck(pool: PgPool) {
    let app = common::spawn(pool).await;
    // Opens readiness's own connections, as the balancer's first probe does.
    assert_eq!(app.ops("/ready").await.status, reqwest::StatusCode::OK);
    let get = |addr: std::net::SocketAddr, path: &'static str| {
        std::thread::spawn(move || {
            use std::io::{Read as _, Write as _};
            let mut conn = std::net::TcpStream::connect(addr).expect("connect");
            conn.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout set");
            conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").as_bytes())
                .expect("request written");
            let mut out = Vec::new();
            let _ = conn.read_to_end(&mut out);
            (String::from_utf8_lossy(&out).into_owned(), Instant::now())
        })
    };
    let ready = get(app.running.ops_addr, "/ready");
    let health = get(app.running.addr, "/health");
    std::thread::sleep(Duration::from_secs(2));
    let unblocked = Instant::now();
    let (ready, ready_at) = ready.join().expect("probe thread");
    let (health, health_at) =
        tokio::task::spawn_blocking(move || health.join().expect("probe thread")).await.expect("join");
    assert!(ready.starts_with("HTTP/1.1 200"), "/ready while the request runtime was stuck: {ready:?}");
    assert!(ready.contains(r#""database":"ok""#), "{ready}");
    assert!(ready_at < unblocked, "/ready waited for the request runtime");
    assert!(health.starts_with("HTTP/1.1 200"), "{health:?}");
    assert!(
        health_at >= unblocked,
        "the public /health answered while its runtime was blocked: the test blocked nothing"
    );
}

/// Sends one request on a new connection and reads until the server closes it (or `wait` passes).
async fn one_shot(addr: std::net::SocketAddr, request: &[u8], wait: Duration) -> std::io::Result<String> {
    let mut conn = TcpStream::connect(addr).await?;
    conn.write_all(request).await?;
    let mut out = Vec::new();
    match tokio::time::timeout(wait, conn.read_to_end(&mut out)).await {
        Ok(result) => result.map(|_| String::from_utf8_lossy(&out).into_owned()),
        Err(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
    }
}

/// Opens a connection and completes one keep-alive request on it, so it counts as open.
async fn held_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    assert!(get_health(&mut conn).await.expect("health").starts_with("HTTP/1.1 200"));
    conn
}

const INBOX: &[u8] = b"GET /v1/conversations HTTP/1.1\r\nhost: test\r\n\r\n";
const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n";

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn past_the_connection_cap_the_edge_answers_503_but_still_serves_health(pool: PgPool) {
    // Bound by the server itself (not the harness), so the backlog flag is exercised too.
    let config = breakwater_api::config::Config::from_args([
        "--app-env",
        "development",
        "--bind-addr",
        "127.0.0.1:0",
        "--ops-addr",
        "127.0.0.1:0",
        "--max-connections",
        "2",
        "--listen-backlog",
        "16",
        "--throttle-ip-rate",
        "100000",
        "--throttle-ip-burst",
        "100000",
    ])
    .expect("config");
    let running = breakwater_api::start_with_pool(config, pool, None).await.expect("starts");
    let addr = running.addr;
    let wait = Duration::from_secs(5);

    let first = held_connection(addr).await;
    let _second = held_connection(addr).await;
    assert_eq!(running.state.connections.open(), 2);

    // A third connection asking for tenant data: the canned envelope, then the server closes.
    let started = Instant::now();
    let refused = one_shot(addr, INBOX, wait).await.expect("a response, not a reset");
    assert!(started.elapsed() < Duration::from_secs(2), "refusal took {:?}", started.elapsed());
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    let lower = refused.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1\r\n") && lower.contains("connection: close\r\n"), "{refused}");
    let body: serde_json::Value =
        serde_json::from_str(refused.split("\r\n\r\n").nth(1).expect("a body")).expect("a JSON envelope");
    assert_eq!(body["error"]["code"], "load_shed");
    assert_eq!(body["error"]["recovery"]["retryable"], true);
    assert_eq!(running.state.connections.refused(), 1);

    // Health is served over the cap (one request, then the connection closes); ops status is on
    // the ops listener, which the public cap does not count.
    let health = one_shot(addr, HEALTH, wait).await.expect("health");
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
    let status = reqwest::get(format!("http://{}/v1/ops/status", running.ops_addr)).await.expect("ops");
    let status: serde_json::Value = status.json().await.expect("json");
    let published = &status["layers"]["connections"];
    assert_eq!(published["overflow"], "refuse");
    assert_eq!(published["refused"], 1);
    assert_eq!(published["listen_backlog"], 16);
    assert!(published["served_over_cap"].as_u64() >= Some(1), "{published}");
    // A path that only starts like a bypass path is not one.
    let sneaky = one_shot(addr, b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n", wait).await.expect("refused");
    assert!(sneaky.starts_with("HTTP/1.1 503 "), "{sneaky}");

    // Once a connection closes, a new one is served by the app again (401: no token).
    drop(first);
    let deadline = Instant::now() + wait;
    while running.state.connections.open() > 1 {
        assert!(Instant::now() < deadline, "the closed connection was not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let served = one_shot(addr, INBOX, Duration::from_millis(500)).await.expect("served");
    assert!(served.starts_with("HTTP/1.1 401 "), "{served}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn past_the_cap_with_refusals_saturated_connections_are_reset(pool: PgPool) {
    let app = common::spawn_with(pool, &["--max-connections", "1", "--max-refusing-connections", "0"]).await;
    let addr = app.running.addr;
    let _held = held_connection(addr).await;
    let started = Instant::now();
    let reply = one_shot(addr, HEALTH, Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(2), "reset took {:?}", started.elapsed());
    // A reset shows as an error or as an empty read, never as a response.
    assert!(reply.as_deref().map_or(true, str::is_empty), "{reply:?}");
    assert_eq!(app.running.state.connections.reset(), 1);
    assert_eq!(app.running.state.connections.refused(), 0);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn with_a_backlog_overflow_connections_past_the_cap_wait_for_a_free_slot(pool: PgPool) {
    let app = common::spawn_with(pool, &["--max-connections", "1", "--connection-overflow", "backlog"]).await;
    let addr = app.running.addr;
    let held = held_connection(addr).await;
    let waiting = tokio::spawn(one_shot(addr, HEALTH, Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!waiting.is_finished(), "answered while the cap was taken");
    drop(held);
    let reply = waiting.await.expect("task").expect("served once a slot frees");
    assert!(reply.starts_with("HTTP/1.1 200 "), "{reply}");
    assert_eq!(app.running.state.connections.refused() + app.running.state.connections.reset(), 0);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn once_draining_every_response_closes_its_connection(pool: PgPool) {
    let app = common::spawn(pool).await;
    let mut conn = TcpStream::connect(app.running.addr).await.expect("connect");
    let before = get_health(&mut conn).await.expect("before");
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    assert!(!before.to_ascii_lowercase().contains("connection: close"), "{before}");
    // Shutdown begins: readiness is off and the listener still open (the drain delay).
    app.running.state.shutting_down.store(true, std::sync::atomic::Ordering::Relaxed);
    let during = get_health(&mut conn).await.expect("during");
    assert!(during.starts_with("HTTP/1.1 200"), "{during}");
    assert!(during.to_ascii_lowercase().contains("connection: close"), "{during}");
    // The server closes the connection after that response instead of keeping it for reuse.
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await.expect("closed at once");
    assert!(matches!(n, Ok(0) | Err(_)), "the connection stayed open");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn past_the_accept_rate_new_connections_wait_and_are_then_served(pool: PgPool) {
    // 20 a second in bursts of 16: 40 connections at once take at least (40 - 16) / 20 = 1.2 s.
    let app = common::spawn_with(pool, &["--max-accept-rate", "20"]).await;
    let addr = app.running.addr;
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..40).map(|_| {
        one_shot(addr, b"GET /health HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n", Duration::from_secs(10))
    }))
    .await;
    let took = started.elapsed();
    for a in &answers {
        assert!(a.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 200")), "{a:?}");
    }
    assert!(took >= Duration::from_millis(1000), "40 connections accepted in {took:?}: not paced");

    let status = app.ops("/v1/ops/status").await;
    let connections = &status.body["layers"]["connections"];
    assert_eq!(connections["accept_rate"]["rate_per_sec"], 20.0);
    assert_eq!(connections["accept_rate"]["burst"], 16);
    assert!(connections["accept_paced"].as_u64().is_some_and(|n| n > 0), "{connections}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn an_accept_burst_lets_a_storm_in_at_once_and_paces_what_follows(pool: PgPool) {
    let app = common::spawn_with(pool, &["--max-accept-rate", "20", "--max-accept-burst", "40"]).await;
    let addr = app.running.addr;
    let health = b"GET /health HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n";
    let paced = || async {
        let status = app.ops("/v1/ops/status").await;
        status.body["layers"]["connections"]["accept_paced"].as_u64().expect("accept_paced")
    };
    // Thirty at once are within the burst: none waits for the rate.
    let answers =
        futures_util::future::join_all((0..30).map(|_| one_shot(addr, health, Duration::from_secs(10)))).await;
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 200"))), "{answers:?}");
    assert_eq!(paced().await, 0);
    // Thirty more at once go past it: the loop paces them, and serves them all.
    let answers =
        futures_util::future::join_all((0..30).map(|_| one_shot(addr, health, Duration::from_secs(10)))).await;
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 200"))), "{answers:?}");
    assert!(paced().await > 0, "not paced past the burst");
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["connections"]["accept_rate"]["burst"], 40);
}

/// Sends `request` on `conn` and reads one (small) response.
async fn ask(conn: &mut TcpStream, request: &[u8]) -> String {
    conn.write_all(request).await.expect("send");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("answered").expect("read");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Waits up to 5 s for `done`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn past_the_unanswered_cap_a_new_connection_is_refused_once_then_served_on_the_same_connection(pool: PgPool) {
    let app = common::spawn_with(pool, &["--max-unanswered-connections", "1", "--header-read-timeout-secs", "1"]).await;
    let addr = app.running.addr;
    let connections = &app.running.state.connections;

    // A connection that has sent nothing yet is unanswered.
    let silent = TcpStream::connect(addr).await.expect("connect");
    eventually("the silent connection counted", || connections.unanswered() == 1).await;

    // The next connection's first request is refused at once, with the envelope and a
    // Retry-After, and its connection kept...
    let mut behind = TcpStream::connect(addr).await.expect("connect");
    // A connection accepted behind counts too until its refusal is written, so that a storm's
    // accepted and unread connections keep the cap reached.
    eventually("the connection accepted behind counted", || connections.unanswered() == 2).await;
    let started = Instant::now();
    let refused = ask(&mut behind, INBOX).await;
    eventually("the refused connection released", || connections.unanswered() == 1).await;
    assert!(started.elapsed() < Duration::from_secs(1), "refusal took {:?}", started.elapsed());
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    let lower = refused.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1\r\n") && !lower.contains("connection: close"), "{refused}");
    let body: serde_json::Value =
        serde_json::from_str(refused.split("\r\n\r\n").nth(1).expect("a body")).expect("a JSON envelope");
    assert_eq!(body["error"]["code"], "load_shed");
    assert_eq!(body["error"]["recovery"]["retry_after_seconds"], 1);
    // ...so the client's next attempt on it, after its Retry-After (longer than the header-read
    // timeout, which the refused request must have stopped), reaches the app (401: no token).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let next = ask(&mut behind, INBOX).await;
    assert!(next.starts_with("HTTP/1.1 401 "), "{next}");
    assert_eq!(connections.refused_behind(), 1);

    // A probe on a new connection is served, even behind.
    let mut probe = TcpStream::connect(addr).await.expect("connect");
    let health = get_health(&mut probe).await.expect("health");
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
    assert_eq!(connections.refused_behind(), 1);

    // The silent connection stops counting after a second: a new connection is served at once.
    eventually("the silent connection released", || connections.unanswered() == 0).await;
    let mut later = TcpStream::connect(addr).await.expect("connect");
    let served = ask(&mut later, INBOX).await;
    assert!(served.starts_with("HTTP/1.1 401 "), "{served}");

    let status = app.ops("/v1/ops/status").await;
    let published = &status.body["layers"]["connections"];
    assert_eq!(published["max_unanswered"], 1);
    assert_eq!(published["refused_behind"], 1);
    drop(silent);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_connection_trickling_its_request_head_does_not_hold_the_unanswered_cap(pool: PgPool) {
    let app = common::spawn_with(pool, &["--max-unanswered-connections", "1", "--header-read-timeout-secs", "5"]).await;
    let addr = app.running.addr;
    let connections = &app.running.state.connections;

    // Silent, it counts (for up to a second)...
    let mut trickling = TcpStream::connect(addr).await.expect("connect");
    let connected = Instant::now();
    eventually("the connection counted", || connections.unanswered() == 1).await;
    // ...and once part of a head has arrived, it stops counting at once, well before that second.
    trickling.write_all(b"GET /health HTTP/1.1\r\nhost: test\r\nx-slow: a").await.expect("send");
    while connections.unanswered() != 0 {
        assert!(connected.elapsed() < Duration::from_millis(900), "the trickling connection still counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A new connection's first request is served, not refused behind it.
    let mut next = TcpStream::connect(addr).await.expect("connect");
    let served = ask(&mut next, INBOX).await;
    assert!(served.starts_with("HTTP/1.1 401 "), "{served}");
    assert_eq!(connections.refused_behind(), 0);
    // The trickling connection is still served once its head is complete.
    trickling.write_all(b"\r\n\r\n").await.expect("send");
    let mut buf = vec![0u8; 4096];
    let n =
        tokio::time::timeout(Duration::from_secs(5), trickling.read(&mut buf)).await.expect("answered").expect("read");
    let health = String::from_utf8_lossy(&buf[..n]);
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
}
