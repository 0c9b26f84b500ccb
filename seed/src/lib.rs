//! Breakwater's seeder: fills the chat schema with a skewed, production-shaped dataset.
//!
//! By default 50 tenants, 400,000 conversations and 2,000,000 messages, one tenant holding 55%
//! of everything and the rest a long tail; the same `--seed` always gives the same rows.
//!
//! How it is fast: the whole dataset is generated in memory first ([`plan`]); the indexes,
//! primary keys and foreign keys of the seeded tables are dropped ([`schema`]); each table is
//! written with one binary `COPY ... FREEZE` in the transaction that truncates it (so its pages
//! are written once, already frozen and all-visible, and need no vacuum), tables in parallel on
//! several connections; then the indexes are built, the keys attached and the foreign keys
//! validated, in parallel as their dependencies allow ([`load`]); then `ANALYZE`; then the inbox
//! counters are counted from the loaded conversations (`breakwater_domain::counts::rebuild`).
//!
//! Architecture invariant: the seeder writes the schema that `breakwater_domain`'s migrations
//! make and nothing else; what it takes off for the load it puts back exactly as it was.

pub mod copy;
mod enums;
mod load;

pub use load::Step;
pub mod plan;
pub mod schema;
mod text;

use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgConnection};
use uuid::Uuid;

pub use copy::Table;
pub use plan::{Params, Plan, Sizes};

/// The default `DATABASE_URL` (the domain's, which every binary shares).
pub use breakwater_domain::DEFAULT_DATABASE_URL;

/// The end of the seeded year unless `--until` says otherwise. Fixed, not the clock, so that a
/// seed gives the same rows on any day.
pub const DEFAULT_UNTIL: &str = "2026-11-30T00:00:00Z";

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database already has data and `--reset` was not given.
    #[error(
        "database `{database}` already has data (in {}); pass --reset to wipe it and seed again",
        tables.join(", ")
    )]
    NotEmpty {
        /// The database's name.
        database: String,
        /// The tables with rows.
        tables: Vec<String>,
    },
    /// An earlier run stopped with indexes or constraints off.
    #[error(
        "database `{database}` holds an interrupted seed (indexes and constraints are still off); \
         pass --reset to wipe it, seed again and put them back"
    )]
    Interrupted {
        /// The database's name.
        database: String,
    },
    /// Options that make no dataset.
    #[error("{0}")]
    Invalid(String),
    /// Objects that should have been rebuilt are still off (a bug).
    #[error("indexes or constraints still off after the rebuild: {}", .0.join(", "))]
    Incomplete(Vec<String>),
    /// A database error.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The migrations failed.
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Recounting the inbox counters after the load failed.
    #[error("recounting the inbox counters: {0}")]
    Counts(#[from] breakwater_domain::DomainError),
    /// A generator or encoder thread died.
    #[error("a generator thread failed: {0}")]
    Thread(String),
}

/// How to seed.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where.
    pub database_url: String,
    /// How much.
    pub sizes: Sizes,
    /// Which dataset.
    pub seed: u64,
    /// The end of the seeded year.
    pub until: DateTime<Utc>,
    /// Wipe a non-empty database first.
    pub reset: bool,
    /// Connections writing and building at once.
    pub connections: usize,
    /// Draw progress bars (on a terminal).
    pub progress: bool,
}

impl Options {
    /// The full default shape into `database_url`.
    ///
    /// # Panics
    /// Never: [`DEFAULT_UNTIL`] is a valid timestamp.
    #[must_use]
    pub fn new(database_url: impl Into<String>, sizes: Sizes) -> Self {
        Self {
            database_url: database_url.into(),
            sizes,
            seed: 1,
            until: DEFAULT_UNTIL.parse().expect("a valid default"),
            reset: false,
            connections: 3,
            progress: false,
        }
    }
}

