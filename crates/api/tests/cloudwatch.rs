//! The CloudWatch lines (`METRICS_EMF_INTERVAL_SECS`): well-formed embedded-metric-format events
//! whose counts are each interval's and whose gauges are the layers' figures; and every metric
//! an alarm in `infra/cloudformation/alarms.yaml` watches is one the API or the worker publishes,
//! under the dimensions the alarm names.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use breakwater_api::emf::{Publisher, SERVICE};
use breakwater_domain::contacts::{self, NewContact};
use breakwater_domain::jobs::{self, NewJob};
use common::{TestApp, lock_contacts, spawn_with, tenant};
use serde_json::{Value, json};
use sqlx::PgPool;

/// One interval's lines as JSON, each checked against the format: the namespace, every
/// dimension a string member, every metric a number member.
async fn lines(publisher: &mut Publisher, app: &TestApp) -> Vec<Value> {
    let mut out = Vec::new();
    for line in publisher.lines(&app.running.state).await {
        let text = line.to_json();
        assert!(!text.contains('\n'), "one event per line: {text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        let directives = v["_aws"]["CloudWatchMetrics"].as_array().expect("directives");
        assert_eq!(directives.len(), 1, "{v}");
        let d = &directives[0];
        assert_eq!(d["Namespace"], "Breakwater", "{v}");
        assert!(v["_aws"]["Timestamp"].as_u64().is_some_and(|t| t > 1_700_000_000_000), "{v}");
        for set in d["Dimensions"].as_array().expect("dimension sets") {
            for name in set.as_array().expect("a set") {
                assert!(v[name.as_str().expect("a name")].is_string(), "dimension {name} in {v}");
            }
        }
        let metrics = d["Metrics"].as_array().expect("metrics");
        assert!(!metrics.is_empty());
        for m in metrics {
            let name = m["Name"].as_str().expect("a name");
            assert!(v[name].as_f64().is_some_and(f64::is_finite), "{name} in {v}");
            assert!(["Count", "Seconds", "Milliseconds", "None"].contains(&m["Unit"].as_str().expect("unit")));
        }
        out.push(v);
    }
    out
}

/// The task's line (dimensions Environment and Service only).
fn task_line(lines: &[Value]) -> &Value {
    let task: Vec<&Value> = lines.iter().filter(|l| l.get("Class").is_none()).collect();
    assert_eq!(task.len(), 1, "{lines:?}");
    assert_eq!(task[0]["Service"], SERVICE);
    task[0]
}

fn class_lines(lines: &[Value]) -> BTreeMap<String, &Value> {
    lines.iter().filter_map(|l| Some((l.get("Class")?.as_str()?.to_owned(), l))).collect()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn each_line_counts_its_own_interval_and_reads_the_layers(pool: PgPool) {
    let app = spawn_with(
        pool.clone(),
        &[
            // Three requests per user, then (for a hundred seconds) none.
            "--throttle-user-rate",
            "0.01",
            "--throttle-user-burst",
            "3",
            "--jobs-stats-ttl-ms",
            "0",
            "--jobs-stats-timeout-ms",
            "10000",
            // A handler gets a second (the shortest allowed), for the failure below.
            "--request-timeout-secs",
            "1",
        ],
    )
    .await;
    let t = tenant(&pool, "Acme").await;
    let ann = contacts::create(&pool, t.id, NewContact { name: "Ann".into(), email: None }).await.expect("contact").id;
    let mut tx = pool.begin().await.expect("tx");
    let due = NewJob {
        run_at: Some(chrono::Utc::now() - chrono::Duration::seconds(30)),
        ..NewJob::new(jobs::kind::NOOP, json!({}))
    };
    jobs::enqueue(&mut tx, due).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let mut publisher = Publisher::new("Breakwater", "test");

    // Five reads by the agent: three pass, two are throttled.
    let path = format!("/v1/contacts/{ann}");
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(app.get(&path, &t.agent_token).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let first = lines(&mut publisher, &app).await;
    let task = task_line(&first);
    assert_eq!(task["Environment"], "test");
    // The first 429 came from Redis inside the routed request. The bucket was then known to
    // refuse, so the second was answered before admission and routing: a throttle refusal, but
    // neither a routed request nor an admission.
    assert_eq!(task["Requests"], 4.0, "{task}");
    assert_eq!(task["Refused"], 1.0, "{task}");
    assert_eq!(task["ThrottleRefused"], 2.0, "{task}");
    assert_eq!(task["ServerErrors"], 0.0, "{task}");
    assert_eq!(task["AdmissionAdmitted"], 4.0, "{task}");
    assert_eq!(task["AdmissionShed"], 0.0, "{task}");
    assert_eq!(task["ThrottleDegraded"], 0.0, "{task}");
    assert_eq!(task["AdmissionInFlight"], 0.0, "{task}");
    let oldest = task["JobsOldestReadyAge"].as_f64().expect("oldest ready job");
    assert!((30.0..60.0).contains(&oldest), "{task}");
    assert!((0.0..1.0).contains(&task["JobsStatsAge"].as_f64().expect("stats age")), "{task}");
    // One line per admission class; their admissions add up to the task's; adaptive
    // admission publishes each class's limit.
    let classes = class_lines(&first);
    assert!(classes.contains_key("default"), "{classes:?}");
    assert_eq!(first.len(), classes.len() + 1);
    let admitted: f64 = classes.values().map(|c| c["AdmissionAdmitted"].as_f64().expect("admitted")).sum();
    assert!((admitted - 4.0).abs() < f64::EPSILON, "{classes:?}");
    assert!(classes.values().all(|c| c["AdmissionLimit"].as_f64().is_some_and(|l| l >= 1.0)), "{classes:?}");

    // The next interval holds only what happened in it; probes and scrapes are not requests.
    assert_eq!(app.get("/v1/contacts/00000000-0000-7000-8000-000000000000", &t.token).await.status.as_u16(), 404);
    assert_eq!(app.call(reqwest::Method::GET, "/health", None, None).await.status.as_u16(), 200);
    for probe in ["/health", "/ready", "/metrics"] {
        assert_eq!(app.ops(probe).await.status.as_u16(), 200, "{probe}");
    }
    let second = lines(&mut publisher, &app).await;
    let task = task_line(&second);
    assert_eq!(task["Requests"], 1.0, "{task}");
    assert_eq!(task["Refused"], 0.0, "{task}");
    assert_eq!(task["ThrottleRefused"], 0.0, "{task}");
    assert_eq!(task["AdmissionAdmitted"], 1.0, "{task}");
    assert_eq!(class_lines(&second)["default"]["AdmissionAdmitted"], 1.0);

    // A handler out of time is a failure, not a refusal, though both answer 503: the erasure
    // waits on Ann's row, locked here, past the request timeout.
    let blocker = lock_contacts(&pool, &[ann]).await;
    let r = app.call(reqwest::Method::DELETE, &path, Some(&t.token), None).await;
    assert_eq!((r.status.as_u16(), r.code()), (503, "request_timeout"), "{}", r.text);
    blocker.rollback().await.expect("release");
    let third = lines(&mut publisher, &app).await;
    let task = task_line(&third);
    assert_eq!(task["Requests"], 1.0, "{task}");
    assert_eq!(task["ServerErrors"], 1.0, "{task}");
    assert_eq!(task["Refused"], 0.0, "{task}");

    let fourth = lines(&mut publisher, &app).await;
    assert_eq!(task_line(&fourth)["Requests"], 0.0);
    assert_eq!(task_line(&fourth)["ServerErrors"], 0.0);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn with_admission_off_no_limit_is_published(pool: PgPool) {
    let app = spawn_with(pool, &["--admission", "off"]).await;
    let lines = lines(&mut Publisher::new("Breakwater", "test"), &app).await;
    let classes = class_lines(&lines);
    assert!(!classes.is_empty());
    assert!(classes.values().all(|c| c.get("AdmissionLimit").is_none()), "{classes:?}");
}

/// An alarm's metric in the app's namespace: its name, its dimension names, and the process it
/// is published by (the `Service` dimension's value).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Watched {
    name: String,
    dimensions: BTreeSet<String>,
    service: String,
}

/// Reads the app's metrics out of the alarms template. Each is written as
/// `Namespace: !Ref MetricsNamespace`, then at the same indentation `MetricName:` and
/// `Dimensions:` with `- Name:` items, each followed by its `Value:`; the block ends where the
/// indentation falls back.
fn watched(template: &str) -> Vec<Watched> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let lines: Vec<&str> = template.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != "Namespace: !Ref MetricsNamespace" {
            continue;
        }
        let depth = indent(line);
        let mut w = Watched { name: String::new(), dimensions: BTreeSet::new(), service: String::new() };
        let mut dimension = String::new();
        for l in lines[i + 1..].iter().take_while(|l| l.trim().is_empty() || indent(l) >= depth) {
            let t = l.trim().trim_start_matches("- ");
            if let Some(name) = t.strip_prefix("MetricName: ") {
                name.clone_into(&mut w.name);
            } else if let Some(dim) = t.strip_prefix("Name: ") {
                dim.clone_into(&mut dimension);
                w.dimensions.insert(dim.to_owned());
            } else if let Some(value) = t.strip_prefix("Value: ")
                && dimension == "Service"
            {
                value.clone_into(&mut w.service);
            }
        }
        assert!(!w.name.is_empty(), "a metric without a name after line {}", i + 1);
        out.push(w);
    }
    out
}

/// What a set of lines publishes, as the alarms name it.
fn published(lines: &[Value]) -> BTreeSet<Watched> {
    let mut out = BTreeSet::new();
    for line in lines {
        let dimensions: BTreeSet<String> = line["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
            .as_array()
            .expect("a set")
            .iter()
            .map(|d| d.as_str().expect("a name").to_owned())
            .collect();
        let service = line["Service"].as_str().expect("a service").to_owned();
        for m in line["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().expect("metrics") {
            let name = m["Name"].as_str().expect("a name").to_owned();
            out.insert(Watched { name, dimensions: dimensions.clone(), service: service.clone() });
        }
    }
    out
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_metric_an_alarm_watches_is_one_the_api_or_the_worker_publishes(pool: PgPool) {
    let app = spawn_with(pool.clone(), &["--jobs-stats-ttl-ms", "0", "--jobs-stats-timeout-ms", "10000"]).await;
    // The queue's figures are published once read.
    let mut lines = lines(&mut Publisher::new("Breakwater", "test"), &app).await;
    let worker = breakwater_worker::Worker::new(pool.clone(), breakwater_worker::WorkerOptions::default());
    let mut from_worker = breakwater_worker::emf::Publisher::new("Breakwater", "test", worker);
    lines.push(serde_json::from_str(&from_worker.line().to_json()).expect("JSON"));
    let published = published(&lines);
    assert!(published.iter().any(|p| p.service == "worker"), "{published:?}");

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let template = std::fs::read_to_string(root.join("infra/cloudformation/alarms.yaml")).expect("alarms template");
    let watched = watched(&template);
    assert!(watched.len() >= 8, "the alarms watch {} of the app's metrics", watched.len());
    // Every metric of the template is either the app's (read above) or the load balancer's: none
    // escaped the reading by being written another way.
    let named = template.lines().filter(|l| l.trim_start().starts_with("MetricName:")).count();
    let load_balancer = template.lines().filter(|l| l.trim() == "Namespace: AWS/ApplicationELB").count();
    assert_eq!(named, watched.len() + load_balancer, "metrics in alarms.yaml the test cannot place");
    let unknown: Vec<&Watched> = watched.iter().filter(|w| !published.contains(w)).collect();
    assert!(
        unknown.is_empty(),
        "watched but not published (name, dimensions, service): {unknown:?}\npublished: {published:?}"
    );
}
