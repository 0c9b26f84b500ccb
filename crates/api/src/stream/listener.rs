//! The task's one listener: `LISTEN breakwater_stream` on a connection of its own, and the new
//! events of the tenants with a stream open here handed to the [`Hub`].
//!
//! A notification says `tenant:id`; the listener reads that tenant's events after the last id it
//! passed, up to `id`, on the same connection. Notifications arrive in commit order and a
//! tenant's ids commit in order, so nothing is skipped. A notification lost with a dropped
//! connection is made good on reconnecting: `LISTEN` first, then every tenant's head
//! (`stream_heads`), then the events between what was passed and the head. So a listener that
//! is cut off (a failover, `pg_terminate_backend`, a network drop) delivers late but never
//! loses an event.
//!
//! The connection is not the request pool's (that pool is sized to the database bulkhead, which
//! assumes every connection is free for requests): it is a pool of one of its own, with the
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

/// Runs the listener until `shutdown`, reconnecting after every failure.
pub async fn run(hub: Arc<Hub>, options: PgConnectOptions, shutdown: CancellationToken) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
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
    // Anything committed from here on is notified; anything before is in the heads.
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
