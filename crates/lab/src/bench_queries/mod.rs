//! `cargo xtask bench-queries`: the API's queries timed on the full skewed seed.
//!
//! Each case calls the `breakwater_domain` function the API calls, so what is timed is exactly
//! the SQL the API runs, through sqlx's per-connection prepared-statement cache (after five
//! executions PostgreSQL may switch a prepared statement to its generic plan; the warm-up runs
//! get past that). Latencies are client-measured over one connection on loopback.
//!
//! Plans come from `auto_explain` (`log_analyze`, `log_buffers`, nested statements, at NOTICE
//! level, captured from sqlx's notice log) on a second connection that runs each case the same
//! way: they are the plans of the very statements timed, with their real parameters, after the
//! plan cache has settled, including the foreign-key trigger queries an erasure fires. They are
//! saved in `docs/explain/`, and the command fails if any of them scans `conversations`,
//! `messages` or `contacts` sequentially.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use breakwater_domain::contacts::{self, ContactSearch};
use breakwater_domain::conversations::{self, AssigneeFilter, ConversationStatus, InboxFilter};
use breakwater_domain::messages::{self, Order};
use breakwater_domain::{Cursor, DEFAULT_PAGE_SIZE, Pool, TenantId};
use sqlx::Executor as _;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::rig::services::root;

/// Options of `cargo xtask bench-queries`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The database to measure. Seeded with the full default first if it has no data.
    #[arg(long, env = "BENCH_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/breakwater_bench")]
    database_url: String,
    /// Timed runs of each query.
    #[arg(long, default_value_t = 300)]
    runs: usize,
    /// Untimed runs before them (the plan cache settles after five).
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Pages walked by keyset to reach the deep page.
    #[arg(long, default_value_t = 400)]
    deep_pages: usize,
    /// Contacts erased (the tenant's biggest ones, one erasure each; all are restored after).
    #[arg(long, default_value_t = 9)]
    erasures: usize,
    /// Measure a debug build as it is instead of re-running in release.
    #[arg(long)]
    debug_build: bool,
    /// Write nothing under docs/ (still fails on a sequential scan).
    #[arg(long)]
    no_write: bool,
}

pub fn main(args: &Args) -> anyhow::Result<()> {
    if cfg!(debug_assertions) && !args.debug_build {
        eprintln!(
            "bench-queries: a debug build would time the client; running the release build (--debug-build skips)"
        );
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["run", "--release", "--quiet", "--package", "xtask", "--"])
            .args(std::env::args_os().skip(1))
            .status()
            .context("running cargo")?;
        std::process::exit(status.code().unwrap_or(1));
    }
    let notices = Notices::default();
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(notices.clone()))
            .context("installing the notice capture")?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(run(args, &notices))
}

/// Captures PostgreSQL notices (sqlx logs them as tracing events), and nothing else: the rest of
/// sqlx's logging stays disabled, so it costs the timed queries nothing.
#[derive(Clone, Default)]
struct Notices(Arc<Mutex<Vec<String>>>);

const NOTICE_TARGET: &str = "sqlx::postgres::notice";

impl Notices {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn register_callsite(&self, meta: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        if meta.target() == NOTICE_TARGET {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &tracing::Metadata<'_>, _: tracing_subscriber::layer::Context<'_, S>) -> bool {
        meta.target() == NOTICE_TARGET
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "message" {
                    self.0.push_str(value);
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let _ = write!(self.0, "{value:?}");
                }
            }
        }
        if event.metadata().target() == NOTICE_TARGET {
            let mut text = Text(String::new());
            event.record(&mut text);
            self.0.lock().expect("not poisoned").push(text.0);
        }
    }
}

/// One list query, as the API would make it.
#[derive(Debug, Clone)]
enum Query {
    Inbox(InboxFilter, Option<Cursor>),
    Messages(Uuid, Order, Option<Cursor>),
    Contacts(ContactSearch, Option<Cursor>),
}

impl Query {
    fn with_cursor(&self, cursor: Option<Cursor>) -> Self {
        match self {
            Self::Inbox(f, _) => Self::Inbox(*f, cursor),
            Self::Messages(c, o, _) => Self::Messages(*c, *o, cursor),
            Self::Contacts(s, _) => Self::Contacts(s.clone(), cursor),
        }
    }

