//! The load and the rebuild: a small dependency-ordered task queue run by a few connections.
//!
//! Tasks: the `COPY` of each table; the build of each of its indexes (a primary key's unique
//! index included) once it is loaded; the attachment of its primary key once all its indexes are
//! built (`ADD CONSTRAINT ... USING INDEX` takes an exclusive lock, so it waits for nothing that
//! way); each foreign key once both its tables are keyed (added `NOT VALID`, then validated:
//! validation only takes a share lock on the referenced table, so it runs beside other work on
//! it); `ANALYZE` of each table last. A free connection takes the ready task with the longest
//! estimated path to the end, so the `COPY` of `messages` and what follows it start first while
//! the small tables are loaded, indexed and validated beside it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Executor, PgConnection, PgPool, Postgres};
use tokio::sync::{Notify, mpsc};

use crate::Error;
use crate::copy::{CHUNK_ROWS, Encoder, Table};
use crate::plan::Plan;
use crate::schema::{self, Detached, Kind};

/// One step of the load, when it ran (from the start of the load).
#[derive(Debug, Clone)]
pub struct Step {
    /// What it was.
    pub label: String,
    /// When it started.
    pub start: Duration,
    /// When it ended.
    pub end: Duration,
}

#[derive(Debug, Clone)]
enum Work {
    Copy(Table),
    Build(Detached),
    Attach(Vec<Detached>),
    Foreign(Detached),
    Analyze(Table),
}

#[derive(Debug)]
struct Task {
    work: Option<Work>,
    deps: Vec<usize>,
    cost: f64,
}

#[derive(Debug, Default)]
struct Queue {
    tasks: Vec<Task>,
    waiting_on: Vec<usize>,
    dependents: Vec<Vec<usize>>,
    priority: Vec<u64>,
    ready: BinaryHeap<(u64, Reverse<usize>)>,
    left: usize,
    failed: bool,
    steps: Vec<Step>,
}

impl Queue {
    fn push(&mut self, work: Work, deps: Vec<usize>, cost: f64) -> usize {
        self.tasks.push(Task { work: Some(work), deps, cost });
        self.tasks.len() - 1
    }

    /// Computes each task's critical path (tasks only depend on earlier ones) and readies the
    /// tasks that depend on nothing.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn start(&mut self) {
        let n = self.tasks.len();
        self.dependents = vec![Vec::new(); n];
        self.waiting_on = self.tasks.iter().map(|t| t.deps.len()).collect();
        for (i, t) in self.tasks.iter().enumerate() {
            for &d in &t.deps {
                self.dependents[d].push(i);
            }
        }
        let mut path = vec![0f64; n];
        for i in (0..n).rev() {
            let after = self.dependents[i].iter().map(|&d| path[d]).fold(0.0, f64::max);
            path[i] = self.tasks[i].cost + after;
        }
        self.priority = path.iter().map(|p| (p * 1_000.0) as u64).collect();
        self.left = n;
        for i in 0..n {
            if self.waiting_on[i] == 0 {
                self.ready.push((self.priority[i], Reverse(i)));
            }
        }
    }

    fn done(&mut self, i: usize) {
        self.left -= 1;
        for k in 0..self.dependents[i].len() {
            let d = self.dependents[i][k];
            self.waiting_on[d] -= 1;
            if self.waiting_on[d] == 0 {
                self.ready.push((self.priority[d], Reverse(d)));
            }
        }
    }
}

struct Bars {
    copies: HashMap<Table, ProgressBar>,
    indexes: ProgressBar,
    constraints: ProgressBar,
    analyze: ProgressBar,
}

