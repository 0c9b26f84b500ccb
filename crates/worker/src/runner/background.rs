//! The worker's background tasks, started before the claim loop and stopped after it: the
//! completer (until the last job has finished), and the heartbeat, the listener and the
//! maintenance (until the interrupted jobs have been released).

use std::sync::Arc;
use std::time::Duration;

use breakwater_domain::jobs::{self, Lease};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Shared;
use super::counts::Counters;

/// Most leases marked completed in one statement.
const COMPLETE_BATCH: usize = 1_000;
/// Most expired leases rescued, or finished jobs pruned, per statement.
const MAINTENANCE_BATCH: i64 = 1_000;

/// Marks finished jobs completed, many per statement: whatever finished while the previous
/// statement ran goes in the next one, so batching adds no delay when the queue is quiet.
pub(super) async fn complete_loop(shared: Arc<Shared>, mut done: mpsc::UnboundedReceiver<Lease>) {
    let options = &shared.options;
    let mut batch = Vec::with_capacity(COMPLETE_BATCH);
    while done.recv_many(&mut batch, COMPLETE_BATCH).await > 0 {
        let mut wait = Duration::from_millis(50);
        let mut marked = None;
        for attempt in 1..=5 {
            match jobs::complete_many(&shared.pool, &options.owner, &batch).await {
                Ok(n) => {
                    Counters::add(&shared.counters.completed, n);
                    marked = Some(n);
                    break;
                }
                Err(e) if attempt < 5 => {
                    tracing::warn!(error = %e, "marking jobs completed failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => {
                    tracing::error!(error = %e, jobs = batch.len(), "marking jobs completed failed; they will be rescued and run again");
                }
            }
        }
        let mut held = shared.held();
        let mut still_held = 0_u64;
        for lease in batch.drain(..) {
            still_held += u64::from(held.remove(&lease.id).is_some());
        }
        // Jobs not marked had lost their lease; those the heartbeat had already dropped (and
        // counted) are not held any more, so they are not counted twice.
        if let Some(n) = marked {
            Counters::add(&shared.counters.lease_lost, still_held.saturating_sub(n));
        }
    }
}

/// Extends the leases of every held job; a job whose lease was lost is interrupted at once
/// (another worker may be running it already).
pub(super) async fn heartbeat_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let options = &shared.options;
    let mut tick = tokio::time::interval(options.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let leases = shared.leases();
        if leases.is_empty() {
            continue;
        }
        match jobs::heartbeat(&shared.pool, &options.owner, &leases, options.lease.as_secs_f64()).await {
            Ok(kept) => {
                if kept.len() == leases.len() {
                    continue;
                }
                let kept: std::collections::HashSet<Uuid> = kept.into_iter().collect();
                let mut held = shared.held();
                for lease in leases.iter().filter(|l| !kept.contains(&l.id)) {
                    // Only if it is still the same attempt (it may have completed meanwhile).
                    if held.get(&lease.id).is_some_and(|h| h.attempt == lease.attempt)
                        && let Some(lost) = held.remove(&lease.id)
                    {
                        lost.cancel.cancel();
                        Counters::add(&shared.counters.lease_lost, 1);
                        tracing::warn!(job = %lease.id, "lease lost; interrupting the job");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed; leases may expire"),
        }
    }
}

/// `LISTEN breakwater_jobs`: every notification wakes the claim loop. On a lost connection it
/// reconnects; polling covers the gap.
pub(super) async fn listen_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let mut wait = Duration::from_millis(100);
    while !stop.is_cancelled() {
        let connected = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&shared.pool).await?;
            listener.listen(jobs::NOTIFY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            () = stop.cancelled() => return,
            l = connected => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN failed; polling until it reconnects");
                    tokio::select! { () = stop.cancelled() => return, () = tokio::time::sleep(wait) => {} }
                    wait = (wait * 2).min(Duration::from_secs(10));
                    continue;
                }
            },
        };
        wait = Duration::from_millis(100);
        // Anything enqueued while we were not listening is found by this claim round.
        shared.wake.notify_one();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                n = listener.try_recv() => match n {
                    Ok(Some(_)) => shared.wake.notify_one(),
                    // The connection dropped; notifications may have been missed.
                    Ok(None) => shared.wake.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection lost");
                        break;
                    }
                },
            }
        }
    }
}

/// Deletes the idempotency keys older than their retention, a batch at a time.
async fn prune_idempotency_keys(shared: &Shared) {
    let retention = shared.options.idempotency_retention.as_secs_f64();
    loop {
        match breakwater_domain::messages::prune_idempotency_keys(&shared.pool, retention, MAINTENANCE_BATCH).await {
            Ok(n) => {
                Counters::add(&shared.counters.keys_pruned, n);
                #[allow(clippy::cast_sign_loss)] // a positive constant
                if n < MAINTENANCE_BATCH as u64 {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pruning idempotency keys failed");
                return;
            }
        }
    }
}

/// Deletes the live inbox's events past their retention: older than it, or past the newest
/// `stream_keep_per_tenant` of a tenant.
async fn prune_stream_events(shared: &Shared) {
    let o = &shared.options;
    match breakwater_domain::stream::prune(
        &shared.pool,
        o.stream_retention.as_secs_f64(),
        o.stream_keep_per_tenant,
        MAINTENANCE_BATCH,
    )
    .await
    {
        Ok(p) => Counters::add(&shared.counters.stream_events_pruned, p.by_age + p.by_count),
        Err(e) => tracing::warn!(error = %e, "pruning the stream's events failed"),
    }
}

/// Rescues expired leases often (a dead worker's jobs wait at most a lease plus this interval)
/// and prunes finished jobs, old idempotency keys and old stream events now and then. Every worker runs it; `SKIP LOCKED` keeps them apart.
pub(super) async fn maintenance_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let options = &shared.options;
    let mut rescue = tokio::time::interval(options.rescue_interval);
    let mut prune = tokio::time::interval(options.prune_interval);
    let mut keys = tokio::time::interval(options.prune_interval);
    rescue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    keys.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = rescue.tick() => loop {
                match jobs::rescue(&shared.pool, MAINTENANCE_BATCH).await {
                    Ok(r) => {
                        Counters::add(&shared.counters.rescued, r.requeued + r.dead);
                        if r.requeued + r.dead > 0 {
                            tracing::warn!(requeued = r.requeued, dead = r.dead, "rescued jobs whose lease expired");
                        }
                        if r.requeued > 0 {
                            shared.wake.notify_one();
                        }
                        #[allow(clippy::cast_sign_loss)] // a positive constant
                        if r.requeued + r.dead < MAINTENANCE_BATCH as u64 { break; }
                    }
                    Err(e) => { tracing::warn!(error = %e, "rescue failed"); break; }
                }
            },
            _ = prune.tick() => loop {
                match jobs::prune(
                    &shared.pool,
                    options.completed_retention.as_secs_f64(),
                    options.dead_retention.as_secs_f64(),
                    MAINTENANCE_BATCH,
                ).await {
                    Ok(n) => {
                        Counters::add(&shared.counters.pruned, n);
                        #[allow(clippy::cast_sign_loss)] // a positive constant
                        if n < MAINTENANCE_BATCH as u64 { break; }
                    }
                    Err(e) => { tracing::warn!(error = %e, "pruning failed"); break; }
                }
            },
            _ = keys.tick() => {
                prune_idempotency_keys(&shared).await;
                prune_stream_events(&shared).await;
            }
        }
    }
}
