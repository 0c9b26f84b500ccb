//! Every figure of the worker's list (`Worker::figures`) is in each of its three views, or says
//! why not, and nothing is in a view but through the list: `/metrics`, the CloudWatch line and
//! `/health` are rendered after a job ran (so that the series kept by kind exist) and checked
//! figure by figure. What the values are is tested by `metrics.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use breakwater_domain::Pool;
use breakwater_domain::jobs::{self, NewJob};
use breakwater_telemetry::figures::Presence;
use breakwater_worker::Worker;
use common::{options, start, wait_idle};
use http_body_util::BodyExt as _;

const PREFIX: &str = "breakwater_worker_";

/// `GET path` of the worker's server, answered in process: the body.
async fn get(worker: &Worker, path: &str) -> String {
    let app = breakwater_worker::metrics::router(worker.clone());
    let response = tower::ServiceExt::oneshot(app, Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
    assert!(response.status().is_success(), "{path}: {}", response.status());
    String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_figure_is_in_each_view_or_says_why_not(pool: Pool) {
    let mut tx = pool.begin().await.unwrap();
    jobs::enqueue(&mut tx, NewJob::new(jobs::kind::NOOP, serde_json::json!({}))).await.unwrap();
    tx.commit().await.unwrap();
    let worker = Worker::new(pool.clone(), options(Duration::from_secs(5)));
    let (stop, run) = start(&worker);
    wait_idle(&pool, Duration::from_secs(10)).await;

    let metrics = get(&worker, "/metrics").await;
    let health: serde_json::Value = serde_json::from_str(&get(&worker, "/health").await).unwrap();
    let mut publisher = breakwater_worker::emf::Publisher::new("Breakwater", "test", worker.clone());
    let line: serde_json::Value = serde_json::from_str(&publisher.line().to_json()).unwrap();
    let emf_names: BTreeSet<&str> = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap())
        .collect();
    let figures = worker.figures();

    let mut wrong = Vec::new();
    let mut names = BTreeSet::new();
    let mut emf_from_figures = BTreeSet::new();
    for f in figures.iter() {
        names.insert(f.name);
        let described = format!("# TYPE {PREFIX}{} ", f.name);
        match (&f.prometheus, metrics.contains(&described)) {
            (Presence::At(()), false) => wrong.push(format!("{}: not on /metrics", f.name)),
            (Presence::Absent(_), true) => wrong.push(format!("{}: on /metrics though marked absent", f.name)),
            (Presence::Unsaid, _) => wrong.push(format!("{}: says nothing of /metrics", f.name)),
            _ => {}
        }
        match &f.emf {
            Presence::At(metrics) => {
                for m in metrics {
                    emf_from_figures.insert(m.name);
                    if !emf_names.contains(m.name) {
                        wrong.push(format!("{}: {} not on the CloudWatch line", f.name, m.name));
                    }
                }
            }
            Presence::Absent(_) => {}
            Presence::Unsaid => wrong.push(format!("{}: says nothing of CloudWatch", f.name)),
        }
        match &f.ops {
            Presence::At(pointer) if health.pointer(pointer).is_none() => {
                wrong.push(format!("{}: {pointer} not in /health", f.name));
            }
            Presence::Unsaid => wrong.push(format!("{}: says nothing of /health", f.name)),
            _ => {}
        }
    }
    // Nothing in a view but through the list.
    for family in metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()) {
        if !family.strip_prefix(PREFIX).is_some_and(|name| names.contains(name)) {
            wrong.push(format!("{family}: on /metrics, not on the list"));
        }
    }
    for name in emf_names.difference(&emf_from_figures) {
        wrong.push(format!("{name}: on the CloudWatch line, not on the list"));
    }
    assert!(wrong.is_empty(), "{wrong:#?}\n/metrics:\n{metrics}\nCloudWatch: {line}\n/health: {health}");
    assert!(metrics.contains(&format!("{PREFIX}jobs_total{{kind=\"noop\",outcome=\"completed\"}} 1")), "{metrics}");

    stop.cancel();
    run.await.unwrap();
}
