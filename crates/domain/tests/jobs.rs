//! The queue's SQL against a real PostgreSQL: unique keys, SKIP LOCKED claims, fencing,
//! failures and backoff, rescue of expired leases, release, pruning and stats.
#![allow(clippy::unwrap_used)]

use breakwater_domain::jobs::{self, JobState, NewJob, kind};
use breakwater_domain::{Pool, tenants};
use serde_json::json;

fn noop() -> NewJob {
    NewJob::new(kind::NOOP, json!({}))
}

fn kinds() -> Vec<String> {
    vec![kind::NOOP.to_owned(), kind::ERASE_CONTACT.to_owned()]
}

async fn enqueue(pool: &Pool, job: NewJob) -> uuid::Uuid {
    let mut conn = pool.acquire().await.unwrap();
    jobs::enqueue(&mut conn, job).await.unwrap()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_unique_key_allows_one_live_job(pool: Pool) {
    let tenant = tenants::create_tenant(&pool, "Acme").await.unwrap();
    let contact = uuid::Uuid::now_v7();
    let first = enqueue(&pool, NewJob::erase_contact(tenant, contact)).await;
    assert_eq!(enqueue(&pool, NewJob::erase_contact(tenant, contact)).await, first, "ready: same job");

    let claimed = jobs::claim(&pool, "w1", &kinds(), 10, 30.0).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(enqueue(&pool, NewJob::erase_contact(tenant, contact)).await, first, "running: same job");

    assert!(jobs::complete(&pool, "w1", claimed[0].lease()).await.unwrap());
    let second = enqueue(&pool, NewJob::erase_contact(tenant, contact)).await;
    assert_ne!(second, first, "once finished, the key is free again");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn concurrent_enqueues_of_one_key_make_one_job(pool: Pool) {
    let tenant = tenants::create_tenant(&pool, "Acme").await.unwrap();
    let contact = uuid::Uuid::now_v7();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let id = jobs::enqueue(&mut tx, NewJob::erase_contact(tenant, contact)).await.unwrap();
            tx.commit().await.unwrap();
            id
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap());
    }
    assert_eq!(ids.len(), 1);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn concurrent_claims_never_share_a_job(pool: Pool) {
    let mut conn = pool.acquire().await.unwrap();
    let payloads: Vec<_> = (0..200).map(|i| json!({ "n": i })).collect();
    assert_eq!(jobs::enqueue_many(&mut conn, kind::NOOP, &payloads).await.unwrap(), 200);
    drop(conn);
    let mut tasks = Vec::new();
    for w in 0..8 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = jobs::claim(&pool, &format!("w{w}"), &kinds(), 7, 30.0).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|j| j.id));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (200, 200));
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn claims_honour_priority_run_at_and_kinds(pool: Pool) {
    let later =
        enqueue(&pool, NewJob { run_at: Some(chrono::Utc::now() + chrono::Duration::hours(1)), ..noop() }).await;
    let low = enqueue(&pool, noop()).await;
    let high = enqueue(&pool, NewJob { priority: 5, ..noop() }).await;
    let other = enqueue(&pool, NewJob::new(kind::DELIVER_MESSAGE, json!({}))).await;
    let got: Vec<_> = jobs::claim(&pool, "w", &kinds(), 10, 30.0).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(got, vec![high, low]);
    assert_eq!(jobs::get(&pool, later).await.unwrap().unwrap().state, JobState::Ready);
    assert_eq!(jobs::get(&pool, other).await.unwrap().unwrap().state, JobState::Ready, "a kind not asked for");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_update_is_fenced_by_owner_and_attempt(pool: Pool) {
    enqueue(&pool, noop()).await;
    let job = jobs::claim(&pool, "w1", &kinds(), 1, 30.0).await.unwrap().remove(0);
    let stale = jobs::Lease { id: job.id, attempt: job.attempts - 1 };
    assert!(!jobs::complete(&pool, "w2", job.lease()).await.unwrap(), "another owner");
    assert!(!jobs::complete(&pool, "w1", stale).await.unwrap(), "an earlier attempt");
    assert_eq!(jobs::fail(&pool, "w2", job.lease(), "x", 0.0, false).await.unwrap(), None);
    assert!(jobs::heartbeat(&pool, "w2", &[job.lease()], 30.0).await.unwrap().is_empty());
    assert_eq!(jobs::heartbeat(&pool, "w1", &[job.lease()], 30.0).await.unwrap(), vec![job.id]);
    assert!(jobs::complete(&pool, "w1", job.lease()).await.unwrap());
    let done = jobs::get(&pool, job.id).await.unwrap().unwrap();
    assert_eq!((done.state, done.lease_owner), (JobState::Completed, None));
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn failures_back_off_then_go_dead_keeping_the_last_error(pool: Pool) {
    let id = enqueue(&pool, NewJob { max_attempts: 2, ..noop() }).await;
    let job = jobs::claim(&pool, "w", &kinds(), 1, 30.0).await.unwrap().remove(0);
    assert_eq!(jobs::fail(&pool, "w", job.lease(), "boom 1", 3600.0, false).await.unwrap(), Some(JobState::Ready));
    let waiting = jobs::get(&pool, id).await.unwrap().unwrap();
    assert!(waiting.run_at > chrono::Utc::now() + chrono::Duration::minutes(59), "backs off");
    assert!(jobs::claim(&pool, "w", &kinds(), 1, 30.0).await.unwrap().is_empty(), "not due yet");
    let s = jobs::stats(&pool).await.unwrap();
    assert_eq!((s.ready, s.scheduled, s.retrying), (0, 1, 1));

    let id2 = enqueue(&pool, NewJob { max_attempts: 2, ..noop() }).await;
    let job = jobs::claim(&pool, "w", &kinds(), 1, 30.0).await.unwrap().remove(0);
    assert_eq!(job.id, id2);
    assert_eq!(jobs::fail(&pool, "w", job.lease(), "bad request", 0.0, true).await.unwrap(), Some(JobState::Dead));
    let dead = jobs::get(&pool, id2).await.unwrap().unwrap();
    assert_eq!((dead.state, dead.attempts, dead.last_error.as_deref()), (JobState::Dead, 1, Some("bad request")));
    assert_eq!(jobs::stats(&pool).await.unwrap().dead, 1);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn expired_leases_are_rescued_and_spent_ones_go_dead(pool: Pool) {
    let a = enqueue(&pool, noop()).await;
    let b = enqueue(&pool, NewJob { max_attempts: 1, ..noop() }).await;
    let claimed = jobs::claim(&pool, "ghost", &kinds(), 2, 0.05).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(jobs::rescue(&pool, 100).await.unwrap(), jobs::Rescued::default(), "leases still valid");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(jobs::stats(&pool).await.unwrap().running_lease_expired, 2);

    let rescued = jobs::rescue(&pool, 100).await.unwrap();
    assert_eq!((rescued.requeued, rescued.dead), (1, 1));
    let a = jobs::get(&pool, a).await.unwrap().unwrap();
    assert_eq!((a.state, a.attempts, a.lease_owner), (JobState::Ready, 1, None));
    assert!(a.last_error.unwrap().contains("lease of ghost expired"));
    assert_eq!(jobs::get(&pool, b).await.unwrap().unwrap().state, JobState::Dead);
    // The dead worker can no longer complete what it held.
    assert!(!jobs::complete(&pool, "ghost", claimed[0].lease()).await.unwrap());
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn release_returns_jobs_due_now_without_counting_the_attempt(pool: Pool) {
    let id = enqueue(&pool, noop()).await;
    let job = jobs::claim(&pool, "w", &kinds(), 1, 30.0).await.unwrap().remove(0);
    assert_eq!(jobs::release(&pool, "w", &[job.lease()]).await.unwrap(), 1);
    let released = jobs::get(&pool, id).await.unwrap().unwrap();
    assert_eq!((released.state, released.attempts, released.lease_owner), (JobState::Ready, 0, None));
    assert_eq!(jobs::claim(&pool, "w2", &kinds(), 1, 30.0).await.unwrap().len(), 1, "due at once");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn prune_deletes_finished_jobs_after_their_retention(pool: Pool) {
    for _ in 0..3 {
        enqueue(&pool, noop()).await;
    }
    let claimed = jobs::claim(&pool, "w", &kinds(), 3, 30.0).await.unwrap();
    let leases: Vec<_> = claimed.iter().map(jobs::ClaimedJob::lease).collect();
    assert_eq!(jobs::complete_many(&pool, "w", &leases[..2]).await.unwrap(), 2);
    jobs::fail(&pool, "w", leases[2], "x", 0.0, true).await.unwrap();

    assert_eq!(jobs::prune(&pool, 3600.0, 3600.0, 100).await.unwrap(), 0, "within retention");
    assert_eq!(jobs::prune(&pool, 0.0, 3600.0, 100).await.unwrap(), 2, "completed ones");
    assert_eq!(jobs::prune(&pool, 0.0, 0.0, 100).await.unwrap(), 1, "then the dead one");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn stats_report_depth_age_throughput_and_latency(pool: Pool) {
    for _ in 0..3 {
        enqueue(&pool, noop()).await;
    }
    enqueue(&pool, NewJob::new(kind::DELIVER_MESSAGE, json!({}))).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let job = jobs::claim(&pool, "w", &kinds(), 1, 30.0).await.unwrap().remove(0);
    jobs::complete(&pool, "w", job.lease()).await.unwrap();
    jobs::claim(&pool, "w", &kinds(), 1, 30.0).await.unwrap();

    let s = jobs::stats(&pool).await.unwrap();
    assert_eq!((s.ready, s.running, s.dead, s.completed_in_window), (2, 1, 0, 1));
    assert!(s.oldest_ready_age_seconds.unwrap() >= 0.02);
    let latency = s.start_latency.unwrap();
    assert!(latency.p50_ms >= 20.0 && latency.max_ms >= latency.p50_ms);
    let noop = s.by_kind.iter().find(|k| k.kind == kind::NOOP).unwrap();
    assert_eq!((noop.ready, noop.running), (1, 1));
    assert!(serde_json::to_value(&s).unwrap().get("by_kind").is_some());
}
