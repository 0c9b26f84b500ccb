//! Breakwater's chat domain: tenants, inboxes, contacts, conversations and their counts,
//! messages, the live inbox's events, jobs and webhooks.
//!
//! Architecture invariant: this crate knows nothing of HTTP, Redis or admission control. Every
//! query that reads or writes tenant data takes a [`TenantId`] and filters by it, so no caller
//! can read across tenants; an id of another tenant is indistinguishable from an unknown id.
//!
//! All SQL is static and checked at compile time by `sqlx::query!`/`query_as!` against the
//! committed `.sqlx/` data: one query per filter shape, never one assembled from flags.

pub mod contacts;
pub mod conversations;
pub mod counts;
pub mod cursor;
pub mod database;
mod error;
mod ids;
pub mod jobs;
pub mod messages;
pub mod stream;
pub mod tenants;
pub mod webhooks;

pub use cursor::Cursor;
pub use error::{DomainError, Result};
pub use ids::{TenantId, UserId, new_id};

/// The database every binary and tool uses when `DATABASE_URL` is not set: the local development
/// server's `breakwater` database.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/breakwater";

/// The PostgreSQL pool every repository function runs on.
pub type Pool = sqlx::PgPool;

/// How long, in milliseconds, a pooled connection may sit idle and still be handed out without a
/// ping: HikariCP's `aliveBypassWindowMs` (500 ms).
pub const PING_AFTER_IDLE_MS: u64 = 500;

/// Pool options that ping a connection before handing it out only when it sat idle at least
/// `ping_after_idle` (zero: every time, sqlx's default).
///
/// sqlx pings each connection it hands out (`test_before_acquire`) and again, in a task of its
/// own, each time one goes back to the pool. The first ping puts a round trip in front of every
/// query; under load it checks a connection that the second ping checked a moment ago. A
/// connection that sat idle is still pinged, so one the server closed meanwhile is replaced
/// rather than failing a request. sqlx's documentation gives this hook for it
/// (`PoolOptions::before_acquire`).
#[must_use]
pub fn pool_options(ping_after_idle: std::time::Duration) -> sqlx::postgres::PgPoolOptions {
    sqlx::postgres::PgPoolOptions::new().test_before_acquire(false).before_acquire(move |conn, meta| {
        Box::pin(async move {
            if meta.idle_for >= ping_after_idle {
                sqlx::Connection::ping(conn).await?;
            }
            Ok(true)
        })
    })
}

/// Applies the migrations embedded from the workspace's `migrations/` folder.
///
/// A migration that has been applied is never edited: sqlx refuses to run against a database
/// whose applied migration's checksum has changed. That is why the first migration's tenant-owned
/// tables (users, inboxes, contacts) keep their like-shaped opening columns (`tenant_id`, `id`,
/// `name`, ..., the composite primary key), which the `duplicates` tool pairs: each is its own
/// table's definition, and a change to them would be a new migration.
///
/// # Errors
/// When the database is unreachable or a migration fails.
pub async fn migrate(pool: &Pool) -> std::result::Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("../../migrations").run(pool).await
}

/// The migrations, for tests that build a fresh database (`#[sqlx::test(migrator = ...)]`).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Page size bounds shared by every list.
pub const DEFAULT_PAGE_SIZE: u32 = 25;
/// The largest page a client may ask for.
pub const MAX_PAGE_SIZE: u32 = 100;

/// A page of a keyset-paginated list: `limit + 1` rows are read to know whether there is more.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The rows of this page.
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from `limit + 1` rows: the extra row, if present, only says there is more.
    pub(crate) fn from_rows(mut rows: Vec<T>, limit: u32, cursor_of: impl Fn(&T) -> Cursor) -> Self {
        let limit = limit as usize;
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|last| cursor_of(last).encode())
        } else {
            None
        };
        Self { items: rows, next_cursor }
    }
}

/// Clamps a requested page size into `1..=MAX_PAGE_SIZE`.
///
/// # Errors
/// [`DomainError::BadQuery`] when the size is 0 or above [`MAX_PAGE_SIZE`].
pub fn page_size(requested: Option<u32>) -> Result<u32> {
    match requested {
        None => Ok(DEFAULT_PAGE_SIZE),
        Some(n @ 1..=MAX_PAGE_SIZE) => Ok(n),
        Some(_) => Err(DomainError::BadQuery(format!("limit must be between 1 and {MAX_PAGE_SIZE}"))),
    }
}
