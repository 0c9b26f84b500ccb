//! Every figure of the list (`breakwater_api::figures`) is in each of the three views, or says
//! why not; and nothing is in a view but through the list.
//!
//! The shape of the three views of the app's figures, pinned: `/metrics` (every `# HELP` and
//! `# TYPE` line, every series with its labels), the CloudWatch lines (dimensions, metric names
//! and units) and `/v1/ops/status` (every member and the kind of its value), rendered from a
//! known state and compared with `tests/figures/shape.txt`. Values are reduced to their kind
//! (an integer, a float, a string, null), since uptimes and latencies vary; what the values are
//! is tested by `metrics.rs`, `cloudwatch.rs` and the tests of each layer. A change of a name,
//! a label, a help text, a unit or the JSON's shape fails here: dashboards, alarms and clients
//! read them. Run with `BLESS=1` to rewrite the file after an intended change, and say why in
//! the commit.

mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use breakwater_api::emf::Publisher;
use breakwater_api::figures::{self, Presence};
use breakwater_domain::contacts::{self, NewContact};
use breakwater_domain::jobs::{self, NewJob};
use common::{TestApp, spawn_with, tenant};
use serde_json::{Value, json};
use sqlx::PgPool;

/// A sample's value by kind: the text encoder writes integers without a point.
fn kind_of_sample(value: &str) -> &'static str {
    if value.parse::<i64>().is_ok() { "<int>" } else { "<float>" }
}

/// `/metrics` with each sample's value reduced to its kind, and each family's samples sorted (a
/// family keeps its series in a hash map).
fn metrics_shape(text: &str) -> String {
    fn flush(samples: &mut Vec<String>, out: &mut String) {
        samples.sort();
        for s in samples.drain(..) {
            out.push_str(&s);
        }
    }
    let mut out = String::new();
    let mut samples: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut samples, &mut out);
            writeln!(out, "{line}").expect("write");
        } else if let Some((series, value)) = line.rsplit_once(' ') {
            samples.push(format!("{series} {}\n", kind_of_sample(value)));
        }
    }
    flush(&mut samples, &mut out);
    out
}

fn kind_of_json(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "<bool>",
        Value::Number(n) if n.is_i64() || n.is_u64() => "<int>",
        Value::Number(_) => "<float>",
        Value::String(_) => "<string>",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every member of a JSON document by its path, with the kind of its value; strings that name a
/// state are kept (`"state": "ok"`), the build's version is not.
fn json_shape(path: &str, v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            writeln!(out, "{path} object").expect("write");
            for (k, v) in map {
                json_shape(&format!("{path}/{k}"), v, out);
            }
        }
        Value::Array(items) => {
            writeln!(out, "{path} array").expect("write");
            for (i, v) in items.iter().enumerate() {
                json_shape(&format!("{path}/{i}"), v, out);
            }
        }
        Value::String(s) if !path.ends_with("/version") => writeln!(out, "{path} {s:?}").expect("write"),
        _ => writeln!(out, "{path} {}", kind_of_json(v)).expect("write"),
    }
}

