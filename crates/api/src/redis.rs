//! The Redis pool. Redis backs the shared throttles; the API serves without it.
//!
//! One Redis (`REDIS_URL`), or a Redis Cluster (`REDIS_CLUSTER=true`: `REDIS_URL` is then one
//! or more seed nodes, comma-separated, such as ElastiCache's configuration endpoint with
//! cluster mode on). The throttles' keys are hash-tagged per tenant, so a tenant's buckets live
//! in one slot and the cluster spreads tenants over its shards.

use std::time::Duration;

use deadpool_redis::redis::aio::ConnectionLike;
use deadpool_redis::redis::{self, Cmd, Pipeline, RedisFuture, Value};

/// A pool of connections to one Redis or to a Redis Cluster (deadpool-redis: the well-kept
/// async pool for the `redis` crate; its `cluster` feature for the cluster client).
#[derive(Clone)]
pub enum RedisPool {
    /// One Redis.
    Single(deadpool_redis::Pool),
    /// A Redis Cluster: commands go to the shard that owns their keys.
    Cluster(deadpool_redis::cluster::Pool),
}

impl std::fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_cluster() { "RedisPool::Cluster" } else { "RedisPool::Single" })
    }
}

/// A connection from a [`RedisPool`].
#[allow(missing_debug_implementations)] // the cluster connection is not `Debug`
pub enum RedisConnection {
    /// To one Redis.
    Single(deadpool_redis::Connection),
    /// To a Redis Cluster (multiplexed; clones share it).
    Cluster(deadpool_redis::cluster::Connection),
}

const TIMEOUTS: deadpool_redis::Timeouts = deadpool_redis::Timeouts {
    wait: Some(Duration::from_millis(20)),
    create: Some(Duration::from_millis(200)),
    recycle: Some(Duration::from_millis(20)),
};

/// Builds the pool: `url` is one Redis, or with `cluster` the seed nodes of a Redis Cluster
/// (comma-separated). Connections are made on first use, so start-up never waits for Redis.
///
/// # Errors
/// When the URL does not parse.
pub fn pool(url: &str, cluster: bool) -> anyhow::Result<RedisPool> {
    if cluster {
        let urls: Vec<String> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned).collect();
        anyhow::ensure!(!urls.is_empty(), "REDIS_URL names no Redis Cluster node");
        let mut cfg = deadpool_redis::cluster::Config::from_urls(urls);
        cfg.pool = Some(deadpool_redis::PoolConfig { max_size: 4, timeouts: TIMEOUTS, ..Default::default() });
        return Ok(RedisPool::Cluster(cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1))?));
    }
    let mut cfg = deadpool_redis::Config::from_url(url);
    cfg.pool = Some(deadpool_redis::PoolConfig { max_size: 16, timeouts: TIMEOUTS, ..Default::default() });
    Ok(RedisPool::Single(cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1))?))
}

impl RedisPool {
    /// Whether this is a Redis Cluster.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// A connection, within the pool's wait and create timeouts.
    ///
    /// # Errors
    /// When none can be had in time (Redis down, the pool exhausted).
    pub async fn get(&self) -> redis::RedisResult<RedisConnection> {
        let pool_error = |e: String| redis::RedisError::from((redis::ErrorKind::IoError, "pool", e));
        match self {
            Self::Single(p) => p.get().await.map(RedisConnection::Single).map_err(|e| pool_error(e.to_string())),
            Self::Cluster(p) => p.get().await.map(RedisConnection::Cluster).map_err(|e| pool_error(e.to_string())),
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

/// Whether Redis answers `PING` within `timeout` (a cluster: the node the client picks).
pub async fn ping(pool: &RedisPool, timeout: Duration) -> bool {
    let probe = async {
        let mut conn = pool.get().await.ok()?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
    };
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Some(_)))
}