    /// Runs it; returns the rows and the next page's cursor.
    async fn run(&self, pool: &Pool, tenant: TenantId) -> anyhow::Result<(usize, Option<Cursor>)> {
        let limit = DEFAULT_PAGE_SIZE;
        let (rows, next) = match self {
            Self::Inbox(filter, cursor) => {
                let page = conversations::list(pool, tenant, *filter, cursor.as_ref(), limit).await?;
                (page.items.len(), page.next_cursor)
            }
            Self::Messages(conversation, order, cursor) => {
                let page = messages::list(pool, tenant, *conversation, *order, cursor.as_ref(), limit).await?;
                (page.items.len(), page.next_cursor)
            }
            Self::Contacts(search, cursor) => {
                let page = contacts::list(pool, tenant, search, cursor.as_ref(), limit).await?;
                (page.items.len(), page.next_cursor)
            }
        };
        let next = next.map(|c| Cursor::decode(&c)).transpose().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((rows, next))
    }
}

/// A tenant the cases run on, and what in it they query.
#[derive(Debug, Clone)]
struct Subject {
    key: &'static str,
    label: String,
    tenant: TenantId,
    conversations: i64,
    messages: i64,
    contacts: i64,
    agent: Uuid,
    inbox: Uuid,
    long_conversation: (Uuid, i32),
    name_prefix: String,
    email_prefix: String,
    /// The biggest contacts: (id, conversations, messages), biggest first.
    big_contacts: Vec<(Uuid, i64, i64)>,
}

#[derive(Debug, Clone)]
struct Case {
    key: String,
    title: String,
    subject: usize,
    query: Query,
}

#[derive(Debug, Clone, Default)]
struct Timing {
    p50: Duration,
    p99: Duration,
    rows: usize,
    seq_scan: bool,
    explain: String,
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1_000.0)
}

async fn run(args: &Args, notices: &Notices) -> anyhow::Result<()> {
    let started = chrono::Utc::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pool = match connect(&args.database_url).await {
        Ok(pool) => pool,
        Err(_) => {
            seed(&args.database_url).await?;
            connect(&args.database_url).await?
        }
    };
    let tenants: i64 = sqlx::query_scalar("SELECT count(*) FROM tenants").fetch_one(&pool).await.unwrap_or(0);
    if tenants == 0 {
        seed(&args.database_url).await?;
    }
    restore(&pool).await?;

    let subjects = subjects(&pool, args.erasures + 1).await?;
    for s in &subjects {
        println!(
            "{}: tenant {} — {} conversations, {} messages, {} contacts",
            s.label, s.tenant, s.conversations, s.messages, s.contacts
        );
    }
    let cases = cases(&pool, &subjects, args.deep_pages).await?;

    let mut timings = Vec::with_capacity(cases.len());
    for case in &cases {
        let subject = &subjects[case.subject];
        let mut samples = Vec::with_capacity(args.runs);
        let mut rows = 0;
        for _ in 0..args.warmup {
            case.query.run(&pool, subject.tenant).await?;
        }
        for _ in 0..args.runs {
            let t = Instant::now();
            rows = case.query.run(&pool, subject.tenant).await?.0;
            samples.push(t.elapsed());
        }
        samples.sort_unstable();
        // One more run, on the same connection and statements, with auto_explain on.
        let plans = explained(&pool, notices, case.query.run(&pool, subject.tenant)).await?;
        let explain = format!("-- {}: {} ({})\n\n{}", case.key, case.title, subject.label, dedupe(&plans));
        let timing = Timing {
            p50: percentile(&samples, 50),
            p99: percentile(&samples, 99),
            rows,
            seq_scan: seq_scan(&explain),
            explain,
        };
        println!(
            "{:<16} {:<44} p50 {:>7} ms  p99 {:>7} ms  rows {:>3}{}",
            subject.key,
            case.title,
            ms(timing.p50),
            ms(timing.p99),
            timing.rows,
            if timing.seq_scan { "  SEQ SCAN" } else { "" }
        );
        timings.push(timing);
    }

    let mut erasures = Vec::new();
    for (i, subject) in subjects.iter().enumerate() {
        let e = erasures_of(&pool, notices, subject, args.erasures).await;
        restore(&pool).await?;
        let e = e?;
        println!(
            "{:<16} {:<44} p50 {:>7} ms  p99 {:>7} ms  (request p50 {} ms, largest {} ms){}",
            subject.key,
            "erasure: request + erase job",
            ms(e.total.p50),
            ms(e.total.p99),
            ms(e.request.p50),
            ms(e.largest),
            if e.total.seq_scan { "  SEQ SCAN" } else { "" }
        );
        erasures.push((i, e));
    }
    sqlx::raw_sql("VACUUM (ANALYZE) contacts, conversations, messages, jobs").execute(&pool).await?;

    let report = Report {
        args,
        started,
        load_before,
        subjects: &subjects,
        cases: &cases,
        timings: &timings,
        erasures: &erasures,
    };
    if !args.no_write {
        report.write().await?;
    }
    let scans: Vec<String> = cases
        .iter()
        .zip(&timings)
        .filter(|(_, t)| t.seq_scan)
        .map(|(c, _)| c.key.clone())
        .chain(erasures.iter().filter(|(_, e)| e.total.seq_scan).map(|(i, _)| format!("{}-erasure", subjects[*i].key)))
        .collect();
    if !scans.is_empty() {
        bail!("sequential scans on conversations, messages or contacts in: {}", scans.join(", "));
    }
    Ok(())
}