/// The CloudWatch lines: each line's dimensions, then its metrics (name and unit; every value
/// is a JSON float) sorted by name, since the order of a directive's metrics means nothing to CloudWatch.
fn emf_shape(lines: &[Value]) -> String {
    let mut out = String::new();
    for line in lines {
        let directive = &line["_aws"]["CloudWatchMetrics"][0];
        let dimensions: Vec<String> = directive["Dimensions"][0]
            .as_array()
            .expect("a set")
            .iter()
            .map(|d| {
                let name = d.as_str().expect("a name");
                format!("{name}={}", line[name].as_str().expect("a string"))
            })
            .collect();
        writeln!(out, "line {} in {}", dimensions.join(","), directive["Namespace"].as_str().expect("ns")).expect("w");
        let mut metrics: Vec<String> = directive["Metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .map(|m| format!("  {} {}", m["Name"].as_str().expect("a name"), m["Unit"].as_str().expect("a unit")))
            .collect();
        metrics.sort();
        for m in metrics {
            writeln!(out, "{m}").expect("write");
        }
    }
    out
}

/// A state every labelled family has series in: a routed request of each outcome, a
/// throttled user, a due job.
async fn known_state(pool: &PgPool) -> TestApp {
    let app = spawn_with(
        pool.clone(),
        &[
            "--throttle-user-rate",
            "0.01",
            "--throttle-user-burst",
            "2",
            "--jobs-stats-ttl-ms",
            "0",
            "--jobs-stats-timeout-ms",
            "10000",
        ],
    )
    .await;
    let t = tenant(pool, "Acme").await;
    let ann = contacts::create(pool, t.id, NewContact { name: "Ann".into(), email: None }).await.expect("contact").id;
    let mut tx = pool.begin().await.expect("tx");
    jobs::enqueue(&mut tx, NewJob::new(jobs::kind::NOOP, json!({}))).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let path = format!("/v1/contacts/{ann}");
    let statuses: Vec<u16> = [
        app.get(&path, &t.agent_token).await,
        app.get("/v1/contacts/00000000-0000-7000-8000-000000000000", &t.agent_token).await,
        app.get(&path, &t.agent_token).await,
    ]
    .iter()
    .map(|r| r.status.as_u16())
    .collect();
    assert_eq!(statuses, [200, 404, 429]);
    app
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_views_keep_their_names_labels_help_and_shape(pool: PgPool) {
    let app = known_state(&pool).await;
    let mut publisher = Publisher::new("Breakwater", "test");
    let emf: Vec<Value> = publisher
        .lines(&app.running.state)
        .await
        .iter()
        .map(|l| serde_json::from_str(&l.to_json()).expect("JSON"))
        .collect();
    let metrics = app.send(app.http.get(app.ops_url("/metrics"))).await;
    let status = app.ops("/v1/ops/status").await;

    let mut shape = String::from("# /metrics\n");
    shape.push_str(&metrics_shape(&metrics.text));
    shape.push_str("\n# CloudWatch lines\n");
    shape.push_str(&emf_shape(&emf));
    shape.push_str("\n# /v1/ops/status\n");
    json_shape("", &status.body, &mut shape);

    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/figures/shape.txt");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&file, &shape).expect("write the shape");
        return;
    }
    let pinned = std::fs::read_to_string(&file).expect("tests/figures/shape.txt (BLESS=1 writes it)");
    if pinned != shape {
        let pinned_lines: Vec<&str> = pinned.lines().collect();
        let now_lines: Vec<&str> = shape.lines().collect();
        let gone: Vec<&&str> = pinned_lines.iter().filter(|l| !now_lines.contains(l)).collect();
        let new: Vec<&&str> = now_lines.iter().filter(|l| !pinned_lines.contains(l)).collect();
        panic!("the views changed (BLESS=1 to accept)\nno longer there: {gone:#?}\nnew: {new:#?}\nnow:\n{shape}");
    }
}

/// The member `pointer` names in `/v1/ops/status`, for a series labelled `labels`: `{label}` is
/// that label's value, and a step into an array picks the element holding that value.
fn member<'v>(root: &'v Value, pointer: &str, labels: &[(&'static str, String)]) -> Option<&'v Value> {
    let mut at = root;
    for step in pointer.split('/').skip(1) {
        let step = match step.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(label) => labels.iter().find(|(k, _)| *k == label)?.1.as_str(),
            None => step,
        };
        at = match at {
            Value::Array(items) => {
                items.iter().find(|i| i.as_object().is_some_and(|o| o.values().any(|v| v.as_str() == Some(step))))?
            }
            Value::Object(map) => map.get(step)?,
            _ => return None,
        };
    }
    Some(at)
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_figure_is_in_every_view_or_says_why_not(pool: PgPool) {
    let app = known_state(&pool).await;
    let state = &app.running.state;
    let figures = figures::read(state, state.queue_stats.get(&state.pool).await);
    let emf: Vec<Value> = Publisher::new("Breakwater", "test")
        .lines(state)
        .await
        .iter()
        .map(|l| serde_json::from_str(&l.to_json()).expect("JSON"))
        .collect();
    let in_emf: BTreeSet<String> = emf
        .iter()
        .flat_map(|l| l["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().expect("metrics").clone())
        .map(|m| m["Name"].as_str().expect("a name").to_owned())
        .collect();
    let text = app.send(app.http.get(app.ops_url("/metrics"))).await.text;
    let in_prometheus: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE breakwater_"))
        .map(|l| l.split_once(' ').expect("name and type").0.to_owned())
        .collect();
    let status = app.ops("/v1/ops/status").await.body;

    let mut wrong = Vec::new();
    let mut from_figures_prometheus = BTreeSet::new();
    let mut from_figures_emf = BTreeSet::new();
    for f in figures.iter() {
        match &f.prometheus {
            Presence::At(()) => {
                from_figures_prometheus.insert(f.name.to_owned());
                if f.is_shown() && !in_prometheus.contains(f.name) {
                    wrong.push(format!("{}: not in /metrics", f.name));
                }
            }
            Presence::Absent(_) if in_prometheus.contains(f.name) => {
                wrong.push(format!("{}: in /metrics, though marked absent", f.name));
            }
            Presence::Absent(_) => {}
            Presence::Unsaid => wrong.push(format!("{}: says nothing of /metrics", f.name)),
        }
        match &f.emf {
            Presence::At(metrics) => {
                for m in metrics {
                    from_figures_emf.insert(m.name.to_owned());
                    let known = f.series.iter().any(|s| s.value.is_some());
                    if known && !in_emf.contains(m.name) {
                        wrong.push(format!("{}: {} is not in the CloudWatch lines", f.name, m.name));
                    }
                }
            }
            Presence::Absent(_) => {}
            Presence::Unsaid => wrong.push(format!("{}: says nothing of CloudWatch", f.name)),
        }
        match &f.ops {
            Presence::At(pointer) => {
                for s in &f.series {
                    if member(&status, pointer, &s.labels).is_none() {
                        wrong.push(format!("{}{:?}: {pointer} is not in /v1/ops/status", f.name, s.labels));
                    }
                }
            }
            Presence::Absent(_) => {}
            Presence::Unsaid => wrong.push(format!("{}: says nothing of /v1/ops/status", f.name)),
        }
    }
    // And the other way: nothing reaches /metrics or CloudWatch but through the list.
    for name in in_prometheus.difference(&from_figures_prometheus) {
        wrong.push(format!("breakwater_{name} is in /metrics but no figure's"));
    }
    for name in in_emf.difference(&from_figures_emf) {
        wrong.push(format!("{name} is in the CloudWatch lines but no figure's"));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The state above is one every view has figures in: the test checked something.
    assert!(in_prometheus.len() > 40 && in_emf.len() > 15, "{in_prometheus:?} {in_emf:?}");
}
