//! The database itself rather than tenant data: whether it answers, and the server settings the
//! ops status publishes. The API's probes call these, so that no handler holds SQL.

use sqlx::Connection;

use crate::{Pool, Result};

/// Checks out a connection and pings it: readiness's test that PostgreSQL answers.
///
/// # Errors
/// When no connection can be had within the pool's acquire timeout, or the ping fails.
pub async fn ping(pool: &Pool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    conn.ping().await?;
    Ok(())
}

/// The server's `max_connections`: what every task's pool, listener and worker share.
///
/// # Errors
/// When the database cannot be reached.
pub async fn max_connections(pool: &Pool) -> Result<i32> {
    let n = sqlx::query_scalar!(r#"SELECT current_setting('max_connections')::int4 AS "n!""#).fetch_one(pool).await?;
    Ok(n)
}