/// The one connection everything runs on: with `auto_explain` loaded but off until
/// [`explained`] turns it on for one run, so the plans shown are those of the statements timed,
/// in the state the timed runs left the plan cache in.
async fn connect(url: &str) -> anyhow::Result<Pool> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(
                    "LOAD 'auto_explain';
                     SET auto_explain.log_min_duration = -1; SET auto_explain.log_analyze = on;
                     SET auto_explain.log_buffers = on; SET auto_explain.log_timing = on;
                     SET auto_explain.log_triggers = on; SET auto_explain.log_nested_statements = on;
                     SET auto_explain.log_level = notice",
                )
                .await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .context("connecting to the bench database (auto_explain needs a superuser)")?;
    Ok(pool)
}

/// Runs `work` with auto_explain on and returns the plans it logged.
async fn explained<T>(
    pool: &Pool,
    notices: &Notices,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Vec<String>> {
    pool.execute("SET auto_explain.log_min_duration = 0").await?;
    notices.take();
    let outcome = work.await;
    let plans = notices.take();
    pool.execute("SET auto_explain.log_min_duration = -1").await?;
    outcome?;
    Ok(plans)
}

async fn seed(url: &str) -> anyhow::Result<()> {
    println!("bench-queries: the database has no data; seeding the full default first");
    let options =
        breakwater_seed::Options { progress: true, ..breakwater_seed::Options::new(url, breakwater_seed::Sizes::FULL) };
    let summary = breakwater_seed::run(&options).await?;
    println!("{summary}");
    Ok(())
}

/// Whether a plan reads one of the big tables sequentially.
fn seq_scan(plans: &str) -> bool {
    plans.lines().any(|l| {
        ["conversations", "messages", "contacts"]
            .iter()
            .any(|t| l.split("Seq Scan on ").skip(1).any(|rest| rest.split_whitespace().next() == Some(t)))
    })
}

/// A plan with its numbers and quoted literals blanked out.
fn shape_of(plan: &str) -> String {
    let mut out = String::with_capacity(plan.len());
    let mut quoted = false;
    for c in plan.chars() {
        if c == '\'' {
            quoted = !quoted;
            out.push(c);
        } else if !quoted && !c.is_ascii_digit() {
            out.push(c);
        }
    }
    out
}

/// Collapses plans that differ only in their numbers (a foreign-key trigger's query runs once
/// per deleted row), keeping the first and counting the rest.
fn dedupe(plans: &[String]) -> String {
    let mut seen: Vec<(String, &String, usize)> = Vec::new();
    for p in plans {
        let shape = shape_of(p);
        match seen.iter_mut().find(|(s, _, _)| *s == shape) {
            Some((_, _, n)) => *n += 1,
            None => seen.push((shape, p, 1)),
        }
    }
    let mut out = String::new();
    for (_, plan, n) in seen {
        if n > 1 {
            let _ = writeln!(out, "-- the plan below ran {n} times (the first one shown)");
        }
        let _ = writeln!(out, "{}\n", plan.trim_end());
    }
    out
}

async fn subjects(pool: &Pool, erasures: usize) -> anyhow::Result<Vec<Subject>> {
    let sizes = sqlx::query!(
        r#"SELECT tenant_id AS "tenant_id!", count(*) AS "n!" FROM conversations
           GROUP BY tenant_id ORDER BY count(*) DESC, tenant_id"#
    )
    .fetch_all(pool)
    .await?;
    let total: i64 = sizes.iter().map(|s| s.n).sum();
    let (Some(big), Some(small)) = (sizes.first(), sizes.get(sizes.len() / 2)) else {
        bail!("the database has no conversations");
    };
    let mut out = Vec::new();
    for (key, tenant, n) in [("big", big.tenant_id, big.n), ("small", small.tenant_id, small.n)] {
        #[allow(clippy::cast_precision_loss)]
        let share = n as f64 * 100.0 / total.max(1) as f64;
        let label = if key == "big" { format!("{share:.0}% tenant") } else { format!("median tenant ({share:.2}%)") };
        let messages = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM messages WHERE tenant_id = $1"#, tenant)
            .fetch_one(pool)
            .await?;
        let contacts = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM contacts WHERE tenant_id = $1"#, tenant)
            .fetch_one(pool)
            .await?;
        let agent = sqlx::query_scalar!(
            r#"SELECT assignee_id AS "id!" FROM conversations WHERE tenant_id = $1 AND assignee_id IS NOT NULL
               GROUP BY assignee_id ORDER BY count(*) DESC, assignee_id LIMIT 1"#,
            tenant
        )
        .fetch_one(pool)
        .await?;
        let inbox = sqlx::query_scalar!(
            r#"SELECT inbox_id AS "id!" FROM conversations WHERE tenant_id = $1
               GROUP BY inbox_id ORDER BY count(*) DESC, inbox_id LIMIT 1"#,
            tenant
        )
        .fetch_one(pool)
        .await?;
        let long = sqlx::query!(
            "SELECT id, message_count FROM conversations WHERE tenant_id = $1 ORDER BY message_count DESC, id LIMIT 1",
            tenant
        )
        .fetch_one(pool)
        .await?;
        // Prefixes of the contact in the middle of the list: as common as a typed prefix is.
        let name_prefix = sqlx::query_scalar!(
            r#"SELECT left(lower(name), 3) AS "p!" FROM contacts WHERE tenant_id = $1
               ORDER BY lower(name) COLLATE "C", id OFFSET $2 LIMIT 1"#,
            tenant,
            contacts / 2
        )
        .fetch_one(pool)
        .await?;
        let email_prefix = sqlx::query_scalar!(
            r#"SELECT left(lower(email), 3) AS "p!" FROM contacts WHERE tenant_id = $1 AND email IS NOT NULL
               ORDER BY lower(email) COLLATE "C", id OFFSET $2 LIMIT 1"#,
            tenant,
            contacts / 3
        )
        .fetch_one(pool)
        .await?;
        let big_contacts = sqlx::query!(
            r#"SELECT contact_id AS "id!", count(*) AS "conversations!", sum(message_count)::int8 AS "messages!"
               FROM conversations WHERE tenant_id = $1
               GROUP BY contact_id ORDER BY count(*) DESC, contact_id LIMIT $2"#,
            tenant,
            i64::try_from(erasures)?
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| (r.id, r.conversations, r.messages))
        .collect();
        out.push(Subject {
            key,
            label,
            tenant: TenantId(tenant),
            conversations: n,
            messages,
            contacts,
            agent,
            inbox,
            long_conversation: (long.id, long.message_count),
            name_prefix,
            email_prefix,
            big_contacts,
        });
    }
    Ok(out)
}

async fn cases(pool: &Pool, subjects: &[Subject], deep_pages: usize) -> anyhow::Result<Vec<Case>> {
    let mut out = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        let inbox = |status, inbox_id, assignee| Query::Inbox(InboxFilter { status, inbox_id, assignee }, None);
        let open = Some(ConversationStatus::Open);
        let closed = Some(ConversationStatus::Closed);
        let agent = AssigneeFilter::User(s.agent);
        let mut list = vec![
            ("inbox-all", "inbox: all, page 1".to_owned(), inbox(None, None, AssigneeFilter::Any), false),
            ("inbox-all-deep", "inbox: all, deep page".to_owned(), inbox(None, None, AssigneeFilter::Any), true),
            ("inbox-open", "inbox: status=open".to_owned(), inbox(open, None, AssigneeFilter::Any), false),
            ("inbox-closed", "inbox: status=closed".to_owned(), inbox(closed, None, AssigneeFilter::Any), false),
            (
                "inbox-closed-deep",
                "inbox: status=closed, deep page".to_owned(),
                inbox(closed, None, AssigneeFilter::Any),
                true,
            ),
            ("inbox-assignee", "inbox: assignee".to_owned(), inbox(None, None, agent), false),
            ("inbox-open-assignee", "inbox: status=open + assignee".to_owned(), inbox(open, None, agent), false),
            ("inbox-assignee-deep", "inbox: assignee, deep page".to_owned(), inbox(None, None, agent), true),
            ("inbox-unassigned", "inbox: unassigned".to_owned(), inbox(None, None, AssigneeFilter::Unassigned), false),
            (
                "inbox-open-unassigned",
                "inbox: status=open + unassigned".to_owned(),
                inbox(open, None, AssigneeFilter::Unassigned),
                false,
            ),
            ("inbox-inbox", "inbox: inbox".to_owned(), inbox(None, Some(s.inbox), AssigneeFilter::Any), false),
            (
                "inbox-inbox-open",
                "inbox: inbox + status=open".to_owned(),
                inbox(open, Some(s.inbox), AssigneeFilter::Any),
                false,
            ),
            (
                "inbox-inbox-deep",
                "inbox: inbox, deep page".to_owned(),
                inbox(None, Some(s.inbox), AssigneeFilter::Any),
                true,
            ),
            (
                "messages-first",
                format!("messages: longest conversation ({}), first page", s.long_conversation.1),
                Query::Messages(s.long_conversation.0, Order::Asc, Some(oldest())),
                false,
            ),
            (
                "messages-newest",
                "messages: longest conversation, newest page".to_owned(),
                Query::Messages(s.long_conversation.0, Order::Desc, None),
                false,
            ),
            (
                "messages-deep",
                "messages: longest conversation, deep page".to_owned(),
                Query::Messages(s.long_conversation.0, Order::Asc, Some(oldest())),
                true,
            ),
            ("contacts", "contacts: page 1".to_owned(), Query::Contacts(ContactSearch::All, None), false),
            ("contacts-deep", "contacts: deep page".to_owned(), Query::Contacts(ContactSearch::All, None), true),
            (
                "contacts-name",
                format!("contacts: name prefix '{}'", s.name_prefix),
                Query::Contacts(ContactSearch::NamePrefix(s.name_prefix.clone()), None),
                false,
            ),
            (
                "contacts-email",
                format!("contacts: email prefix '{}'", s.email_prefix),
                Query::Contacts(ContactSearch::EmailPrefix(s.email_prefix.clone()), None),
                false,
            ),
        ];
        for (key, title, query, deep) in list.drain(..) {
            let (query, depth) = if deep { walk(pool, s.tenant, &query, deep_pages).await? } else { (query, 0) };
            let title = if deep { format!("{title} (after {depth} rows)") } else { title };
            out.push(Case { key: format!("{}-{key}", s.key), title, subject: i, query });
        }
    }
    Ok(out)
}