impl Bars {
    fn new(plan: &Plan, detached: &[Detached], visible: bool) -> Self {
        let multi = MultiProgress::with_draw_target(if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let style = ProgressStyle::with_template(
            "{prefix:>14} [{bar:30}] {human_pos:>9}/{human_len:9} {per_sec:>12} {elapsed:>4} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        let bar = |name: &str, len: usize| {
            let b = multi.add(ProgressBar::new(len as u64).with_style(style.clone()).with_prefix(name.to_owned()));
            b.tick();
            b
        };
        let copies = Table::ALL.iter().map(|&t| (t, bar(t.name(), t.rows(plan)))).collect();
        let count = |k: Kind| detached.iter().filter(|d| d.kind == k).count();
        Self {
            copies,
            indexes: bar("indexes", count(Kind::Index) + count(Kind::Key)),
            constraints: bar("constraints", count(Kind::Key) + count(Kind::Foreign)),
            analyze: bar("analyze", Table::ALL.len()),
        }
    }
}

/// Estimated cost of a step, in arbitrary units per row, for the critical-path priorities.
fn copy_cost(table: Table) -> f64 {
    match table {
        Table::Messages => 3.0,
        Table::Conversations => 3.5,
        _ => 2.0,
    }
}

fn table_of(name: &str) -> Option<Table> {
    Table::ALL.iter().copied().find(|t| t.name() == name)
}

#[allow(clippy::cast_precision_loss)]
fn rows_f(plan: &Plan, table: Option<Table>) -> f64 {
    table.map_or(0.0, |t| t.rows(plan) as f64)
}

fn build_queue(plan: &Plan, detached: &[Detached]) -> Queue {
    let mut q = Queue::default();
    let mut copy = HashMap::new();
    for &t in &Table::ALL {
        copy.insert(t, q.push(Work::Copy(t), Vec::new(), rows_f(plan, Some(t)) * copy_cost(t)));
    }
    let mut ready = HashMap::new();
    for &t in &Table::ALL {
        let mut builds = Vec::new();
        for d in detached.iter().filter(|d| d.kind != Kind::Foreign && table_of(&d.table) == Some(t)) {
            builds.push(q.push(Work::Build(d.clone()), vec![copy[&t]], rows_f(plan, Some(t))));
        }
        let keys: Vec<Detached> =
            detached.iter().filter(|d| d.kind == Kind::Key && table_of(&d.table) == Some(t)).cloned().collect();
        builds.push(copy[&t]);
        ready.insert(t, q.push(Work::Attach(keys), builds, 1.0));
    }
    let mut last_on: HashMap<String, usize> = HashMap::new();
    let mut touching: HashMap<Table, Vec<usize>> = HashMap::new();
    for d in detached.iter().filter(|d| d.kind == Kind::Foreign) {
        let from = table_of(&d.table);
        let to = d.referenced.as_deref().and_then(table_of);
        let mut deps: Vec<usize> = [from, to].iter().flatten().map(|t| ready[t]).collect();
        // Validations of one table's foreign keys lock each other out: chain them.
        deps.extend(last_on.get(&d.table).copied());
        let i = q.push(Work::Foreign(d.clone()), deps, rows_f(plan, from) * 0.6);
        last_on.insert(d.table.clone(), i);
        for t in [from, to].into_iter().flatten() {
            touching.entry(t).or_default().push(i);
        }
    }
    for &t in &Table::ALL {
        let mut deps = touching.remove(&t).unwrap_or_default();
        deps.push(ready[&t]);
        q.push(Work::Analyze(t), deps, rows_f(plan, Some(t)) * 0.05);
    }
    q.start();
    q
}

impl Work {
    fn label(&self) -> String {
        match self {
            Self::Copy(t) => format!("copy {}", t.name()),
            Self::Build(d) => format!("build {}", d.name),
            Self::Attach(keys) => {
                format!("attach {}", keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", "))
            }
            Self::Foreign(d) => format!("validate {}", d.name),
            Self::Analyze(t) => format!("analyze {}", t.name()),
        }
    }
}

