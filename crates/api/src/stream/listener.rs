//! The task's listener and sequencer, each on a connection of its own.
//!
//! - The sequencer polls every [`SEQUENCE_POLL`] for committed events without a number
//!   (`stream::pending`, one index-only look) and numbers them (`stream::sequence`); after a
//!   pass that numbered some, the next one numbers at once without the look. The tasks'
//!   sequencers take turns on an advisory lock, and one that finds the turn taken leaves the
//!   work to its holder. Writers do not wake it with a `NOTIFY`: that would serialise every
//!   writing transaction of the database on `NOTIFY`'s commit lock.
//! - The listener (`LISTEN breakwater_stream`): a notification `tenant:id` says the sequencer
//!   numbered the tenant's events up to `id`; the listener reads that tenant's events after the
//!   last id it passed, up to `id`, and hands them to the [`Hub`]. A tenant's ids become visible
//!   in order, so nothing is skipped.
//!
//! A notification lost with a dropped connection is made good on reconnecting: `LISTEN` first,
//! then every tenant's head (`stream_heads`), then the events between what was passed and the
//! head. So a listener that is cut off (a failover, `pg_terminate_backend`, a network drop)
//! delivers late but never loses an event.
//!
//! Neither connection is the request pool's (that pool is sized to the database bulkhead, which
//! assumes every connection is free for requests): each is a pool of one of its own, with the
//! application name `breakwater-stream`, to `STREAM_DATABASE_URL` when the requests go through a
//! transaction pooler (which cannot carry `LISTEN`), or to the requests' database.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use breakwater_domain::TenantId;
use breakwater_domain::stream::{self, CHANNEL};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use super::Hub;

/// The listener connection's `application_name`, as `pg_stat_activity` shows it.
pub const APPLICATION_NAME: &str = "breakwater-stream";

/// Events read per query while catching up.
const READ_BATCH: i64 = 500;

/// How often the sequencer looks for unnumbered events while there are some: half of it is the
/// mean delay it adds between a write's commit and its event. Each look that finds none doubles
/// the wait, up to [`SEQUENCE_POLL_IDLE`], so an idle task costs the database ten looks a second,
/// not a hundred.
pub const SEQUENCE_POLL: Duration = Duration::from_millis(10);

/// The longest wait between the sequencer's looks (an idle tenant's first event waits at most
/// this long for its number).
pub const SEQUENCE_POLL_IDLE: Duration = Duration::from_millis(100);

/// The wait before reconnecting after a failure, doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The listener's connection options: `url`'s, or the request pool's.
///
/// # Errors
/// When `url` does not parse.
pub fn connect_options(url: Option<&str>, requests: &sqlx::PgPool) -> Result<PgConnectOptions, sqlx::Error> {
    let options = match url {
        Some(url) => url.parse::<PgConnectOptions>()?,
        None => (*requests.connect_options()).clone(),
    };
    Ok(options.application_name(APPLICATION_NAME))
}

/// Runs the listener and the sequencer until `shutdown`, reconnecting after every failure.
pub async fn run(hub: Arc<Hub>, options: PgConnectOptions, shutdown: CancellationToken) {
    let one_connection = || {
        PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options.clone())
    };
    let sequencer = tokio::spawn(sequence(one_connection(), shutdown.clone()));
    let pool = one_connection();
    let mut passed: HashMap<TenantId, i64> = HashMap::new();
    let mut first_connect = true;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let outcome = tokio::select! {
            () = shutdown.cancelled() => break,
            outcome = listen(&hub, &pool, &mut passed, &mut first_connect, &mut backoff) => outcome,
        };
        hub.listener_connected(false);
        if let Err(err) = outcome {
            tracing::warn!(error = %err, retry_in_ms = backoff.as_millis(), "stream listener lost its connection");
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(super::jittered(backoff / 2)) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    pool.close().await;
    let _ = sequencer.await;
}

