//! The Redis pool. Redis backs the shared throttles; the API serves without it.

use std::time::Duration;

/// A pool of Redis connections (deadpool-redis: the well-kept async pool for the `redis` crate).
pub type RedisPool = deadpool_redis::Pool;

/// Builds the pool. Connections are made on first use, so start-up never waits for Redis.
///
/// # Errors
/// When the URL does not parse.
pub fn pool(url: &str) -> anyhow::Result<RedisPool> {
    let mut cfg = deadpool_redis::Config::from_url(url);
    cfg.pool = Some(deadpool_redis::PoolConfig {
        max_size: 16,
        timeouts: deadpool_redis::Timeouts {
            wait: Some(Duration::from_millis(20)),
            create: Some(Duration::from_millis(200)),
            recycle: Some(Duration::from_millis(20)),
        },
        ..Default::default()
    });
    Ok(cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1))?)
}

/// Whether Redis answers `PING` within `timeout`.
pub async fn ping(pool: &RedisPool, timeout: Duration) -> bool {
    let probe = async {
        let mut conn = pool.get().await.ok()?;
        deadpool_redis::redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
    };
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Some(_)))
}