/// Loads the plan and rebuilds `detached`, on `connections` connections. Returns how long each
/// table's `COPY` took, and when each step ran.
pub(crate) async fn run(
    pool: &PgPool,
    plan: &Arc<Plan>,
    detached: &[Detached],
    connections: usize,
    progress: bool,
) -> Result<(HashMap<Table, Duration>, Vec<Step>), Error> {
    let started = Instant::now();
    let bars = Arc::new(Bars::new(plan, detached, progress));
    let shared = Arc::new((Mutex::new(build_queue(plan, detached)), Notify::new()));
    let timings = Arc::new(Mutex::new(HashMap::new()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let mut conn = pool.acquire().await?;
        conn.execute("SET maintenance_work_mem = '256MB'; SET synchronous_commit = off").await?;
        let (shared, plan, bars, timings) = (shared.clone(), plan.clone(), bars.clone(), timings.clone());
        workers.spawn(async move { worker(conn, &shared, &plan, &bars, &timings, started).await });
    }
    while let Some(joined) = workers.join_next().await {
        let outcome = joined.map_err(|e| Error::Thread(e.to_string())).and_then(|r| r);
        if let Err(e) = outcome {
            workers.abort_all();
            return Err(e);
        }
    }
    let timings = timings.lock().expect("not poisoned").clone();
    let mut steps = std::mem::take(&mut shared.0.lock().expect("not poisoned").steps);
    steps.sort_by_key(|s| s.start);
    Ok((timings, steps))
}

async fn worker(
    mut conn: PoolConnection<Postgres>,
    shared: &(Mutex<Queue>, Notify),
    plan: &Arc<Plan>,
    bars: &Bars,
    timings: &Mutex<HashMap<Table, Duration>>,
    started: Instant,
) -> Result<(), Error> {
    let (queue, wake) = shared;
    loop {
        let notified = wake.notified();
        let next = {
            let mut q = queue.lock().expect("not poisoned");
            if q.failed || q.left == 0 {
                return Ok(());
            }
            q.ready.pop().map(|(_, Reverse(i))| (i, q.tasks[i].work.take()))
        };
        let Some((i, Some(work))) = next else {
            notified.await;
            continue;
        };
        let label = work.label();
        let start = started.elapsed();
        let outcome = run_task(&mut conn, plan, bars, timings, work).await;
        let mut q = queue.lock().expect("not poisoned");
        match outcome {
            Ok(()) => {
                q.steps.push(Step { label, start, end: started.elapsed() });
                q.done(i);
            }
            Err(e) => {
                q.failed = true;
                wake.notify_waiters();
                return Err(e);
            }
        }
        drop(q);
        wake.notify_waiters();
    }
}

/// Runs a task; a DDL step is run again if PostgreSQL broke a deadlock by cancelling it (two
/// steps on tables that reference each other can, rarely, each wait for a lock the other holds).
async fn run_task(
    conn: &mut PgConnection,
    plan: &Arc<Plan>,
    bars: &Bars,
    timings: &Mutex<HashMap<Table, Duration>>,
    work: Work,
) -> Result<(), Error> {
    let mut attempt = 0;
    loop {
        match step(conn, plan, bars, timings, &work).await {
            Err(Error::Database(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some("40P01") && attempt < 5 && !matches!(work, Work::Copy(_)) =>
            {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            other => return other,
        }
    }
}

async fn step(
    conn: &mut PgConnection,
    plan: &Arc<Plan>,
    bars: &Bars,
    timings: &Mutex<HashMap<Table, Duration>>,
    work: &Work,
) -> Result<(), Error> {
    match work {
        Work::Copy(table) => {
            let started = Instant::now();
            copy_table(conn, plan, *table, &bars.copies[table]).await?;
            let took = started.elapsed();
            bars.copies[table].finish();
            timings.lock().expect("not poisoned").insert(*table, took);
        }
        Work::Build(d) => {
            let mut tx = conn.begin().await?;
            (&mut *tx).execute(&d.create_sql as &str).await?;
            if d.kind == Kind::Index {
                schema::restored(&mut tx, &d.name).await?;
            }
            tx.commit().await?;
            bars.indexes.inc(1);
        }
        Work::Attach(keys) => {
            for d in keys {
                let mut tx = conn.begin().await?;
                (&mut *tx).execute(d.attach_sql.as_deref().unwrap_or_default() as &str).await?;
                schema::restored(&mut tx, &d.name).await?;
                tx.commit().await?;
                bars.constraints.inc(1);
            }
        }
        Work::Foreign(d) => {
            // Added NOT VALID (a brief lock), then validated in its own transaction (a lock that
            // lets the referenced table be read and analysed meanwhile).
            let exists = sqlx::query_scalar!(
                r#"SELECT EXISTS (SELECT 1 FROM pg_constraint
                                  WHERE conname = $1 AND conrelid = to_regclass($2)) AS "exists!""#,
                d.name,
                d.table
            )
            .fetch_one(&mut *conn)
            .await?;
            if !exists {
                (&mut *conn).execute(&d.create_sql as &str).await?;
            }
            (&mut *conn).execute(d.attach_sql.as_deref().unwrap_or_default() as &str).await?;
            schema::restored(conn, &d.name).await?;
            bars.constraints.inc(1);
        }
        Work::Analyze(table) => {
            (&mut *conn).execute(&format!("ANALYZE {}", table.name()) as &str).await?;
            bars.analyze.inc(1);
            if bars.analyze.position() == bars.analyze.length().unwrap_or(0) {
                bars.indexes.finish();
                bars.constraints.finish();
                bars.analyze.finish();
            }
        }
    }
    Ok(())
}

/// Truncates the table and writes all its rows with one binary `COPY ... FREEZE` in the same
/// transaction, while encoder threads prepare the next chunks (in order: the table is written in
/// key order, which is time order).
async fn copy_table(conn: &mut PgConnection, plan: &Arc<Plan>, table: Table, bar: &ProgressBar) -> Result<(), Error> {
    let rows = table.rows(plan);
    let chunks = rows.div_ceil(CHUNK_ROWS);
    let encoders = if rows > 200_000 { 2 } else { 1 };
    let mut lanes = Vec::with_capacity(encoders);
    let mut threads = Vec::with_capacity(encoders);
    for lane in 0..encoders {
        let (send, receive) = mpsc::channel::<(Vec<u8>, usize)>(3);
        lanes.push(receive);
        let plan = plan.clone();
        threads.push(tokio::task::spawn_blocking(move || {
            for chunk in (lane..chunks).step_by(encoders) {
                let range = chunk * CHUNK_ROWS..((chunk + 1) * CHUNK_ROWS).min(rows);
                let n = range.len();
                if send.blocking_send((table.encode(&plan, range), n)).is_err() {
                    return;
                }
            }
        }));
    }

    let mut tx = conn.begin().await?;
    (&mut *tx).execute(&format!("TRUNCATE {}", table.name()) as &str).await?;
    let statement = format!("COPY {} ({}) FROM STDIN WITH (FORMAT binary, FREEZE)", table.name(), table.columns());
    let mut copy = tx.copy_in_raw(&statement).await?;
    copy.send(Encoder::header()).await?;
    for chunk in 0..chunks {
        let Some((bytes, n)) = lanes[chunk % encoders].recv().await else {
            return Err(Error::Thread(format!("the {} encoder stopped", table.name())));
        };
        copy.send(bytes).await?;
        bar.inc(n as u64);
    }
    copy.send(Encoder::trailer()).await?;
    copy.finish().await?;
    tx.commit().await?;
    for t in threads {
        t.await.map_err(|e| Error::Thread(e.to_string()))?;
    }
    Ok(())
}