/// The first page of an oldest-first message list, as a cursor before every message.
///
/// `messages::list` starts an oldest-first list at `DateTime::<Utc>::MIN_UTC`, which is outside
/// PostgreSQL's timestamp range: without a cursor that query fails ("timestamp out of range").
/// Until the domain's sentinel is fixed, the bench passes the Unix epoch, which the same
/// statement and plan serve.
fn oldest() -> Cursor {
    Cursor::Time(chrono::DateTime::UNIX_EPOCH, Uuid::nil())
}

/// Follows the cursor `pages` pages deep (or to the last page) and returns the query for there.
async fn walk(pool: &Pool, tenant: TenantId, query: &Query, pages: usize) -> anyhow::Result<(Query, usize)> {
    let mut at = query.clone();
    let mut depth = 0;
    for _ in 0..pages {
        let (rows, next) = at.run(pool, tenant).await?;
        match next {
            Some(cursor) => {
                depth += rows;
                at = query.with_cursor(Some(cursor));
            }
            None => break,
        }
    }
    Ok((at, depth))
}

#[derive(Debug, Default)]
struct Erasures {
    request: Timing,
    erase: Timing,
    total: Timing,
    largest: Duration,
    /// (conversations, messages) of each erased contact.
    sizes: Vec<(i64, i64)>,
}

