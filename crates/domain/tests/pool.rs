//! The pool's ping policy against a real PostgreSQL: a connection that sat idle is checked
//! before use, one used a moment ago is not.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use breakwater_domain::DomainError;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions as _, Connection as _};

/// One connection, so every acquire gets the same one until it is replaced.
fn pool(ping_after_idle: Duration, opts: PgConnectOptions) -> sqlx::PgPool {
    breakwater_domain::pool_options(ping_after_idle).max_connections(1).connect_lazy_with(opts)
}

async fn backend(pool: &sqlx::PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(pool).await
}

/// Terminates `pid` from another connection and waits until it is gone.
async fn kill(opts: &PgConnectOptions, pid: i32) {
    let mut admin = opts.connect().await.unwrap();
    let done: bool =
        sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)").bind(pid).fetch_one(&mut admin).await.unwrap();
    assert!(done, "backend {pid} still there");
    admin.close().await.unwrap();
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_connection_killed_while_idle_is_replaced_before_use(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool(Duration::from_millis(50), opts.clone());
    let first = backend(&pool).await.unwrap();
    kill(&opts, first).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Idle past the window: pinged, found dead, replaced; the query never sees it.
    let second = backend(&pool).await.expect("a fresh connection");
    assert_ne!(second, first);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_connection_used_within_the_window_is_not_pinged(_: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool(Duration::from_secs(60), opts.clone());
    let first = backend(&pool).await.unwrap();
    kill(&opts, first).await;
    // Within the window the connection is handed out unchecked, so the query meets the dead
    // socket: this is the round trip the policy saves, and the risk it takes.
    let err = backend(&pool).await.expect_err("the dead connection was checked before use");
    // ... and fails it as the database being unavailable (the API's 503 `db_unavailable`).
    assert!(matches!(DomainError::from(err), DomainError::Unavailable(_)));
    // The failed connection is not reused: the next query gets a new one.
    let second = backend(&pool).await.expect("a fresh connection");
    assert_ne!(second, first);
}
