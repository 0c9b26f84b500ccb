//! Admission control through the real API: typed refusals, probes that are never shed, and
//! published figures that match what happened.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{lock_contacts, spawn_with, tenant};
use reqwest::StatusCode;
use sqlx::PgPool;

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_saturated_api_refuses_fast_with_the_envelope_and_health_still_answers(pool: PgPool) {
    let mut args = common::ONE_STATIC_SLOT.to_vec();
    args.extend(["--admission-queue", "1", "--admission-max-wait-ms", "200"]);
    let app = spawn_with(pool.clone(), &args).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let conv = t.conversation(&app, ann).await;

    // One slow request holds the only slot of its class (it waits on a row lock).
    let blocker = lock_contacts(&pool, &[ann]).await;
    let slow = common::erase_in_background(&app, &t.token, ann);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Two more of the same class: one waits in the queue (then times out), one finds it full.
    let started = Instant::now();
    let path = format!("/v1/conversations/{conv}");
    let replies = futures_util::future::join_all((0..2).map(|_| app.get(&path, &t.token))).await;
    let codes: BTreeSet<&str> = replies.iter().map(common::Reply::code).collect();
    assert_eq!(codes, BTreeSet::from(["load_shed", "queue_timeout"]), "{replies:?}");
    for r in &replies {
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.body["error"]["type"], "service_unavailable");
        assert_eq!(r.body["error"]["recovery"]["retryable"], true);
        let retry: u64 = r.headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
        assert!(retry >= 1);
        assert_eq!(r.body["error"]["recovery"]["retry_after_seconds"], retry);
        assert!(r.body["error"]["message"].as_str().unwrap_or("").contains("in-flight"), "{}", r.text);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "refusals took {:?}", started.elapsed());

    // The lists have their own class: the inbox still answers while the default class is full.
    assert_eq!(app.get("/v1/conversations", &t.token).await.status, StatusCode::OK);
    // The liveness probe bypasses admission; the ops listener is not behind it at all.
    assert_eq!(app.call(reqwest::Method::GET, "/health", None, None).await.status, StatusCode::OK);
    for path in ["/health", "/ready", "/metrics", "/v1/ops/status"] {
        assert_eq!(app.ops(path).await.status, StatusCode::OK, "{path}");
    }

    let status = app.ops("/v1/ops/status").await;
    let capacity = &status.body["layers"]["capacity"];
    assert_eq!(capacity["mode"], "static", "{capacity}");
    let default = capacity["classes"]
        .as_array()
        .expect("classes")
        .iter()
        .find(|c| c["name"] == "default")
        .expect("default")
        .clone();
    assert_eq!((default["limit"].as_u64(), default["in_flight"].as_u64()), (Some(1), Some(1)), "{default}");
    assert_eq!(
        default["shed"]["queue_full"].as_u64().unwrap_or(0) + default["shed"]["queue_timeout"].as_u64().unwrap_or(0),
        2,
        "{default}"
    );
    let metrics = app.send(app.http.get(app.ops_url("/metrics"))).await.text;
    assert!(metrics.contains(r#"breakwater_admission_in_flight{class="default"} 1"#), "{metrics}");

    blocker.rollback().await.expect("release");
    assert_eq!(slow.await.expect("task").expect("response"), StatusCode::ACCEPTED);
    // The slot is back once the response is sent.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(app.get("/v1/contacts", &t.token).await.status, StatusCode::OK);
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["capacity"]["in_flight"], 0);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn admission_off_lets_everything_through(pool: PgPool) {
    let app = spawn_with(pool.clone(), &["--admission", "off"]).await;
    let t = tenant(&pool, "Acme").await;
    assert_eq!(app.get("/v1/contacts", &t.token).await.status, StatusCode::OK);
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["capacity"]["mode"], "off");
}