/// Rows written to one table, and how long its `COPY` took.
#[derive(Debug, Clone)]
pub struct TableSummary {
    /// The table.
    pub table: Table,
    /// Rows written.
    pub rows: usize,
    /// Its `COPY`, start to commit.
    pub copy: Duration,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The database.
    pub database: String,
    /// Per table.
    pub tables: Vec<TableSummary>,
    /// Generating the dataset in memory.
    pub generate: Duration,
    /// From the first `COPY` to the inbox counters' count.
    pub load_and_build: Duration,
    /// Indexes, keys and foreign keys rebuilt.
    pub rebuilt: usize,
    /// The whole run.
    pub total: Duration,
    /// Each step of the load and rebuild, in order of start.
    pub steps: Vec<Step>,
    /// The biggest tenant's id.
    pub biggest_tenant: Uuid,
    /// One of its admins (a development token can be minted for them).
    pub biggest_tenant_admin: Uuid,
}

impl Summary {
    /// When each step of the load ran, one line each.
    #[must_use]
    pub fn timeline(&self) -> String {
        self.steps
            .iter()
            .map(|s| {
                format!(
                    "  {:>7.2} {:>7.2} {:>7.2}  {}",
                    s.start.as_secs_f64(),
                    s.end.as_secs_f64(),
                    (s.end - s.start).as_secs_f64(),
                    s.label
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Rows over all tables.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.tables.iter().map(|t| t.rows).sum()
    }
}

#[allow(clippy::cast_precision_loss)]
fn per_second(rows: usize, d: Duration) -> f64 {
    rows as f64 / d.as_secs_f64().max(1e-9)
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seeded `{}`", self.database)?;
        writeln!(f, "  {:<14} {:>10} {:>9} {:>12}", "table", "rows", "copy s", "rows/s")?;
        for t in &self.tables {
            writeln!(
                f,
                "  {:<14} {:>10} {:>9.2} {:>12.0}",
                t.table.name(),
                t.rows,
                t.copy.as_secs_f64(),
                per_second(t.rows, t.copy)
            )?;
        }
        writeln!(f, "  {:<14} {:>10}", "total", self.rows())?;
        writeln!(f, "  generate        {:>6.2} s", self.generate.as_secs_f64())?;
        writeln!(
            f,
            "  load + build    {:>6.2} s   ({} indexes and constraints rebuilt, ANALYZE, the inbox counters counted)",
            self.load_and_build.as_secs_f64(),
            self.rebuilt
        )?;
        writeln!(
            f,
            "  total           {:>6.2} s   {:.0} rows/s",
            self.total.as_secs_f64(),
            per_second(self.rows(), self.total)
        )?;
        writeln!(f, "  biggest tenant  {}", self.biggest_tenant)?;
        write!(f, "  its admin       {}", self.biggest_tenant_admin)
    }
}

/// Creates the database named in `url` if it does not exist; returns its name.
async fn ensure_database(options: &PgConnectOptions) -> Result<String, Error> {
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let mut admin = options.clone().database("postgres").connect().await?;
    let exists =
        sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS "exists!""#, name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        match sqlx::raw_sql(&format!("CREATE DATABASE {quoted}")).execute(&mut admin).await {
            // Created meanwhile by someone else: fine.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            other => {
                other?;
            }
        }
    }
    admin.close().await?;
    Ok(name)
}

/// The seeded tables (and the two the API fills) that hold rows.
async fn non_empty_tables(conn: &mut PgConnection) -> Result<Vec<String>, Error> {
    let row = sqlx::query!(
        r#"SELECT EXISTS (SELECT 1 FROM tenants) AS "tenants!", EXISTS (SELECT 1 FROM users) AS "users!",
                  EXISTS (SELECT 1 FROM inboxes) AS "inboxes!", EXISTS (SELECT 1 FROM contacts) AS "contacts!",
                  EXISTS (SELECT 1 FROM conversations) AS "conversations!",
                  EXISTS (SELECT 1 FROM messages) AS "messages!",
                  EXISTS (SELECT 1 FROM idempotency_keys) AS "idempotency_keys!",
                  EXISTS (SELECT 1 FROM jobs) AS "jobs!""#
    )
    .fetch_one(conn)
    .await?;
    let flags = [
        ("tenants", row.tenants),
        ("users", row.users),
        ("inboxes", row.inboxes),
        ("contacts", row.contacts),
        ("conversations", row.conversations),
        ("messages", row.messages),
        ("idempotency_keys", row.idempotency_keys),
        ("jobs", row.jobs),
    ];
    Ok(flags.into_iter().filter(|(_, has)| *has).map(|(t, _)| t.to_owned()).collect())
}

