//! The worker against a real PostgreSQL and a local webhook receiver: delivery, retries with
//! backoff, dead-lettering, graceful release, heartbeats, LISTEN/NOTIFY wake-up and erasure.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use breakwater_domain::jobs::{self, JobState, NewJob};
use breakwater_domain::{Pool, contacts, messages};
use breakwater_worker::{Counts, Worker, WorkerOptions};
use common::{Receiver, fixture, options, start, wait_idle};
use uuid::Uuid;

/// Runs a worker until no job is ready or running (or `limit` passes), then stops it.
async fn drain(pool: &Pool, options: WorkerOptions, limit: Duration) -> Counts {
    let (stop, run) = start(&Worker::new(pool.clone(), options));
    wait_idle(pool, limit).await;
    stop.cancel();
    run.await.unwrap()
}

async fn post(pool: &Pool, f: &common::Fixture, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for i in 0..n {
        let conv = f.conversations[i % f.conversations.len()];
        let posted = messages::post(pool, f.tenant, f.agent, conv, &format!("hello {i}"), None, None).await.unwrap();
        ids.push(posted.message.id);
    }
    ids
}

async fn only_job(pool: &Pool) -> jobs::Job {
    let id = job_ids(pool).await;
    assert_eq!(id.len(), 1);
    jobs::get(pool, id[0]).await.unwrap().unwrap()
}

