//! OpenTelemetry through the real API and worker: with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at
//! an in-test OTLP/HTTP receiver, a request carrying a W3C `traceparent` produces a server span
//! in the caller's trace, named by its matched route, with the domain's SQL span under it; the
//! worker that runs the job the request enqueued continues the same trace; a posted message's
//! delivery job carries the trace context too.
//!
//! One test in this binary: it installs the process's global subscriber.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use breakwater_domain::contacts::{self, NewContact};
use breakwater_telemetry::{LogOutput, Settings, Telemetry};
use breakwater_worker::{Worker, WorkerOptions};
use common::{spawn_with, tenant};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message as _;
use reqwest::StatusCode;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// A span as received.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    kind: i32,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn any_value(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// The in-test collector: `POST /v1/traces` with an OTLP protobuf body.
async fn receiver(spans: Spans) -> String {
    async fn export(
        axum::extract::State(spans): axum::extract::State<Spans>,
        body: Bytes,
    ) -> ([(axum::http::HeaderName, &'static str); 1], Vec<u8>) {
        let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
        let mut out = spans.lock().expect("lock");
        for rs in request.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .map(|a| any_value(a.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(Received {
                        service: service.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        kind: s.kind,
                        attributes: s.attributes.iter().map(|a| (a.key.clone(), any_value(a.value.as_ref()))).collect(),
                    });
                }
            }
        }
        (
            [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
            ExportTraceServiceResponse::default().encode_to_vec(),
        )
    }
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(export)).with_state(spans);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Flushes (on a blocking thread: the exporter's HTTP call is answered by this runtime) until
/// `done` holds for the spans received, or gives up after a few seconds.
async fn wait_for(telemetry: &Arc<Telemetry>, spans: &Spans, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
    let started = Instant::now();
    loop {
        let t = Arc::clone(telemetry);
        tokio::task::spawn_blocking(move || t.flush()).await.expect("flush");
        let got = spans.lock().expect("lock").clone();
        if done(&got) || started.elapsed() > Duration::from_secs(10) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_request_and_the_job_it_enqueued_are_one_trace(pool: PgPool) {
    let spans: Spans = Arc::default();
    let endpoint = receiver(spans.clone()).await;
    let telemetry = Arc::new(
        Telemetry::init(&Settings {
            service: "breakwater-api",
            logs: LogOutput::Pretty,
            default_filter: "info,sqlx=warn",
            otlp_endpoint: Some(&endpoint),
        })
        .expect("telemetry"),
    );
    assert!(telemetry.exporting(), "the first subscriber of this test binary");

    let app = spawn_with(pool.clone(), &["--otel-exporter-otlp-endpoint", &endpoint]).await;
    let t = tenant(&pool, "Acme").await;
    let ann = contacts::create(&pool, t.id, NewContact { name: "Ann".into(), email: Some("ann@example.com".into()) })
        .await
        .expect("contact")
        .id;

    // The caller's trace: its trace id and the span that made the call.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let r = app
        .send(
            app.http
                .delete(app.url(&format!("/v1/contacts/{ann}")))
                .bearer_auth(&t.token)
                .header("traceparent", format!("00-{trace_id}-{caller}-01")),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let job_id: uuid::Uuid = r.body["job_id"].as_str().and_then(|s| s.parse().ok()).expect("job id");
    let stored = sqlx::query_scalar::<_, Option<String>>("SELECT traceparent FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .expect("job")
        .expect("the job carries the request's trace context");
    assert!(stored.starts_with(&format!("00-{trace_id}-")), "{stored}");

    // A worker (in this process, but with nothing but the job row to go on) runs the erasure.
    let worker = Worker::new(
        pool.clone(),
        WorkerOptions {
            kinds: vec![breakwater_domain::jobs::kind::ERASE_CONTACT.into()],
            poll_interval: Duration::from_millis(50),
            exit_when_idle: true,
            ..WorkerOptions::default()
        },
    );
    let counts = tokio::time::timeout(Duration::from_secs(10), worker.run(CancellationToken::new()))
        .await
        .expect("the worker drains the queue")
        .expect("worker");
    assert_eq!(counts.completed, 1, "{counts:?}");

    let got = wait_for(&telemetry, &spans, |s| {
        s.iter().any(|x| x.name == "DELETE /v1/contacts/{id}") && s.iter().any(|x| x.name == "db contacts.erase")
    })
    .await;
    let in_trace: Vec<&Received> = got.iter().filter(|s| s.trace_id == trace_id).collect();
    let names: Vec<&str> = in_trace.iter().map(|s| s.name.as_str()).collect();
    let find = |name: &str| {
        in_trace.iter().find(|s| s.name == name).copied().unwrap_or_else(|| panic!("no `{name}` span in {names:?}"))
    };

    // The request: a server span named by its route, a child of the caller's span.
    let request = find("DELETE /v1/contacts/{id}");
    assert_eq!(request.parent_span_id, caller);
    assert_eq!(request.service, "breakwater-api");
    assert_eq!(request.kind, opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server as i32);
    assert_eq!(request.attribute("http.route"), Some("/v1/contacts/{id}"));
    assert_eq!(request.attribute("http.response.status_code"), Some("202"));
    // Its SQL, under it.
    let sql = find("db contacts.request_erasure");
    assert_eq!(sql.parent_span_id, request.span_id);
    assert_eq!(sql.attribute("db.system.name"), Some("postgresql"));
    // The job, continued from the traceparent on its row: a child of the request's span.
    let job = find("job erase_contact");
    assert_eq!(job.parent_span_id, request.span_id, "{stored}");
    assert_eq!(job.attribute("job.id"), Some(job_id.to_string().as_str()));
    // And the worker's SQL under the job.
    let erase = find("db contacts.erase");
    assert_eq!(erase.parent_span_id, job.span_id);

    // Posting a message carries the trace to its delivery job the same way.
    let policy = breakwater_domain::webhooks::WebhookPolicy::development().allow_private(true);
    let hook = breakwater_domain::webhooks::WebhookUrl::parse("http://127.0.0.1:9/hook", &policy).expect("url");
    let inbox =
        breakwater_domain::tenants::create_inbox(&pool, t.id, "Hooked", "web", Some(&hook)).await.expect("inbox");
    let bob = contacts::create(&pool, t.id, NewContact { name: "Bob".into(), email: None }).await.expect("contact").id;
    let conversation = breakwater_domain::conversations::create(
        &pool,
        t.id,
        breakwater_domain::conversations::NewConversation {
            contact_id: bob,
            inbox_id: inbox,
            assignee_id: None,
            status: breakwater_domain::conversations::ConversationStatus::Open,
        },
    )
    .await
    .expect("conversation")
    .id;
    let other_trace = "0af7651916cd43dd8448eb211c80319c";
    let r = app
        .send(
            app.http
                .post(app.url(&format!("/v1/conversations/{conversation}/messages")))
                .bearer_auth(&t.token)
                .header("traceparent", format!("00-{other_trace}-b7ad6b7169203331-01"))
                .json(&serde_json::json!({"body": "hello"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let delivery =
        sqlx::query_scalar::<_, Option<String>>("SELECT traceparent FROM jobs WHERE kind = 'deliver_message'")
            .fetch_one(&pool)
            .await
            .expect("the delivery job")
            .expect("the delivery job carries the request's trace context");
    assert!(delivery.starts_with(&format!("00-{other_trace}-")), "{delivery}");

    // A request without a traceparent starts its own trace.
    let r = app.get(&format!("/v1/contacts/{ann}"), &t.token).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let got = wait_for(&telemetry, &spans, |s| s.iter().any(|x| x.name == "GET /v1/contacts/{id}")).await;
    let own = got.iter().find(|s| s.name == "GET /v1/contacts/{id}").expect("the second request's span");
    assert_ne!(own.trace_id, trace_id);
    assert_eq!(own.parent_span_id, "", "a root span");
}
