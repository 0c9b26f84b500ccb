//! `/metrics` after a scripted burst: the admission, throttle, pool, job queue and runtime series
//! hold the values the responses imply; and every metric the Grafana dashboard queries is one
//! the app exports.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use breakwater_domain::contacts::{self, NewContact};
use breakwater_domain::jobs::{self, NewJob};
use common::{TestApp, lock_contacts, spawn_with, tenant};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

/// One sample of the exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text exposition's samples (enough of the format for our own output: label
/// values without escaped quotes or commas).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => {
                    let body = rest.strip_suffix('}').expect("closing brace");
                    let labels = body
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').expect("k=v");
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (n.to_owned(), labels)
                }
                None => (series.to_owned(), BTreeMap::new()),
            };
            Sample { name, labels, value: value.parse().expect("a number") }
        })
        .collect()
}

/// The value of the one sample named `name` with (at least) these labels.
fn value(all: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<&Sample> = all
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .collect();
    assert!(matching.len() <= 1, "{name}{labels:?} is ambiguous: {matching:?}");
    matching.first().map(|s| s.value)
}

async fn scrape(app: &TestApp) -> Vec<Sample> {
    let r = app.send(app.http.get(app.ops_url("/metrics"))).await;
    assert_eq!(r.status, StatusCode::OK);
    samples(&r.text)
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_burst_shows_up_in_the_admission_throttle_pool_and_queue_series(pool: PgPool) {
    // One request at a time in the default class, nobody waits: a second one is shed.
    let mut args = common::ONE_STATIC_SLOT.to_vec();
    args.extend([
        "--admission-queue",
        "0",
        // Three requests per user, then (for a hundred seconds) none.
        "--throttle-user-rate",
        "0.01",
        "--throttle-user-burst",
        "3",
        "--db-pool-size",
        "3",
        // Fresh queue figures on every scrape, however slow the machine.
        "--jobs-stats-ttl-ms",
        "0",
        "--jobs-stats-timeout-ms",
        "10000",
    ]);
    let app = spawn_with(pool.clone(), &args).await;
    let t = tenant(&pool, "Acme").await;
    let new = |name: &str, email: &str| NewContact { name: name.into(), email: Some(email.into()) };
    let ann = contacts::create(&pool, t.id, new("Ann", "ann@example.com")).await.expect("contact").id;
    let bob = contacts::create(&pool, t.id, new("Bob", "bob@example.com")).await.expect("contact").id;
    // Two due jobs, the older one due 30 s ago, for the queue series.
    let mut tx = pool.begin().await.expect("tx");
    for ago in [30, 5] {
        let job = NewJob {
            run_at: Some(chrono::Utc::now() - chrono::Duration::seconds(ago)),
            ..NewJob::new(jobs::kind::NOOP, json!({}))
        };
        jobs::enqueue(&mut tx, job).await.expect("enqueue");
    }
    tx.commit().await.expect("commit");

    // Throttles: five reads by the agent, one after another; the burst of three passes.
    let path = format!("/v1/contacts/{ann}");
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(app.get(&path, &t.agent_token).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);

    // Admission: the admin's erasure of Bob holds the only slot (it waits on Bob's row lock);
    // four more requests meanwhile are shed at once.
    let blocker = lock_contacts(&pool, &[bob]).await;
    let slow = common::erase_in_background(&app, &t.token, bob);
    let mut held = false;
    for _ in 0..100 {
        if value(&scrape(&app).await, "breakwater_admission_in_flight", &[("class", "default")]) == Some(1.0) {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(held, "the erasure never took the slot");
    let mut shed = 0;
    for _ in 0..4 {
        let r = app.get(&path, &t.token).await;
        assert_eq!((r.status, r.code()), (StatusCode::SERVICE_UNAVAILABLE, "load_shed"), "{}", r.text);
        shed += 1;
    }
    let during = scrape(&app).await;
    assert_eq!(value(&during, "breakwater_bulkhead_in_use", &[]), Some(1.0), "the erasure holds a database slot");
    assert!(value(&during, "breakwater_pool_connections", &[]).expect("pool") >= 1.0);
    blocker.rollback().await.expect("release");
    assert_eq!(slow.await.expect("task").expect("response"), StatusCode::ACCEPTED);
    // The slot is released once the response has been sent.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let m = scrape(&app).await;
    let default = [("class", "default")];
    assert_eq!(value(&m, "breakwater_admission_limit", &default), Some(1.0));
    assert_eq!(value(&m, "breakwater_admission_in_flight", &default), Some(0.0));
    assert_eq!(value(&m, "breakwater_admission_queue_depth", &default), Some(0.0));
    // Four reads by the agent and the erasure were admitted (the agent's fifth was answered by
    // the throttles before admission: its bucket was known to refuse); the admin's four reads
    // were shed.
    assert_eq!(value(&m, "breakwater_admission_admitted_total", &default), Some(5.0));
    assert_eq!(
        value(&m, "breakwater_admission_shed_total", &[("class", "default"), ("reason", "queue_full")]),
        Some(shed.into())
    );
    assert_eq!(
        value(&m, "breakwater_admission_shed_total", &[("class", "default"), ("reason", "queue_timeout")]),
        Some(0.0)
    );
    // The throttles checked what admission let through, and refused the agent's last two: the
    // first from Redis, the second ahead of admission.
    assert_eq!(value(&m, "breakwater_throttle_checks_total", &[]), Some(5.0));
    assert_eq!(value(&m, "breakwater_throttle_refused_total", &[("kind", "user")]), Some(2.0));
    assert_eq!(value(&m, "breakwater_throttle_refused_ahead_total", &[]), Some(1.0));
    assert_eq!(value(&m, "breakwater_throttle_refused_total", &[("kind", "tenant")]), Some(0.0));
    assert_eq!(value(&m, "breakwater_throttle_degraded", &[]), Some(0.0));
    // Requests by route and outcome: shed ones never reached the router.
    let route = |outcome| [("route", "/v1/contacts/{id}"), ("method", "GET"), ("outcome", outcome)];
    assert_eq!(value(&m, "breakwater_http_requests_total", &route("ok")), Some(3.0));
    assert_eq!(value(&m, "breakwater_http_requests_total", &route("refused")), Some(1.0));
    assert_eq!(value(&m, "breakwater_http_request_duration_seconds_count", &route("ok")), Some(3.0));
    // The bulkhead and the pool: three slots, none held now, nobody refused.
    assert_eq!(value(&m, "breakwater_bulkhead_slots", &[]), Some(3.0));
    assert_eq!(value(&m, "breakwater_bulkhead_in_use", &[]), Some(0.0));
    assert_eq!(value(&m, "breakwater_bulkhead_acquire_timeouts_total", &[]), Some(0.0));
    // (The pool is the test harness's, so its size is not ours to set; the bulkhead's is.)
    let open = value(&m, "breakwater_pool_connections", &[]).expect("pool size");
    let idle = value(&m, "breakwater_pool_idle_connections", &[]).expect("idle");
    assert!(open >= 1.0 && idle <= open, "open {open}, idle {idle}");
    // The queue: the two no-ops wait, the oldest for 30 s; the erasure job is due too.
    assert_eq!(value(&m, "breakwater_jobs", &[("kind", "noop"), ("state", "ready")]), Some(2.0));
    assert_eq!(value(&m, "breakwater_jobs", &[("kind", "erase_contact"), ("state", "ready")]), Some(1.0));
    assert_eq!(value(&m, "breakwater_jobs", &[("kind", "noop"), ("state", "running")]), Some(0.0));
    let oldest = value(&m, "breakwater_jobs_oldest_ready_age_seconds", &[]).expect("age");
    assert!((30.0..60.0).contains(&oldest), "oldest ready job: {oldest} s");
    let age = value(&m, "breakwater_jobs_stats_age_seconds", &[]).expect("stats age");
    assert!((0.0..1.0).contains(&age), "a TTL of 0 reads the queue on every scrape: {age}");
    // The runtime sampler has run at least once.
    assert!(value(&m, "breakwater_tokio_workers", &[]).expect("workers") >= 1.0);
    assert!(value(&m, "breakwater_tokio_alive_tasks", &[]).expect("tasks") >= 1.0);

    // The same queue figures on /v1/ops/status.
    let status = app.ops("/v1/ops/status").await;
    let jobs = &status.body["layers"]["jobs"];
    assert_eq!(jobs["ready"], 3, "{jobs}");
    assert!(jobs["oldest_ready_age_seconds"].as_f64().expect("age") >= 30.0, "{jobs}");
    assert!(jobs["age_seconds"].as_f64().is_some(), "{jobs}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_queue_figures_are_cached_and_a_slow_database_cannot_hang_a_scrape(pool: PgPool) {
    let app = spawn_with(pool.clone(), &["--jobs-stats-ttl-ms", "60000", "--jobs-stats-timeout-ms", "10000"]).await;
    let first = scrape(&app).await;
    assert!(value(&first, "breakwater_jobs_stats_age_seconds", &[]).is_some_and(|a| a >= 0.0), "answered");
    assert_eq!(value(&first, "breakwater_jobs_oldest_ready_age_seconds", &[]), Some(0.0));
    // A job enqueued now is not seen until the cached figures expire.
    let mut tx = pool.begin().await.expect("tx");
    jobs::enqueue(&mut tx, NewJob::new(jobs::kind::NOOP, json!({}))).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let cached = scrape(&app).await;
    assert_eq!(value(&cached, "breakwater_jobs", &[("kind", "noop"), ("state", "ready")]), None);

    // A stats query stuck behind a lock: scrapes still answer within the timeout, say how old
    // their figures are, and start no second query while the first waits.
    let app = spawn_with(pool.clone(), &["--jobs-stats-ttl-ms", "0", "--jobs-stats-timeout-ms", "200"]).await;
    let mut blocker = pool.begin().await.expect("tx");
    sqlx::query("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE").execute(&mut *blocker).await.expect("lock");
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let stuck = scrape(&app).await;
        assert!(started.elapsed() < Duration::from_secs(2), "scrape took {:?}", started.elapsed());
        assert_eq!(value(&stuck, "breakwater_jobs_stats_age_seconds", &[]), Some(-1.0), "never answered yet");
    }
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(&pool)
    .await
    .expect("activity");
    assert_eq!(waiting, 1, "one stats query at a time");
    blocker.rollback().await.expect("release");
    // The query lands by itself; a later scrape serves it.
    let mut fresh = Vec::new();
    for _ in 0..50 {
        fresh = scrape(&app).await;
        if value(&fresh, "breakwater_jobs_stats_age_seconds", &[]).is_some_and(|a| a >= 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(value(&fresh, "breakwater_jobs", &[("kind", "noop"), ("state", "ready")]), Some(1.0));
    assert_eq!(value(&fresh, "breakwater_jobs_stats_failures_total", &[]), Some(0.0));
}

/// Every series name a scrape can hold, from the `# TYPE` lines (counters gain `_total`,
/// histograms `_bucket`, `_sum` and `_count`).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let (name, kind) = rest.split_once(' ').expect("name and type");
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The metric names a PromQL expression reads (ours all start with `breakwater_`).
fn queried_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("breakwater_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_dashboard_and_the_alerts_query_only_metrics_the_app_exports(pool: PgPool) {
    let app = spawn_with(pool.clone(), &["--jobs-stats-ttl-ms", "0", "--jobs-stats-timeout-ms", "10000"]).await;
    // A family appears once it has a series: one request and one job.
    assert_eq!(app.call(reqwest::Method::GET, "/health", None, None).await.status, StatusCode::OK);
    let mut tx = pool.begin().await.expect("tx");
    jobs::enqueue(&mut tx, NewJob::new(jobs::kind::NOOP, json!({}))).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let text = app.send(app.http.get(app.ops_url("/metrics"))).await.text;
    let exported = exported_names(&text);
    assert!(exported.contains("breakwater_http_requests_total"), "{exported:?}");

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("infra/grafana/breakwater.json")).expect("dashboard"))
            .expect("dashboard JSON");
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 10, "the dashboard has {} queries", queries.len());
    // The alerts in docs/OPERATIONS.md: every `promql` block.
    let operations = std::fs::read_to_string(root.join("docs/OPERATIONS.md")).expect("operations guide");
    let mut in_block = false;
    let mut alerts = 0;
    for line in operations.lines() {
        if line.trim_start().starts_with("```") {
            in_block = line.trim_start() == "```promql";
            continue;
        }
        if in_block && !line.trim().is_empty() {
            queries.push(line.to_owned());
            alerts += 1;
        }
    }
    assert!(alerts >= 5, "docs/OPERATIONS.md has {alerts} PromQL lines");

    let mut unknown = BTreeSet::new();
    let mut used = 0;
    for q in &queries {
        for name in queried_names(q) {
            used += 1;
            if !exported.contains(&name) {
                unknown.insert(name);
            }
        }
    }
    assert!(used > 0);
    assert!(unknown.is_empty(), "queried but not exported: {unknown:?}");
}