/// Every job of the test's database, oldest first (a test-only read).
async fn job_ids(pool: &Pool) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM jobs ORDER BY created_at").fetch_all(pool).await.unwrap()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn delivers_signed_messages_once_each_with_their_idempotency_key(pool: Pool) {
    let (rx, secret) = Receiver::ok(Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 2).await;
    *secret.lock().unwrap() = f.secret.clone();
    let ids = post(&pool, &f, 12).await;

    let counts = drain(&pool, options(Duration::from_secs(5)), Duration::from_secs(10)).await;

    let (by_key, requests, bad) = rx.snapshot();
    assert_eq!(requests, 12);
    assert_eq!(bad, 0, "every delivery is signed with the inbox's secret");
    for id in ids {
        assert_eq!(by_key.get(&id.to_string()), Some(&1), "message {id} delivered once under its id");
    }
    assert_eq!(counts.completed, 12);
    assert!(counts.client.reused > 0, "keep-alive connections are reused: {counts:?}");
    let s = jobs::stats(&pool).await.unwrap();
    assert_eq!((s.ready, s.running, s.dead, s.completed_in_window), (0, 0, 0, 12));
    assert!(s.start_latency.is_some());
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn server_errors_retry_with_backoff_honouring_retry_after(pool: Pool) {
    // 503 asking for 1 s, then 500, then 200.
    let script: common::Script = Arc::new(|n| match n {
        1 => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
        2 => (StatusCode::INTERNAL_SERVER_ERROR, None),
        _ => (StatusCode::OK, None),
    });
    let (rx, secret) = Receiver::start(script, Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    post(&pool, &f, 1).await;

    let started = Instant::now();
    let counts = drain(&pool, options(Duration::from_secs(5)), Duration::from_secs(10)).await;
    let elapsed = started.elapsed();

    let job = only_job(&pool).await;
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.attempts, 3);
    assert_eq!(counts.retried, 2);
    // Retry-After: 1 s, then at least half of the second nominal delay (200 ms).
    assert!(elapsed >= Duration::from_millis(1_100), "{elapsed:?}");
    assert!(job.last_error.unwrap().contains("500"));
    let (by_key, _, _) = rx.snapshot();
    assert_eq!(by_key.values().copied().collect::<Vec<_>>(), vec![3], "the same key on every attempt");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn client_errors_go_dead_at_once_and_keep_the_error(pool: Pool) {
    let (rx, secret) = Receiver::start(Arc::new(|_| (StatusCode::UNPROCESSABLE_ENTITY, None)), Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    post(&pool, &f, 1).await;

    let counts = drain(&pool, options(Duration::from_secs(5)), Duration::from_secs(10)).await;

    let job = only_job(&pool).await;
    assert_eq!((job.state, job.attempts, counts.dead), (JobState::Dead, 1, 1));
    assert_eq!(job.last_error.as_deref(), Some("webhook answered 422 Unprocessable Entity"));
    assert!(job.finished_at.is_some() && job.lease_owner.is_none());
    assert_eq!(jobs::stats(&pool).await.unwrap().dead, 1);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn failures_go_dead_after_max_attempts(pool: Pool) {
    let (rx, secret) = Receiver::start(Arc::new(|_| (StatusCode::BAD_GATEWAY, None)), Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    post(&pool, &f, 1).await;
    let mut opts = options(Duration::from_secs(5));
    opts.backoff.base = Duration::from_millis(5);
    opts.backoff.max = Duration::from_millis(20);
    opts.poll_interval = Duration::from_millis(10);

    let counts = drain(&pool, opts, Duration::from_secs(10)).await;

    let job = only_job(&pool).await;
    assert_eq!((job.state, job.attempts), (JobState::Dead, job.max_attempts));
    assert_eq!(counts.retried, u64::try_from(job.max_attempts - 1).unwrap());
    assert!(job.last_error.unwrap().contains("502"));
    assert_eq!(rx.snapshot().1, u64::try_from(job.max_attempts).unwrap());
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn shutdown_lets_short_jobs_finish_and_releases_the_rest(pool: Pool) {
    // A receiver that takes 30 s: the job cannot finish within the budget.
    let (rx, secret) = Receiver::ok(Duration::from_secs(30)).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    post(&pool, &f, 1).await;
    let mut conn = pool.acquire().await.unwrap();
    let quick = jobs::enqueue(&mut conn, NewJob::new(jobs::kind::NOOP, serde_json::json!({}))).await.unwrap();
    drop(conn);

    let mut opts = options(Duration::from_secs(10));
    opts.shutdown_budget = Duration::from_millis(300);
    let (stop, run) = start(&Worker::new(pool.clone(), opts));
    // Wait until the delivery is in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rx.snapshot().1 == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopping = Instant::now();
    stop.cancel();
    let counts = run.await.unwrap();

    assert!(stopping.elapsed() < Duration::from_secs(2), "the budget bounds shutdown: {:?}", stopping.elapsed());
    assert_eq!(counts.released, 1);
    assert_eq!(jobs::get(&pool, quick).await.unwrap().unwrap().state, JobState::Completed);
    let ids = job_ids(&pool).await;
    let released = jobs::get(&pool, ids[0]).await.unwrap().unwrap();
    assert_eq!(released.state, JobState::Ready);
    assert_eq!((released.lease_owner, released.lease_expires_at), (None, None));
    assert_eq!(released.attempts, 0, "the interrupted attempt is not counted");
    assert!(released.run_at <= chrono::Utc::now(), "due at once for the next worker");
    assert!(released.last_error.unwrap().contains("released"));
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn heartbeats_keep_a_long_job_leased(pool: Pool) {
    // The delivery takes 3x the lease: without heartbeats it would be rescued and run twice.
    let (rx, secret) = Receiver::ok(Duration::from_millis(1_500)).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    post(&pool, &f, 1).await;

    let counts = drain(&pool, options(Duration::from_millis(500)), Duration::from_secs(10)).await;

    let job = only_job(&pool).await;
    assert_eq!((job.state, job.attempts), (JobState::Completed, 1));
    assert_eq!((counts.lease_lost, counts.rescued), (0, 0));
    assert_eq!(rx.snapshot().1, 1);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_notification_wakes_an_idle_worker_before_its_poll(pool: Pool) {
    let (rx, secret) = Receiver::ok(Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    let mut opts = options(Duration::from_secs(5));
    opts.poll_interval = Duration::from_secs(60);
    let (stop, run) = start(&Worker::new(pool.clone(), opts));
    tokio::time::sleep(Duration::from_millis(500)).await; // idle, listening

    let posted = Instant::now();
    post(&pool, &f, 1).await;
    while rx.snapshot().1 == 0 && posted.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let latency = posted.elapsed();
    stop.cancel();
    run.await.unwrap();
    assert!(latency < Duration::from_secs(2), "woken by NOTIFY, not the 60 s poll: {latency:?}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn erasure_deletes_the_contacts_history_and_is_safe_twice(pool: Pool) {
    let (rx, secret) = Receiver::ok(Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 3).await;
    *secret.lock().unwrap() = f.secret.clone();
    post(&pool, &f, 9).await;
    drain(&pool, options(Duration::from_secs(5)), Duration::from_secs(10)).await;
    let contact = breakwater_domain::conversations::get(&pool, f.tenant, f.conversations[0]).await.unwrap().contact_id;

    let accepted = contacts::request_erasure(&pool, f.tenant, contact).await.unwrap();
    let mut opts = options(Duration::from_secs(5));
    opts.erase_batch = 2; // several batches
    drain(&pool, opts.clone(), Duration::from_secs(10)).await;
    assert_eq!(jobs::get(&pool, accepted.job_id).await.unwrap().unwrap().state, JobState::Completed);
    for conv in &f.conversations {
        assert!(breakwater_domain::conversations::get(&pool, f.tenant, *conv).await.is_err());
    }

    // Run again (a retry after a crash would): nothing left, still completes.
    let mut conn = pool.acquire().await.unwrap();
    let again = jobs::enqueue(&mut conn, NewJob::erase_contact(f.tenant, contact)).await.unwrap();
    drop(conn);
    drain(&pool, opts, Duration::from_secs(10)).await;
    assert_eq!(jobs::get(&pool, again).await.unwrap().unwrap().state, JobState::Completed);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn idempotency_keys_past_their_retention_are_pruned(pool: Pool) {
    let (rx, secret) = Receiver::ok(Duration::ZERO).await;
    let f = fixture(&pool, &rx.url(), 1).await;
    *secret.lock().unwrap() = f.secret.clone();
    for key in ["old-1", "old-2", "new"] {
        messages::post(&pool, f.tenant, f.agent, f.conversations[0], key, Some(key), None).await.unwrap();
    }
    sqlx::query("UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key LIKE 'old-%'")
        .execute(&pool)
        .await
        .unwrap();
    let mut o = options(Duration::from_secs(5));
    o.prune_interval = Duration::from_millis(100);
    o.idempotency_retention = Duration::from_secs(24 * 3600);
    let (stop, run) = start(&Worker::new(pool.clone(), o));
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT key FROM idempotency_keys ORDER BY key").fetch_all(&pool).await.unwrap();
        if keys.len() < 3 || Instant::now() > deadline {
            break keys;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.cancel();
    let counts = run.await.unwrap();
    assert_eq!(left, ["new"], "only the key inside its retention is kept");
    assert_eq!(counts.keys_pruned, 2);
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM messages").fetch_one(&pool).await.unwrap();
    assert_eq!(messages, 3, "pruning a key never deletes its message");
}