/// The bench's copy of the rows it erases, kept in the database so that an interrupted bench is
/// restored by the next one.
const KEEP: &str = "CREATE SCHEMA IF NOT EXISTS breakwater_bench;
    CREATE TABLE IF NOT EXISTS breakwater_bench.contacts (LIKE public.contacts);
    CREATE TABLE IF NOT EXISTS breakwater_bench.conversations (LIKE public.conversations);
    CREATE TABLE IF NOT EXISTS breakwater_bench.messages (LIKE public.messages)";

/// Erases the subject's biggest contacts, one erasure per contact (an erased contact cannot be
/// erased again, and re-inserting it would lay its rows out unlike production's), timing the
/// request and the erase job's deletion; the last one is erased with auto_explain on.
async fn erasures_of(pool: &Pool, notices: &Notices, subject: &Subject, count: usize) -> anyhow::Result<Erasures> {
    let ids: Vec<Uuid> = subject.big_contacts.iter().map(|c| c.0).collect();
    sqlx::raw_sql(KEEP).execute(pool).await?;
    let tenant = subject.tenant.0;
    sqlx::query("INSERT INTO breakwater_bench.contacts SELECT * FROM contacts WHERE tenant_id = $1 AND id = ANY($2)")
        .bind(tenant)
        .bind(&ids)
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO breakwater_bench.conversations
         SELECT * FROM conversations WHERE tenant_id = $1 AND contact_id = ANY($2)",
    )
    .bind(tenant)
    .bind(&ids)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO breakwater_bench.messages
         SELECT m.* FROM breakwater_bench.conversations c
         JOIN messages m ON m.tenant_id = c.tenant_id AND m.conversation_id = c.id",
    )
    .execute(pool)
    .await?;

    let (mut request, mut erase, mut total) = (Vec::new(), Vec::new(), Vec::new());
    let mut e = Erasures::default();
    for &(contact, conversations, messages) in subject.big_contacts.iter().take(count) {
        let t0 = Instant::now();
        contacts::request_erasure(pool, subject.tenant, contact).await?;
        let t1 = Instant::now();
        contacts::erase(pool, subject.tenant, contact, breakwater_domain::contacts::ERASE_BATCH).await?;
        let t2 = Instant::now();
        request.push(t1 - t0);
        erase.push(t2 - t1);
        total.push(t2 - t0);
        e.sizes.push((conversations, messages));
    }
    e.largest = total.first().copied().unwrap_or_default();
    let mut explain = String::new();
    if let Some(&(contact, conversations, messages)) = subject.big_contacts.get(count) {
        let plans = explained(pool, notices, async {
            contacts::request_erasure(pool, subject.tenant, contact).await?;
            contacts::erase(pool, subject.tenant, contact, breakwater_domain::contacts::ERASE_BATCH).await?;
            Ok(())
        })
        .await?;
        explain = format!(
            "-- {}-erasure: request + erase job of a contact with {conversations} conversations and {messages} \
             messages ({})\n\n{}",
            subject.key,
            subject.label,
            dedupe(&plans)
        );
    }
    for v in [&mut request, &mut erase, &mut total] {
        v.sort_unstable();
    }
    let timing = |v: &[Duration]| Timing { p50: percentile(v, 50), p99: percentile(v, 99), ..Timing::default() };
    e.request = timing(&request);
    e.erase = timing(&erase);
    e.total = Timing { seq_scan: seq_scan(&explain), explain, ..timing(&total) };
    Ok(e)
}

