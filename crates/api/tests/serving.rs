//! Connection handling: keep-alive outlives the header timeout, slow headers are cut off, and
//! shutdown drains in-flight requests with readiness off first.

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

    let status = app.call(reqwest::Method::GET, "/v1/ops/status", None, None).await;
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
    let mut blocker = pool.begin().await.expect("tx");
    sqlx::query("SELECT 1 FROM contacts WHERE id = $1 FOR UPDATE")
        .bind(ann)
        .execute(&mut *blocker)
        .await
        .expect("lock");
    let erase_url = app.url(&format!("/v1/contacts/{ann}"));
    let in_flight = tokio::spawn({
        let http = http.clone();
        let token = token.clone();
        async move { http.delete(erase_url).bearer_auth(token).send().await.map(|r| r.status()) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let ready_url = app.url("/ready");
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
