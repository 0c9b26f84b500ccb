//! The worker's `/metrics` and `/health`: what became of each attempt, by kind, and the
//! process's totals, served while it runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use breakwater_domain::Pool;
use breakwater_domain::jobs::{self, NewJob};
use breakwater_domain::messages;
use breakwater_worker::Worker;
use common::{Receiver, fixture, options, start, wait_idle};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

/// `GET path` over HTTP/1.0: the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

/// The value of the sample `series` (its name and labels, exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_worker_publishes_each_attempts_outcome_by_kind_and_its_totals(pool: Pool) {
    // Three no-op jobs complete; two deliveries to a receiver that answers 422 go dead.
    let (rx, secret) = Receiver::start(Arc::new(|_| (StatusCode::UNPROCESSABLE_ENTITY, None)), Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    for i in 0..2 {
        messages::post(&pool, f.tenant, f.agent, f.conversations[0], &format!("hello {i}"), None, None).await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    for _ in 0..3 {
        jobs::enqueue(&mut tx, NewJob::new(jobs::kind::NOOP, serde_json::json!({}))).await.unwrap();
    }
    tx.commit().await.unwrap();

    let worker = Worker::new(pool.clone(), options(Duration::from_secs(5)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = CancellationToken::new();
    let server = tokio::spawn(breakwater_worker::metrics::serve(listener, worker.clone(), served.clone()));

    // Before it runs: healthy, its slots published, nothing held or claimed.
    let (code, body) = get(addr, "/health").await;
    assert_eq!(code, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((health["status"].as_str(), health["owner"].as_str()), (Some("ok"), Some(worker.owner())));
    let (code, before) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(sample(&before, "breakwater_worker_slots"), Some(8.0), "{before}");
    assert_eq!(sample(&before, "breakwater_worker_held"), Some(0.0), "{before}");
    assert_eq!(sample(&before, "breakwater_worker_claimed_total"), Some(0.0), "{before}");

    let (stop, run) = start(&worker);
    wait_idle(&pool, Duration::from_secs(10)).await;

    // While it still runs. A dead job's outcome is counted just after its failure is written,
    // so the scrape may come a moment before the last one.
    let mut m = String::new();
    for _ in 0..100 {
        m = get(addr, "/metrics").await.1;
        if sample(&m, r#"breakwater_worker_jobs_total{kind="deliver_message",outcome="dead"}"#) == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sample(&m, r#"breakwater_worker_jobs_total{kind="noop",outcome="completed"}"#), Some(3.0), "{m}");
    assert_eq!(sample(&m, r#"breakwater_worker_jobs_total{kind="deliver_message",outcome="dead"}"#), Some(2.0), "{m}");
    assert_eq!(sample(&m, r#"breakwater_worker_jobs_total{kind="deliver_message",outcome="completed"}"#), None, "{m}");
    assert_eq!(sample(&m, r#"breakwater_worker_due_to_claim_seconds_count{kind="noop"}"#), Some(3.0), "{m}");
    assert_eq!(sample(&m, r#"breakwater_worker_claim_to_start_seconds_count{kind="deliver_message"}"#), Some(2.0));
    assert_eq!(sample(&m, "breakwater_worker_claimed_total"), Some(5.0), "{m}");
    assert_eq!(sample(&m, "breakwater_worker_webhook_connections_opened_total").map(|n| n >= 1.0), Some(true), "{m}");
    assert!(m.contains("# TYPE breakwater_worker_jobs counter"), "{m}");

    stop.cancel();
    let counts = run.await.unwrap();
    assert_eq!((counts.claimed, counts.dead), (5, 2));
    // Served until told to stop, then the server ends cleanly.
    let (_, after) = get(addr, "/metrics").await;
    assert_eq!(sample(&after, "breakwater_worker_held"), Some(0.0), "{after}");
    served.cancel();
    server.await.unwrap().unwrap();
}

/// The worker's CloudWatch line as JSON, with its dimensions.
fn emf_line(publisher: &mut breakwater_worker::emf::Publisher) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&publisher.line().to_json()).unwrap();
    assert_eq!((v["Environment"].as_str(), v["Service"].as_str()), (Some("test"), Some("worker")), "{v}");
    assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Dimensions"], serde_json::json!([["Environment", "Service"]]));
    v
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_cloudwatch_line_counts_what_became_of_the_jobs_in_its_interval(pool: Pool) {
    // Three no-ops complete; one delivery is retried (503, Retry-After: 1 s), then goes dead (422).
    let script: common::Script = Arc::new(|n| match n {
        1 => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
        _ => (StatusCode::UNPROCESSABLE_ENTITY, None),
    });
    let (rx, secret) = Receiver::start(script, Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    messages::post(&pool, f.tenant, f.agent, f.conversations[0], "hello", None, None).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for _ in 0..3 {
        jobs::enqueue(&mut tx, NewJob::new(jobs::kind::NOOP, serde_json::json!({}))).await.unwrap();
    }
    tx.commit().await.unwrap();
    let worker = Worker::new(pool.clone(), options(Duration::from_secs(5)));
    let mut publisher = breakwater_worker::emf::Publisher::new("Breakwater", "test", worker.clone());
    let before = emf_line(&mut publisher);
    assert_eq!((before["JobsClaimed"].as_f64(), before["JobsHeld"].as_f64()), (Some(0.0), Some(0.0)), "{before}");

    let (stop, run) = start(&worker);
    // Completions are counted as the completer marks them, a moment after the attempt.
    for _ in 0..500 {
        let c = worker.counts();
        if (c.completed, c.retried, c.dead) == (3, 1, 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = emf_line(&mut publisher);
    let figures =
        |v: &serde_json::Value, names: &[&str]| -> Vec<Option<f64>> { names.iter().map(|n| v[n].as_f64()).collect() };
    let names = ["JobsClaimed", "JobsCompleted", "JobsRetried", "JobsDead", "JobsLeaseLost", "JobsReleased"];
    // The delivery was claimed twice: once per attempt.
    assert_eq!(
        figures(&during, &names),
        [Some(5.0), Some(3.0), Some(1.0), Some(1.0), Some(0.0), Some(0.0)],
        "{during}"
    );
    stop.cancel();
    run.await.unwrap();
    // The next interval holds only what happened in it.
    let after = emf_line(&mut publisher);
    assert_eq!(figures(&after, &names), [Some(0.0); 6], "{after}");
    assert_eq!(after["JobsHeld"].as_f64(), Some(0.0), "{after}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_last_cloudwatch_line_counts_the_jobs_released_at_shutdown_and_holds_none(pool: Pool) {
    // A receiver that takes 30 s: the delivery cannot finish within the shutdown budget.
    let (rx, secret) = Receiver::ok(Duration::from_secs(30)).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    messages::post(&pool, f.tenant, f.agent, f.conversations[0], "hello", None, None).await.unwrap();
    let mut opts = options(Duration::from_secs(10));
    opts.shutdown_budget = Duration::from_millis(300);
    let worker = Worker::new(pool.clone(), opts);
    let mut publisher = breakwater_worker::emf::Publisher::new("Breakwater", "test", worker.clone());
    let (stop, run) = start(&worker);
    for _ in 0..250 {
        if rx.snapshot().1 > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let running = emf_line(&mut publisher);
    assert_eq!((running["JobsClaimed"].as_f64(), running["JobsHeld"].as_f64()), (Some(1.0), Some(1.0)), "{running}");
    stop.cancel();
    assert_eq!(run.await.unwrap().released, 1);
    let last = emf_line(&mut publisher);
    assert_eq!((last["JobsReleased"].as_f64(), last["JobsHeld"].as_f64()), (Some(1.0), Some(0.0)), "{last}");
    assert_eq!(last["JobsCompleted"].as_f64(), Some(0.0), "{last}");
}