/// The sequencer's loop: a look every [`SEQUENCE_POLL`] to [`SEQUENCE_POLL_IDLE`], a numbering
/// when there is work.
async fn sequence(pool: sqlx::PgPool, shutdown: CancellationToken) {
    let mut wait = SEQUENCE_POLL;
    let mut failing = false;
    // The last pass numbered events: while writes keep coming, the next pass numbers at once
    // instead of looking first (the look would be a round trip that finds work anyway).
    let mut busy = false;
    // Held between looks (a check-out would cost a ping each); dropped after a failure.
    let mut held: Option<sqlx::pool::PoolConnection<sqlx::Postgres>> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
        let pass = async {
            let conn = match held.as_mut() {
                Some(conn) => conn,
                None => held.insert(pool.acquire().await?),
            };
            if !busy && !stream::pending(&mut **conn).await.map_err(into_sqlx)? {
                return Ok(false);
            }
            // Empty when nothing was left or another task's sequencer had the turn.
            let numbered = stream::sequence(&mut **conn).await.map_err(into_sqlx)?;
            Ok::<bool, sqlx::Error>(!numbered.is_empty())
        };
        let outcome = pass.await;
        busy = matches!(outcome, Ok(true));
        if outcome.is_err() {
            // Closed, not returned to the pool: a failure may have left it inside the
            // sequencer's transaction.
            if let Some(conn) = held.take() {
                drop(conn.detach());
            }
        }
        match outcome {
            Ok(numbered) => {
                failing = false;
                wait = if numbered { SEQUENCE_POLL } else { (wait * 2).min(SEQUENCE_POLL_IDLE) };
            }
            // Once per outage, not a hundred times a second.
            Err(err) if !failing => {
                failing = true;
                tracing::warn!(error = %err, "the stream's sequencer failed; retrying");
            }
            Err(_) => {}
        }
    }
    drop(held);
    pool.close().await;
}

/// One connection's life: listen, catch up, then follow notifications until it fails.
async fn listen(
    hub: &Hub,
    pool: &sqlx::PgPool,
    passed: &mut HashMap<TenantId, i64>,
    first_connect: &mut bool,
    backoff: &mut Duration,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(CHANNEL).await?;
    // Anything numbered from here on is notified; anything before is in the heads.
    let heads = stream::heads(&mut listener).await.map_err(into_sqlx)?;
    for (tenant, head) in heads {
        match passed.get(&tenant).copied() {
            Some(from) => deliver(hub, &mut listener, passed, tenant, from, head).await?,
            // The first connection: no stream is open yet (none opens before it), so each
            // tenant's streams start live from here.
            None if *first_connect => {
                passed.insert(tenant, head);
            }
            // A tenant whose first event came while the connection was down: all of its
            // events are new since the last heads were read.
            None => deliver(hub, &mut listener, passed, tenant, 0, head).await?,
        }
    }
    *first_connect = false;
    hub.listener_connected(true);
    *backoff = FIRST_BACKOFF;
    loop {
        let Some(first) = listener.try_recv().await? else {
            // The connection dropped (sqlx reconnects it, but what was notified meanwhile is
            // gone): start over, which catches up from the heads.
            return Ok(());
        };
        // Everything already buffered too, each tenant read once up to its newest id.
        let mut newest: HashMap<TenantId, i64> = HashMap::new();
        for n in std::iter::once(first).chain(std::iter::from_fn(|| listener.next_buffered())) {
            match stream::parse_notification(n.payload()) {
                Ok((tenant, id)) => {
                    let slot = newest.entry(tenant).or_insert(id);
                    *slot = (*slot).max(id);
                }
                Err(err) => tracing::warn!(error = %err, "ignored a notification"),
            }
        }
        for (tenant, id) in newest {
            // A tenant first seen now has had no event since the heads were read before this
            // one (those before are in the heads), so its sequence starts at 0 here.
            let from = passed.get(&tenant).copied().unwrap_or(0);
            deliver(hub, &mut listener, passed, tenant, from, id).await?;
        }
    }
}

/// Hands `tenant`'s events in `(from, through]` to the hub, if any stream of the tenant is open
/// here, and records `through` as passed.
async fn deliver(
    hub: &Hub,
    listener: &mut PgListener,
    passed: &mut HashMap<TenantId, i64>,
    tenant: TenantId,
    from: i64,
    through: i64,
) -> Result<(), sqlx::Error> {
    if through <= from {
        return Ok(());
    }
    let mut after = from;
    while hub.wants(tenant) && after < through {
        let events = stream::range(&mut *listener, tenant, after, through, READ_BATCH).await.map_err(into_sqlx)?;
        let Some(last) = events.last().map(|e| e.id) else { break };
        for e in events {
            hub.publish(e);
        }
        after = last;
    }
    passed.insert(tenant, through);
    Ok(())
}

fn into_sqlx(err: breakwater_domain::DomainError) -> sqlx::Error {
    match err {
        breakwater_domain::DomainError::Database(e) | breakwater_domain::DomainError::Unavailable(e) => e,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}