/// Puts back whatever an erasure bench took (also after an interrupted one).
async fn restore(pool: &Pool) -> anyhow::Result<()> {
    let kept: bool =
        sqlx::query_scalar("SELECT to_regclass('breakwater_bench.contacts') IS NOT NULL").fetch_one(pool).await?;
    if !kept {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(
        "DELETE FROM jobs j USING breakwater_bench.contacts k
           WHERE j.kind = 'erase_contact' AND j.tenant_id = k.tenant_id AND j.payload->>'contact_id' = k.id::text;
         DELETE FROM messages m USING breakwater_bench.messages k WHERE m.tenant_id = k.tenant_id AND m.id = k.id;
         DELETE FROM conversations c USING breakwater_bench.conversations k
           WHERE c.tenant_id = k.tenant_id AND c.id = k.id;
         DELETE FROM contacts c USING breakwater_bench.contacts k WHERE c.tenant_id = k.tenant_id AND c.id = k.id;
         INSERT INTO contacts SELECT * FROM breakwater_bench.contacts;
         INSERT INTO conversations SELECT * FROM breakwater_bench.conversations;
         INSERT INTO messages SELECT * FROM breakwater_bench.messages;
         DROP SCHEMA breakwater_bench CASCADE",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

struct Report<'a> {
    args: &'a Args,
    started: chrono::DateTime<chrono::Utc>,
    load_before: String,
    subjects: &'a [Subject],
    cases: &'a [Case],
    timings: &'a [Timing],
    erasures: &'a [(usize, Erasures)],
}

const SECTION: &str = "## Query latency on the skewed seed";

impl Report<'_> {
    async fn write(&self) -> anyhow::Result<()> {
        let root = root();
        let dir = root.join("docs/explain");
        std::fs::create_dir_all(&dir)?;
        for (case, timing) in self.cases.iter().zip(self.timings) {
            std::fs::write(dir.join(format!("{}.txt", case.key)), &timing.explain)?;
        }
        for (i, e) in self.erasures {
            std::fs::write(dir.join(format!("{}-erasure.txt", self.subjects[*i].key)), &e.total.explain)?;
        }
        let path = root.join("docs/PERFORMANCE.md");
        let current = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Performance\n".to_owned());
        std::fs::write(&path, replace_section(&current, SECTION, &self.markdown()))?;
        println!("wrote docs/PERFORMANCE.md and docs/explain/");
        Ok(())
    }

    #[allow(clippy::too_many_lines)]
    fn markdown(&self) -> String {
        let mut s = String::new();
        let load = self.load_before.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        let _ = writeln!(s, "{SECTION}\n");
        let _ = writeln!(
            s,
            "Measured by `cargo xtask bench-queries` on {} (load average {load} at the start), release build. \
             Each query is a `breakwater_domain` function, exactly as the API calls it, on one connection \
             with sqlx's prepared-statement cache: {} untimed runs, then {} timed ones, client-measured \
             over loopback. Page size {}. Plans: `EXPLAIN (ANALYZE, BUFFERS)` of the same statements, from \
             `auto_explain`, in [`docs/explain/`](explain/); the command fails if one scans `conversations`, \
             `messages` or `contacts` sequentially.\n",
            self.started.format("%Y-%m-%d"),
            self.args.warmup,
            self.args.runs,
            DEFAULT_PAGE_SIZE
        );
        for sub in self.subjects {
            let _ = writeln!(
                s,
                "- **{}** (`{}`): {} conversations, {} messages, {} contacts; longest conversation {} messages; \
                 biggest contact {} conversations.",
                sub.label,
                sub.key,
                sub.conversations,
                sub.messages,
                sub.contacts,
                sub.long_conversation.1,
                sub.big_contacts.first().map_or(0, |c| c.1)
            );
        }
        let big = self.subjects.first().map_or("", |x| x.label.as_str());
        let small = self.subjects.get(1).map_or("", |x| x.label.as_str());
        let _ = writeln!(s, "\n| query | {big} p50 ms | p99 ms | {small} p50 ms | p99 ms | plan |");
        let _ = writeln!(s, "|---|--:|--:|--:|--:|---|");
        let per_subject = self.cases.iter().filter(|c| c.subject == 0).count();
        for k in 0..per_subject {
            let (c0, t0) = (&self.cases[k], &self.timings[k]);
            let other = self.cases.iter().zip(self.timings).find(|(c, _)| {
                c.subject == 1 && c.key.trim_start_matches("small-") == c0.key.trim_start_matches("big-")
            });
            let (p50, p99, plan1) = other.map_or((String::new(), String::new(), String::new()), |(c, t)| {
                (ms(t.p50), ms(t.p99), format!(", [small](explain/{}.txt)", c.key))
            });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {p50} | {p99} | [big](explain/{}.txt){plan1}{} |",
                c0.title.replace('|', "/"),
                ms(t0.p50),
                ms(t0.p99),
                c0.key,
                if t0.seq_scan || other.is_some_and(|(_, t)| t.seq_scan) { " **seq scan**" } else { "" }
            );
        }
        for (i, e) in self.erasures {
            let sub = &self.subjects[*i];
            let (lo, hi) = e.sizes.iter().fold((i64::MAX, 0), |(lo, hi), (c, _)| (lo.min(*c), hi.max(*c)));
            let msgs: i64 = e.sizes.first().map_or(0, |x| x.1);
            let _ = writeln!(
                s,
                "| erasure, {}: request + erase job, {} contacts of {lo}-{hi} conversations (largest: {hi} \
                 conversations, {msgs} messages, {} ms) | {} | {} | | | [{}](explain/{}-erasure.txt) |",
                sub.label,
                e.sizes.len(),
                ms(e.largest),
                ms(e.total.p50),
                ms(e.total.p99),
                sub.key,
                sub.key
            );
            let _ = writeln!(
                s,
                "| &nbsp;&nbsp;of which the request (tombstone + job) | {} | {} | | | |",
                ms(e.request.p50),
                ms(e.request.p99)
            );
        }
        s.push_str(&self.goals());
        let _ = writeln!(
            s,
            "\nTo reproduce (the bench seeds an empty database with the full default itself; it erases \
             contacts and puts them back afterwards):\n\n```sh\ncargo run --release -p breakwater-seed -- \
             --database-url postgres://postgres@127.0.0.1:5432/breakwater_bench --reset\ncargo xtask \
             bench-queries --database-url postgres://postgres@127.0.0.1:5432/breakwater_bench\n```"
        );
        s
    }

    fn goals(&self) -> String {
        let big: Vec<(&Case, &Timing)> = self.cases.iter().zip(self.timings).filter(|(c, _)| c.subject == 0).collect();
        let worst = |prefix: &str, deep: Option<bool>| {
            big.iter()
                .filter(|(c, _)| c.key.starts_with(prefix) && deep.is_none_or(|d| c.key.ends_with("-deep") == d))
                .map(|(_, t)| t.p50)
                .max()
                .unwrap_or_default()
        };
        let inbox = worst("big-inbox", Some(false));
        let inbox_deep = worst("big-inbox", Some(true));
        let contacts = worst("big-contacts", None);
        let erasure = self.erasures.first().map(|(_, e)| e.total.p50).unwrap_or_default();
        let request = self.erasures.first().map(|(_, e)| e.request.p50).unwrap_or_default();
        let largest = self.erasures.first().map(|(_, e)| e.largest).unwrap_or_default();
        let verdict = |ok: bool| if ok { "met" } else { "**missed**" };
        let mut s = String::new();
        let _ = writeln!(s, "\nGoals on the 55% tenant (worst p50 of each group):\n");
        let _ = writeln!(s, "| goal | measured | |\n|---|--:|---|");
        let _ = writeln!(
            s,
            "| inbox page 1, every filter, <= 2 ms p50 | {} ms | {} |",
            ms(inbox),
            verdict(inbox <= Duration::from_millis(2))
        );
        let _ = writeln!(
            s,
            "| deep inbox pages as fast as page 1 | {} ms | {} |",
            ms(inbox_deep),
            verdict(inbox_deep <= inbox + inbox / 2 + Duration::from_micros(200))
        );
        let _ = writeln!(
            s,
            "| contacts list and searches <= 3 ms p50 (issue: 2 ms) | {} ms | {} |",
            ms(contacts),
            verdict(contacts <= Duration::from_millis(3))
        );
        let _ = writeln!(
            s,
            "| erasure request (the API's `DELETE`: tombstone + job) <= 50 ms | {} ms | {} |",
            ms(request),
            verdict(request <= Duration::from_millis(50))
        );
        let _ = writeln!(
            s,
            "| erasure, request + the job's deletion, <= 50 ms (p50 over the biggest contacts; the largest alone: {} ms) | {} ms | {} |",
            ms(largest),
            ms(erasure),
            verdict(erasure <= Duration::from_millis(50))
        );
        s
    }
}

