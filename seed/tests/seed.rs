//! The seeder against a real PostgreSQL: each test seeds the small preset into a database of its
//! own (created here, dropped when the test ends, even when it fails).
//!
//! `DATABASE_URL` names the server (any database on it); by default the local development one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use breakwater_seed::{DEFAULT_DATABASE_URL, Error, Options, Sizes, Table};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool, Row};

/// A database of the test's own.
struct TestDb {
    name: String,
    server: PgConnectOptions,
    url: String,
}

impl TestDb {
    async fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
        let server: PgConnectOptions = base.parse().expect("DATABASE_URL is a PostgreSQL URL");
        let name = format!("bw_seed_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut admin = server.clone().database("postgres").connect().await.expect("PostgreSQL is reachable");
        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name}")).execute(&mut admin).await.expect("drop");
        sqlx::raw_sql(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.expect("create");
        admin.close().await.expect("close");
        let url = with_database(&base, &name);
        Self { name, server, url }
    }

    fn options(&self, sizes: Sizes) -> Options {
        Options { connections: 3, ..Options::new(self.url.clone(), sizes) }
    }

    async fn pool(&self) -> PgPool {
        PgPoolOptions::new().max_connections(2).connect(&self.url).await.expect("connect")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (name, server) = (self.name.clone(), self.server.clone());
        // Drop runs inside the test's runtime: do the async cleanup on a thread with its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                if let Ok(mut admin) = server.database("postgres").connect().await {
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
    }
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let path = base[authority_end..].find('/').map_or(base.len(), |i| authority_end + i);
    let mut out = format!("{}/{name}", &base[..path]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// An md5 over every row of every seeded table, in key order.
async fn checksums(pool: &PgPool) -> BTreeMap<&'static str, String> {
    let mut sums = BTreeMap::new();
    for table in Table::ALL {
        let sql = format!("SELECT md5(string_agg(t::text, E'\\n' ORDER BY t.id)) FROM {} t", table.name());
        let sum: Option<String> = sqlx::query_scalar(&sql).fetch_one(pool).await.expect("checksum");
        sums.insert(table.name(), sum.expect("rows"));
    }
    sums
}

/// Every index and constraint of the public schema, as the catalog defines them.
async fn catalog(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT format('index %s on %s: %s', c.relname, i.indrelid::regclass, pg_get_indexdef(i.indexrelid))
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE c.relnamespace = 'public'::regnamespace
         UNION ALL
         SELECT format('constraint %s on %s (%s, valid %s, index %s): %s', conname, conrelid::regclass, contype,
                       convalidated, conindid::regclass, pg_get_constraintdef(oid))
         FROM pg_constraint WHERE connamespace = 'public'::regnamespace
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("catalog")
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_rows() {
    let (a, b) = (TestDb::new().await, TestDb::new().await);
    let options = |db: &TestDb| Options { seed: 7, ..db.options(Sizes::SMALL) };
    breakwater_seed::run(&options(&a)).await.expect("seed a");
    // Fewer connections: a different schedule must not change the rows.
    breakwater_seed::run(&Options { connections: 1, ..options(&b) }).await.expect("seed b");
    let (pa, pb) = (a.pool().await, b.pool().await);
    let first = checksums(&pa).await;
    assert_eq!(first, checksums(&pb).await);

    breakwater_seed::run(&Options { seed: 8, reset: true, ..options(&b) }).await.expect("reseed b");
    let other = checksums(&pb).await;
    for table in Table::ALL {
        assert_ne!(first[table.name()], other[table.name()], "{} differs for another seed", table.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_tenant_holds_the_skew() {
    let db = TestDb::new().await;
    for skew in [0.55, 0.3] {
        let sizes = Sizes { skew, ..Sizes::SMALL };
        breakwater_seed::run(&Options { reset: true, ..db.options(sizes) }).await.expect("seed");
        let pool = db.pool().await;
        for table in ["conversations", "messages", "contacts"] {
            let share: f64 = sqlx::query_scalar(&format!(
                "SELECT (max(n)::float8 / sum(n)::float8) FROM (SELECT count(*) AS n FROM {table} GROUP BY tenant_id) t"
            ))
            .fetch_one(&pool)
            .await
            .expect("share");
            // Conversations and messages are split exactly; contacts follow the conversations.
            let tolerance = if table == "contacts" { 0.05 } else { 0.01 };
            assert!((share - skew).abs() <= tolerance, "{table}: top tenant has {share:.4}, --skew {skew}");
        }
        let tenants = count(&pool, "SELECT count(*) FROM tenants").await;
        assert_eq!(tenants, 5);
        pool.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_and_constraints_are_exactly_the_migrations_after_a_run() {
    let db = TestDb::new().await;
    let pool = db.pool().await;
    breakwater_domain::migrate(&pool).await.expect("migrate");
    let migrated = catalog(&pool).await;
    assert!(migrated.iter().any(|c| c.contains("messages_conversation_fk")), "the catalog query sees constraints");
    breakwater_seed::run(&db.options(Sizes::SMALL)).await.expect("seed");
    assert_eq!(catalog(&pool).await, migrated);
    let invalid = count(&pool, "SELECT count(*) FROM pg_constraint WHERE NOT convalidated").await;
    assert_eq!(invalid, 0, "every foreign key is validated");
    let bookkeeping = count(&pool, "SELECT count(*) FROM pg_namespace WHERE nspname = 'breakwater_seed'").await;
    assert_eq!(bookkeeping, 0, "the bookkeeping schema is gone");
    // The tables were written frozen: vacuum has nothing to do for index-only scans.
    let not_visible = count(
        &pool,
        "SELECT count(*) FROM pg_class
         WHERE relname IN ('conversations', 'messages', 'contacts') AND relallvisible < relpages",
    )
    .await;
    assert_eq!(not_visible, 0, "every page is all-visible");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denormalised_fields_match_the_messages() {
    let db = TestDb::new().await;
    breakwater_seed::run(&db.options(Sizes::SMALL)).await.expect("seed");
    let pool = db.pool().await;
    let wrong = count(
        &pool,
        r#"SELECT count(*) FROM conversations c
           CROSS JOIN LATERAL (SELECT count(*) AS n, max(m.created_at) AS newest FROM messages m
                               WHERE m.tenant_id = c.tenant_id AND m.conversation_id = c.id) a
           LEFT JOIN LATERAL (SELECT left(m.body, 140) AS preview FROM messages m
                              WHERE m.tenant_id = c.tenant_id AND m.conversation_id = c.id
                              ORDER BY m.created_at DESC, m.id DESC LIMIT 1) p ON true
           WHERE c.message_count <> a.n
              OR c.last_activity_at <> COALESCE(a.newest, c.created_at)
              OR c.last_message_preview IS DISTINCT FROM p.preview"#,
    )
    .await;
    assert_eq!(wrong, 0, "conversations whose count, activity or preview disagree with their messages");
    let empty = count(&pool, "SELECT count(*) FROM conversations WHERE message_count = 0").await;
    assert!(empty > 0, "some conversations have no message yet (their activity is their creation)");
    let before = count(&pool, "SELECT count(*) FROM messages m JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conversation_id WHERE m.created_at < c.created_at").await;
    assert_eq!(before, 0, "no message predates its conversation");
    let foreign_author = count(
        &pool,
        "SELECT count(*) FROM messages m LEFT JOIN users u ON u.tenant_id = m.tenant_id AND u.id = m.author_id
         WHERE (m.sender = 'agent') <> (u.id IS NOT NULL)",
    )
    .await;
    assert_eq!(foreign_author, 0, "agent messages, and only they, have an author of their own tenant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dataset_is_shaped_like_production() {
    let db = TestDb::new().await;
    let options = db.options(Sizes::SMALL);
    breakwater_seed::run(&options).await.expect("seed");
    let pool = db.pool().await;
    let row = sqlx::query(
        "SELECT avg((status = 'closed')::int)::float8 AS closed, avg((status = 'open')::int)::float8 AS open,
                avg((status = 'pending')::int)::float8 AS pending,
                avg((assignee_id IS NULL)::int)::float8 AS unassigned,
                min(created_at) >= $1::timestamptz - interval '365 days' AS within_year,
                max(last_activity_at) <= $1::timestamptz + interval '1 minute' AS until_end,
                max(message_count) AS longest
         FROM conversations",
    )
    .bind(options.until)
    .fetch_one(&pool)
    .await
    .expect("shape");
    let share = |c: &str| row.get::<f64, _>(c);
    assert!(share("closed") > 0.7, "mostly closed: {}", share("closed"));
    assert!(share("open") > 0.0 && share("pending") > 0.0, "some open and pending");
    assert!(share("unassigned") > 0.0 && share("unassigned") < 0.3, "some unassigned: {}", share("unassigned"));
    assert!(row.get::<bool, _>("within_year") && row.get::<bool, _>("until_end"), "over the seeded year");
    assert!(row.get::<i32, _>("longest") >= 20, "a long conversation");

    let recent_half = count(
        &pool,
        "SELECT (count(*) FILTER (WHERE created_at > (SELECT max(created_at) FROM conversations) - interval '182 days')
                 * 100 / count(*)) FROM conversations",
    )
    .await;
    assert!(recent_half > 55, "the recent half-year is denser: {recent_half}%");

    let busiest_contact =
        count(&pool, "SELECT max(n) FROM (SELECT count(*) AS n FROM conversations GROUP BY tenant_id, contact_id) t")
            .await;
    assert!(busiest_contact >= 5, "some contacts write in many times: {busiest_contact}");
    let per_tenant = sqlx::query(
        "SELECT t.id,
                (SELECT count(*) FROM inboxes i WHERE i.tenant_id = t.id) AS inboxes,
                (SELECT count(*) FROM users u WHERE u.tenant_id = t.id AND u.role = 'admin') AS admins,
                (SELECT count(*) FROM users u WHERE u.tenant_id = t.id AND u.role = 'agent') AS agents
         FROM tenants t",
    )
    .fetch_all(&pool)
    .await
    .expect("per tenant");
    for t in per_tenant {
        assert!(t.get::<i64, _>("inboxes") >= 2 && t.get::<i64, _>("admins") >= 1 && t.get::<i64, _>("agents") >= 2);
    }
    let names = count(&pool, "SELECT count(DISTINCT lower(left(name, 1))) FROM contacts").await;
    assert!(names >= 15, "names start with many letters: {names}");
    let emails = count(&pool, "SELECT avg((email IS NOT NULL)::int * 100)::int8 FROM contacts").await;
    assert!((70..=95).contains(&emails), "most contacts have an email: {emails}%");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_with_data_is_refused_unless_reset() {
    let db = TestDb::new().await;
    breakwater_seed::run(&db.options(Sizes::SMALL)).await.expect("seed");
    let pool = db.pool().await;
    let first = checksums(&pool).await;
    let refused = breakwater_seed::run(&db.options(Sizes::SMALL)).await;
    assert!(matches!(refused, Err(Error::NotEmpty { .. })), "{refused:?}");
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("--reset"), "{message}");
    assert_eq!(checksums(&pool).await, first, "a refused run writes nothing");
    breakwater_seed::run(&Options { reset: true, ..db.options(Sizes::SMALL) }).await.expect("reset");
    assert_eq!(checksums(&pool).await, first);
    assert_eq!(counter_mismatches(&pool).await, 0, "after a reset, the inbox counters are counted afresh");
}

/// Buckets whose inbox counters differ from `COUNT(*)` of the conversations the inbox list
/// shows (contact not erased), both ways: every conversation and the unassigned ones per
/// (tenant, inbox, status), the assigned ones per (tenant, agent, inbox, status).
async fn counter_mismatches(pool: &PgPool) -> i64 {
    count(
        pool,
        r#"WITH visible AS (
               SELECT c.* FROM conversations c
               JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
               WHERE ct.erased_at IS NULL),
           counted AS (
               SELECT tenant_id, inbox_id, status, sum(total) AS total, sum(unassigned) AS unassigned
               FROM conversation_counts GROUP BY 1, 2, 3 HAVING sum(total) <> 0 OR sum(unassigned) <> 0),
           counted_star AS (
               SELECT tenant_id, inbox_id, status, count(*) AS total,
                      count(*) FILTER (WHERE assignee_id IS NULL) AS unassigned
               FROM visible GROUP BY 1, 2, 3),
           assigned AS (
               SELECT tenant_id, assignee_id, inbox_id, status, n::bigint AS n
               FROM conversation_assignee_counts WHERE n <> 0),
           assigned_star AS (
               SELECT tenant_id, assignee_id, inbox_id, status, count(*) AS n
               FROM visible WHERE assignee_id IS NOT NULL GROUP BY 1, 2, 3, 4)
           SELECT (SELECT count(*) FROM ((TABLE counted EXCEPT TABLE counted_star)
                                         UNION ALL (TABLE counted_star EXCEPT TABLE counted)) d)
                + (SELECT count(*) FROM ((TABLE assigned EXCEPT TABLE assigned_star)
                                         UNION ALL (TABLE assigned_star EXCEPT TABLE assigned)) d)"#,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_counters_equal_count_star() {
    let db = TestDb::new().await;
    breakwater_seed::run(&db.options(Sizes::SMALL)).await.expect("seed");
    let pool = db.pool().await;
    let buckets = count(&pool, "SELECT count(*) FROM conversation_counts").await;
    let assigned = count(&pool, "SELECT count(*) FROM conversation_assignee_counts").await;
    assert!(buckets > 0 && assigned > 0, "the counters are filled: {buckets} and {assigned} rows");
    assert_eq!(counter_mismatches(&pool).await, 0, "counter buckets that differ from COUNT(*)");
    // The comparison can fail: one conversation moved behind the counters' back is found.
    sqlx::query(
        "UPDATE conversations SET status = CASE status WHEN 'open' THEN 'closed'::conversation_status
                                                       ELSE 'open' END
         WHERE (tenant_id, id) = (SELECT tenant_id, id FROM conversations LIMIT 1)",
    )
    .execute(&pool)
    .await
    .expect("update");
    assert!(counter_mismatches(&pool).await > 0, "a conversation moved behind the counters' back goes unseen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_cleans_up_an_interrupted_run() {
    let db = TestDb::new().await;
    let pool = db.pool().await;
    breakwater_domain::migrate(&pool).await.expect("migrate");
    let migrated = catalog(&pool).await;

    // A run stopped after taking the indexes and constraints off and writing some rows...
    let mut conn = pool.acquire().await.expect("conn");
    let detached = breakwater_seed::schema::detach(&mut conn).await.expect("detach");
    assert!(detached.len() >= 20, "indexes, keys and foreign keys are off: {}", detached.len());
    sqlx::raw_sql("INSERT INTO tenants (id, name) VALUES (gen_random_uuid(), 'half-seeded')")
        .execute(&mut *conn)
        .await
        .expect("a row");
    // ... and after rebuilding part of them.
    let index = detached.iter().find(|d| d.name == "contacts_name_idx").expect("contacts_name_idx is off");
    sqlx::raw_sql(&index.create_sql).execute(&mut *conn).await.expect("rebuild one");
    drop(conn);
    assert_ne!(catalog(&pool).await, migrated);

    let refused = breakwater_seed::run(&db.options(Sizes::SMALL)).await;
    assert!(matches!(refused, Err(Error::Interrupted { .. })), "{refused:?}");
    breakwater_seed::run(&Options { reset: true, ..db.options(Sizes::SMALL) }).await.expect("reset");
    assert_eq!(catalog(&pool).await, migrated);
    let half_seeded = count(&pool, "SELECT count(*) FROM tenants WHERE name = 'half-seeded'").await;
    assert_eq!(half_seeded, 0);
}

#[test]
fn urls_get_the_test_database() {
    assert_eq!(with_database("postgres://u@h:5432/db", "x"), "postgres://u@h:5432/x");
    assert_eq!(with_database("postgres://u@h/db?sslmode=disable", "x"), "postgres://u@h/x?sslmode=disable");
    assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
}
