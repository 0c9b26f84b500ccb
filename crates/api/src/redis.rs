//! The connection to Redis. Redis backs the shared throttles; the API serves without it.
//!
//! One Redis (`REDIS_URL`), or a Redis Cluster (`REDIS_CLUSTER=true`: `REDIS_URL` is then one
//! or more seed nodes, comma-separated, such as ElastiCache's configuration endpoint with
//! cluster mode on). The throttles' keys are hash-tagged per tenant, so a tenant's buckets live
//! in one slot and the cluster spreads tenants over its shards.
//!
//! One multiplexed connection per process (per shard on a cluster; readiness has one of its own,
//! `ops_listener::Probes`), shared by every request:
//! calls that overlap are pipelined on it, and a request costs its own commands and nothing else (a
//! pool's check-out costs a round trip of its own, `UNWATCH` + `PING`, measured in
//! docs/lab/history/2026-12-03-redis-one-connection.md). The `redis` crate's connection manager
//! reconnects it after a reset or a refused connection; a Redis that stops answering, or answers
//! with errors (a demoted primary's `READONLY`), is left behind by [`RedisPool::reset`], which the
//! throttles call when their circuit breaker opens, so the breaker's next probe connects afresh.
//! Connecting runs as a task of its own, so a caller that gives up at its budget does not cancel
//! it; it starts on first use, so start-up never waits for Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Connecting gives up after this long (the call that asked falls back; the next one retries).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// An answer that takes longer fails the call, so that a Redis that stopped answering is
/// noticed (the throttles' own per-call budget is far shorter).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The way to Redis: a client, and its one connection once made. Cheap to clone.
#[derive(Clone)]
pub struct RedisPool(Arc<Shared>);

struct Shared {
    target: Target,
    connection: Mutex<Option<RedisConnection>>,
    /// An attempt is under way (one at a time).
    connecting: AtomicBool,
    /// Woken when an attempt ends, made or not.
    attempted: tokio::sync::Notify,
}

enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

impl std::fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_cluster() { "RedisPool::Cluster" } else { "RedisPool::Single" })
    }
}

/// The shared connection (a clone: every clone is the same multiplexed connection).
#[derive(Clone)]
#[allow(missing_debug_implementations)] // the cluster connection is not `Debug`
pub enum RedisConnection {
    /// To one Redis, reconnected by the connection manager.
    Single(ConnectionManager),
    /// To a Redis Cluster: commands go to the shard that owns their keys.
    Cluster(ClusterConnection),
}

/// The client for `url`: one Redis, or with `cluster` the seed nodes of a Redis Cluster
/// (comma-separated). Nothing connects yet.
///
/// # Errors
/// When the URL does not parse.
pub fn pool(url: &str, cluster: bool) -> anyhow::Result<RedisPool> {
    let target = if cluster {
        let urls: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
        anyhow::ensure!(!urls.is_empty(), "REDIS_URL names no Redis Cluster node");
        Target::Cluster(
            redis::cluster::ClusterClientBuilder::new(urls)
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .build()?,
        )
    } else {
        Target::Single(redis::Client::open(url)?)
    };
    Ok(RedisPool(Arc::new(Shared {
        target,
        connection: Mutex::new(None),
        connecting: AtomicBool::new(false),
        attempted: tokio::sync::Notify::new(),
    })))
}

impl RedisPool {
    /// Whether this is a Redis Cluster.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self.0.target, Target::Cluster(_))
    }

    /// The connection; the first call (or the first after a [`reset`](Self::reset)) starts an
    /// attempt, which gives up after [`CONNECT_TIMEOUT`], and waits for it.
    ///
    /// # Errors
    /// When the attempt failed (Redis down, unreachable, too slow to answer).
    pub async fn get(&self) -> redis::RedisResult<RedisConnection> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let attempted = self.0.attempted.notified();
        tokio::pin!(attempted);
        attempted.as_mut().enable();
        // An attempt may have ended between the check above and the registration.
        if let Some(c) = self.current() {
            return Ok(c);
        }
        if !self.0.connecting.swap(true, Ordering::AcqRel) {
            let shared = Arc::clone(&self.0);
            tokio::spawn(async move {
                if let Ok(Ok(c)) = tokio::time::timeout(CONNECT_TIMEOUT, shared.target.connect()).await
                    && let Ok(mut slot) = shared.connection.lock()
                {
                    *slot = Some(c);
                }
                shared.connecting.store(false, Ordering::Release);
                shared.attempted.notify_waiters();
            });
        }
        attempted.await;
        self.current().ok_or_else(|| redis::RedisError::from((redis::ErrorKind::IoError, "no connection to Redis")))
    }

    /// Leaves the connection behind: the next [`get`](Self::get) connects afresh. For a Redis
    /// that stopped answering, which the connection itself may not notice for minutes.
    pub fn reset(&self) {
        if let Ok(mut slot) = self.0.connection.lock() {
            *slot = None;
        }
    }

    fn current(&self) -> Option<RedisConnection> {
        self.0.connection.lock().ok()?.clone()
    }
}

impl Target {
    async fn connect(&self) -> redis::RedisResult<RedisConnection> {
        match self {
            Self::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(CONNECT_TIMEOUT)
                    .set_response_timeout(RESPONSE_TIMEOUT)
                    .set_number_of_retries(2)
                    .set_max_delay(1_000);
                ConnectionManager::new_with_config(client.clone(), config).await.map(RedisConnection::Single)
            }
            Self::Cluster(client) => client.get_async_connection().await.map(RedisConnection::Cluster),
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// Whether Redis answers `PING` within `timeout`. When it does not, the connection is left
/// behind ([`RedisPool::reset`]), so the next ping connects afresh.
pub async fn ping(pool: &RedisPool, timeout: Duration) -> bool {
    let probe = async {
        let mut conn = pool.get().await.ok()?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
    };
    let answered = matches!(tokio::time::timeout(timeout, probe).await, Ok(Some(_)));
    if !answered {
        pool.reset();
    }
    answered
}