/// Seeds the database: creates it if missing, migrates it, refuses it if it has data (unless
/// `reset`), then writes the dataset.
///
/// # Errors
/// [`Error::NotEmpty`], [`Error::Interrupted`] or [`Error::Invalid`] before anything is
/// written; a database error otherwise (the database is then left for `--reset`).
pub async fn run(options: &Options) -> Result<Summary, Error> {
    let started = Instant::now();
    options.sizes.validate().map_err(Error::Invalid)?;
    let connections = options.connections.clamp(1, 16);
    let until = options.until.timestamp_micros();

    // Generate while the database is being prepared.
    let params = Params { sizes: options.sizes, seed: options.seed, until };
    let generating = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        (Plan::generate(params), t.elapsed())
    });

    let mut connect: PgConnectOptions = options.database_url.parse()?;
    // TLS to a server on this machine only burns CPU on both ends of a 400 MB stream.
    let loopback =
        ["localhost", "127.0.0.1", "::1"].contains(&connect.get_host()) || connect.get_host().starts_with('/');
    if loopback && !options.database_url.contains("sslmode") {
        connect = connect.ssl_mode(PgSslMode::Disable);
    }
    let database = ensure_database(&connect).await?;
    let pool =
        PgPoolOptions::new().max_connections(u32::try_from(connections + 1).unwrap_or(8)).connect_with(connect).await?;
    breakwater_domain::migrate(&pool).await?;
    let mut conn = pool.acquire().await?;
    let interrupted = schema::interrupted(&mut conn).await?;
    let filled = non_empty_tables(&mut conn).await?;
    if !options.reset {
        if interrupted {
            return Err(Error::Interrupted { database });
        }
        if !filled.is_empty() {
            return Err(Error::NotEmpty { database, tables: filled });
        }
    } else if !filled.is_empty() {
        sqlx::raw_sql(
            "TRUNCATE tenants, users, inboxes, contacts, conversations, messages, idempotency_keys, jobs,
                      conversation_counts, conversation_assignee_counts, stream_events, stream_heads",
        )
        .execute(&mut *conn)
        .await?;
    }
    let detached = schema::detach(&mut conn).await?;
    drop(conn);

    let (plan, generate) = generating.await.map_err(|e| Error::Thread(e.to_string()))?;
    let plan = std::sync::Arc::new(plan);
    let loading = Instant::now();
    let (copies, steps) = load::run(&pool, &plan, &detached, connections, options.progress).await?;
    // The COPY went around the domain, which keeps the inbox counters: count once, now that
    // the keys are back.
    breakwater_domain::counts::rebuild(&pool).await?;
    let load_and_build = loading.elapsed();
    let mut conn = pool.acquire().await?;
    schema::finish(&mut conn).await?;
    drop(conn);
    pool.close().await;

    Ok(Summary {
        database,
        tables: Table::ALL
            .iter()
            .map(|&table| TableSummary {
                table,
                rows: table.rows(&plan),
                copy: copies.get(&table).copied().unwrap_or_default(),
            })
            .collect(),
        generate,
        load_and_build,
        rebuilt: detached.len(),
        steps,
        total: started.elapsed(),
        biggest_tenant: plan.biggest.0,
        biggest_tenant_admin: plan.biggest.1,
    })
}
