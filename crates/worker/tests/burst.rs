//! The field report's burst, with a worker killed: 80 concurrent claimers across five worker
//! processes' worth of workers (three real `breakwater-worker` child processes and two
//! in-process ones), three synchronized bursts of 240 messages whose deliveries go to a local
//! receiver that applies each idempotency key once, and one child process killed with SIGKILL
//! while it holds jobs. Every key arrives, none is applied twice, nothing is left ready or
//! running, and the run ends within the lease plus a small margin after the kill.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use breakwater_domain::jobs;
use breakwater_domain::{Pool, messages};
use breakwater_worker::Worker;
use common::{Receiver, database_url, fixture, options};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

const BURSTS: usize = 3;
const PER_BURST: usize = 240;
const LEASE: Duration = Duration::from_secs(2);
const CHILDREN: usize = 3;
const CHILD_CONCURRENCY: usize = 16; // 3 x 16 = 48 claimers in child processes
const IN_PROCESS: usize = 2;
const IN_PROCESS_CONCURRENCY: usize = 16; // + 2 x 16 = 80

fn spawn_child(url: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_breakwater-worker"))
        .env("DATABASE_URL", url)
        .env("DB_POOL_SIZE", "5")
        .env("WORKER_CONCURRENCY", CHILD_CONCURRENCY.to_string())
        .env("WORKER_BATCH", CHILD_CONCURRENCY.to_string())
        .env("WORKER_LEASE_MS", LEASE.as_millis().to_string())
        .env("WORKER_POLL_MS", "200")
        .env("WORKER_BACKOFF_BASE_MS", "100")
        .env("WORKER_SHUTDOWN_BUDGET_SECS", "2")
        .env("WEBHOOK_ALLOW_PRIVATE", "true")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn burst(pool: &Pool, f: &Arc<common::Fixture>, n: usize, round: usize) {
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (pool, f, barrier) = (pool.clone(), Arc::clone(f), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                let conv = f.conversations[i % f.conversations.len()];
                messages::post(&pool, f.tenant, f.agent, conv, &format!("burst {round} message {i}"), None, None)
                    .await
                    .unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Jobs currently leased to a process, by pid (child owners are `worker-<pid>-<suffix>`).
async fn running_of(pool: &Pool, pid: u32) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'running' AND lease_owner LIKE $1")
        .bind(format!("worker-{pid}-%"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn three_bursts_of_240_with_a_worker_killed_lose_and_duplicate_nothing(pool: Pool) {
    // Each delivery takes 250 ms at the receiver, so the killed worker is caught mid-delivery.
    let (rx, secret) = Receiver::ok(Duration::from_millis(250)).await;
    let f = Arc::new(fixture(&pool, &rx.url(), 24).await);
    *secret.lock().unwrap() = f.secret.clone();
    let url = database_url(&pool);
    let posting = sqlx::postgres::PgPoolOptions::new().max_connections(8).connect(&url).await.unwrap();
    let workers_pool = sqlx::postgres::PgPoolOptions::new().max_connections(10).connect(&url).await.unwrap();

    let mut children: Vec<_> = (0..CHILDREN).map(|_| spawn_child(&url)).collect();
    let stop = CancellationToken::new();
    let in_process: Vec<_> = (0..IN_PROCESS)
        .map(|_| {
            let mut o = options(LEASE);
            o.concurrency = IN_PROCESS_CONCURRENCY;
            o.batch = IN_PROCESS_CONCURRENCY;
            let worker = Worker::new(workers_pool.clone(), o);
            let stop = stop.clone();
            tokio::spawn(async move { worker.run(stop).await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await; // all listening

    let started = Instant::now();
    burst(&posting, &f, PER_BURST, 1).await;
    // Burst 2, and meanwhile kill the first child with SIGKILL once it holds several jobs
    // (or, failing that, any).
    let mut victim_child = children.remove(0);
    let victim = victim_child.id().unwrap();
    let killer = tokio::spawn({
        let pool = pool.clone();
        async move {
            let since = Instant::now();
            loop {
                let held = running_of(&pool, victim).await;
                if held >= 3 || (held >= 1 && since.elapsed() > Duration::from_secs(3)) {
                    break;
                }
                assert!(since.elapsed() < Duration::from_secs(15), "the victim never held a job");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            victim_child.start_kill().unwrap(); // SIGKILL: no release, no completion
            let killed_at = Instant::now();
            victim_child.wait().await.unwrap();
            // Its leases, orphaned until they expire: the only jobs that can be delivered twice.
            let orphaned = running_of(&pool, victim).await;
            (victim_child, killed_at, orphaned)
        }
    });
    burst(&posting, &f, PER_BURST, 2).await;
    let (killed, killed_at, orphaned) = killer.await.unwrap();
    assert!(orphaned > 0, "the victim was running jobs when killed");

    burst(&posting, &f, PER_BURST, 3).await;
    // From here on no job is added: what remains must finish within a lease (the victim's
    // orphans) plus a margin.
    let last_posted_at = Instant::now();

    // Wait for the queue to drain: the victim's jobs come back when their lease expires.
    let total = BURSTS * PER_BURST;
    let drained_at = loop {
        let s = jobs::stats(&pool).await.unwrap();
        if s.ready + s.scheduled + s.running == 0 {
            break Instant::now();
        }
        assert!(killed_at.elapsed() < Duration::from_secs(20), "queue did not drain: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Stop the survivors gracefully (SIGTERM for the children).
    stop.cancel();
    let mut completed_in_process = 0;
    for w in in_process {
        completed_in_process += w.await.unwrap().completed;
    }
    for child in &children {
        let pid = child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    }
    let mut completed_children = 0;
    for child in children {
        let out = child.wait_with_output().await.unwrap();
        assert!(out.status.success(), "a surviving worker exited badly: {:?}", out.status);
        let counts: breakwater_worker::Counts =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
        completed_children += counts.completed;
    }
    drop(killed);

    let (by_key, requests, bad_signatures) = rx.snapshot();
    let applied = by_key.len();
    let duplicates = requests - applied as u64;
    let s = jobs::stats(&pool).await.unwrap();
    println!(
        "burst: {total} jobs, {applied} keys applied, {duplicates} raw duplicate deliveries \
         (the victim held {orphaned} leases at SIGKILL), completed in-process {completed_in_process} + \
         children {completed_children}; drained {:?} after the kill and {:?} after the last enqueue, \
         {:?} in all",
        drained_at - killed_at,
        drained_at - last_posted_at,
        drained_at - started
    );

    assert_eq!(applied, total, "no key missing");
    assert!(by_key.values().all(|n| *n >= 1));
    assert!(
        duplicates <= u64::try_from(orphaned).unwrap(),
        "raw duplicates only from the killed worker's unfinished jobs"
    );
    assert_eq!(bad_signatures, 0);
    assert_eq!((s.ready, s.scheduled, s.running, s.dead), (0, 0, 0, 0), "nothing ready, running or dead");
    let completed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'completed'").fetch_one(&pool).await.unwrap();
    assert_eq!(usize::try_from(completed).unwrap(), total);
    let settled = drained_at - last_posted_at.max(killed_at);
    assert!(
        settled <= LEASE + Duration::from_secs(2),
        "finished within the lease plus a margin after the last enqueue and the kill: {settled:?}"
    );
}