/// The hand-written part of the section, kept when the measurements are rewritten.
const FINDINGS: &str = "\n### Findings";

/// Replaces the `## heading` section of a Markdown document (up to the next `## `), or appends it;
/// a `### Findings` subsection at its end is kept.
fn replace_section(doc: &str, heading: &str, section: &str) -> String {
    let kept = doc
        .find(&format!("\n{heading}\n"))
        .map(|start| {
            let body = &doc[start + 1..];
            let end = body[heading.len()..].find("\n## ").map_or(body.len(), |i| heading.len() + i + 1);
            let body = &body[..end];
            body.find(FINDINGS).map_or("", |f| body[f..].trim_end())
        })
        .unwrap_or_default()
        .to_owned();
    let section = format!("{}{}{kept}", section.trim_end(), if kept.is_empty() { "" } else { "\n" });
    let section = section.as_str();
    match doc.find(&format!("\n{heading}\n")) {
        Some(start) => {
            let body = start + 1;
            let end = doc[body + heading.len()..].find("\n## ").map_or(doc.len(), |i| body + heading.len() + i + 1);
            format!("{}{section}\n{}{}", &doc[..body], if end < doc.len() { "\n" } else { "" }, &doc[end..])
        }
        None => format!("{}\n\n{section}\n", doc.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_or_appended() {
        let doc = "# Performance\n\n## Seeding\n\nfast\n";
        let added = replace_section(doc, SECTION, "## Query latency on the skewed seed\n\nv1\n");
        assert_eq!(added, "# Performance\n\n## Seeding\n\nfast\n\n## Query latency on the skewed seed\n\nv1\n");
        let again = replace_section(&added, SECTION, "## Query latency on the skewed seed\n\nv2");
        assert_eq!(again, "# Performance\n\n## Seeding\n\nfast\n\n## Query latency on the skewed seed\n\nv2\n");
        let noted = format!("{again}\n### Findings\n\nnotes\n");
        let renewed = replace_section(&noted, SECTION, "## Query latency on the skewed seed\n\nv4");
        assert!(renewed.contains("v4\n\n### Findings\n\nnotes\n") && !renewed.contains("v2"), "{renewed}");
        let middle = format!("{again}\n## Later\n\nkept\n");
        let replaced = replace_section(&middle, SECTION, "## Query latency on the skewed seed\n\nv3");
        assert!(replaced.contains("v3\n\n## Later\n\nkept\n") && !replaced.contains("v2"), "{replaced}");
    }

    #[test]
    fn sequential_scans_of_the_big_tables_are_found() {
        assert!(seq_scan("  ->  Seq Scan on messages m  (cost=0.00..1.00 rows=1 width=8)"));
        assert!(seq_scan("Parallel Seq Scan on conversations  (cost=..."));
        assert!(!seq_scan("  ->  Seq Scan on idempotency_keys  (cost=..."));
        assert!(!seq_scan("  ->  Index Scan using messages_pkey on messages m"));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99), Duration::from_millis(99));
        assert_eq!(percentile(&v[..1], 99), Duration::from_millis(1));
    }
}
