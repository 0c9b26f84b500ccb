//! The smoke stage every profile runs first: one agent journey and the reader endpoints at a
//! walking pace, checking each step's status and body shape. A broken path stops the run with
//! the failing step named, before any load hides the cause behind an error rate.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde_json::Value;

use crate::client::Http;
use crate::report::{SmokeReport, SmokeStep};
use crate::tokens::Tokens;
use crate::workload::pick_id;

/// Why the smoke stage stopped the run.
#[derive(Debug, thiserror::Error)]
#[error("smoke failed at step '{step}' ({request}): {reason}")]
pub struct SmokeFailure {
    pub step: String,
    pub request: String,
    pub reason: String,
    pub report: SmokeReport,
}

type Shape = fn(&Value) -> Result<(), String>;

fn list_shape(v: &Value) -> Result<(), String> {
    let items = v.get("items").and_then(Value::as_array).ok_or("no `items` array")?;
    if !v.as_object().is_some_and(|o| o.contains_key("next_cursor")) {
        return Err("no `next_cursor` field".into());
    }
    if let Some(first) = items.first()
        && first.get("id").is_none()
    {
        return Err("items have no `id`".into());
    }
    Ok(())
}

fn object_with_id(v: &Value) -> Result<(), String> {
    if v.get("id").is_some() { Ok(()) } else { Err("no `id` field".into()) }
}

fn any_object(v: &Value) -> Result<(), String> {
    if v.is_object() { Ok(()) } else { Err("body is not a JSON object".into()) }
}

struct Check<'a> {
    name: &'a str,
    method: Method,
    path: String,
    body: Option<&'static str>,
    auth: bool,
    expect: &'a [u16],
    shape: Option<Shape>,
}

/// How long the smoke stage waits for a just-started API to say it is ready (its pool connects
/// lazily, and a quarter core connects slowly) before the readiness check counts.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Refusals of one step honoured before the step counts as failed.
const MAX_REFUSALS: u32 = 3;

/// The wait a refusal asks for: a 429 or 503 with `Retry-After` of at most 5 s.
fn retry_after(reply: &crate::client::Reply) -> Option<Duration> {
    if reply.status != 429 && reply.status != 503 {
        return None;
    }
    let secs: u64 = reply.headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    (secs <= 5).then(|| Duration::from_secs(secs))
}

/// Polls `/ready` until it answers 200 or `within` passes; the readiness check that follows says
/// which.
async fn wait_ready(http: &Http, ops: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(r) = http.send(Method::GET, &format!("{ops}/ready"), &[], None).await
            && r.status == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the smoke journey as the heaviest tenant (then the second, if any: two users). `ops` is
/// the API's ops listener (readiness and ops status are not on the public port); `None` skips
/// those two probes.
pub async fn smoke(http: &Http, base: &str, ops: Option<&str>, tokens: &Tokens) -> Result<SmokeReport, SmokeFailure> {
    let mut report = SmokeReport { passed: false, steps: Vec::new() };
    let mut rng = SmallRng::seed_from_u64(7);
    let health = Check {
        name: "health",
        method: Method::GET,
        path: "/health".into(),
        body: None,
        auth: false,
        expect: &[200],
        shape: None,
    };
    run_check(http, base, None, &health, &mut report).await?;
    let ops_probes = [
        Check {
            name: "ready",
            method: Method::GET,
            path: "/ready".into(),
            body: None,
            auth: false,
            expect: &[200],
            shape: None,
        },
        Check {
            name: "ops status",
            method: Method::GET,
            path: "/v1/ops/status".into(),
            body: None,
            auth: false,
            expect: &[200],
            shape: Some(any_object),
        },
    ];
    if let Some(ops) = ops {
        wait_ready(http, ops, READY_WITHIN).await;
        for c in ops_probes {
            run_check(http, ops, None, &c, &mut report).await?;
        }
    }
    let mut users: Vec<usize> = tokens.heaviest().map(|(i, _)| i).into_iter().collect();
    if let Some(second) = (0..tokens.tenants().len()).find(|i| Some(*i) != users.first().copied()) {
        users.push(second);
    }
    if users.is_empty() {
        users.push(usize::MAX); // no tokens: run unauthenticated and let the server say so
    }
    for user in users {
        let auth = tokens.tenants().get(user).map(|t| t.authorization.clone());
        let inbox = Check {
            name: "list inbox",
            method: Method::GET,
            path: "/v1/conversations?status=open&limit=25".into(),
            body: None,
            auth: true,
            expect: &[200],
            shape: Some(list_shape),
        };
        let body = run_check(http, base, auth.clone(), &inbox, &mut report).await?;
        let Some(id) = pick_id(&body, &mut rng) else {
            return Err(fail(
                &mut report,
                "pick a conversation",
                "GET /v1/conversations?status=open",
                "the inbox list is empty: is the database seeded, and do the tokens name seeded tenants?".into(),
            ));
        };
        let steps = [
            Check {
                name: "open conversation",
                method: Method::GET,
                path: format!("/v1/conversations/{id}"),
                body: None,
                auth: true,
                expect: &[200],
                shape: Some(object_with_id),
            },
            Check {
                name: "read messages",
                method: Method::GET,
                path: format!("/v1/conversations/{id}/messages?limit=50"),
                body: None,
                auth: true,
                expect: &[200],
                shape: Some(list_shape),
            },
            Check {
                name: "reply",
                method: Method::POST,
                path: format!("/v1/conversations/{id}/messages"),
                body: Some(r#"{"body":"loadlab smoke"}"#),
                auth: true,
                expect: &[201],
                shape: Some(any_object),
            },
            Check {
                name: "change status",
                method: Method::PATCH,
                path: format!("/v1/conversations/{id}"),
                body: Some(r#"{"status":"open"}"#),
                auth: true,
                expect: &[200],
                shape: Some(any_object),
            },
            Check {
                name: "list contacts",
                method: Method::GET,
                path: "/v1/contacts?limit=25".into(),
                body: None,
                auth: true,
                expect: &[200],
                shape: Some(list_shape),
            },
        ];
        for c in steps {
            run_check(http, base, auth.clone(), &c, &mut report).await?;
        }
    }
    report.passed = true;
    Ok(report)
}

fn fail(report: &mut SmokeReport, step: &str, request: &str, reason: String) -> SmokeFailure {
    report.steps.push(SmokeStep {
        name: step.into(),
        request: request.into(),
        status: None,
        latency_ms: 0.0,
        ok: false,
        reason: Some(reason.clone()),
    });
    SmokeFailure { step: step.into(), request: request.into(), reason, report: report.clone() }
}

async fn run_check(
    http: &Http,
    base: &str,
    auth: Option<HeaderValue>,
    c: &Check<'_>,
    report: &mut SmokeReport,
) -> Result<Bytes, SmokeFailure> {
    let request = format!("{} {}", c.method, c.path.split('?').next().unwrap_or(&c.path));
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    if c.auth
        && let Some(a) = auth
    {
        headers.push((http::header::AUTHORIZATION, a));
    }
    // A fresh key per run: a replayed key may answer the first run's message instead.
    if c.method == Method::POST
        && let Ok(key) = HeaderValue::from_str(&format!("loadlab-smoke-{}", uuid::Uuid::new_v4()))
    {
        headers.push((HeaderName::from_static("idempotency-key"), key));
    }
    // A refusal (429 or 503 with `Retry-After`) is honoured like any well-behaved client would:
    // the step is tried again after the time it names, a few times, before it counts as failed.
    let mut refusals = 0;
    let (r, latency_ms) = loop {
        let t0 = Instant::now();
        let r = http
            .send(
                c.method.clone(),
                &format!("{base}{}", c.path),
                &headers,
                c.body.map(|b: &'static str| Bytes::from_static(b.as_bytes())),
            )
            .await;
        let latency_ms = t0.elapsed().as_secs_f64() * 1000.0;
        match r.as_ref().ok().and_then(retry_after) {
            Some(wait) if refusals < MAX_REFUSALS && !c.expect.contains(&r.as_ref().map_or(0, |r| r.status)) => {
                refusals += 1;
                tokio::time::sleep(wait).await;
            }
            _ => break (r, latency_ms),
        }
    };
    let verdict = match &r {
        Err(kind) => Err(format!("request failed: {kind}")),
        Ok(reply) if !c.expect.contains(&reply.status) => {
            let snippet: String = String::from_utf8_lossy(&reply.body).chars().take(200).collect();
            Err(format!("status {} (expected {:?}): {snippet}", reply.status, c.expect))
        }
        Ok(reply) => match c.shape {
            None => Ok(()),
            Some(shape) => serde_json::from_slice::<Value>(&reply.body)
                .map_err(|e| format!("body is not JSON: {e}"))
                .and_then(|v| shape(&v).map_err(|e| format!("unexpected body shape: {e}"))),
        },
    };
    let status = r.as_ref().ok().map(|r| r.status);
    report.steps.push(SmokeStep {
        name: c.name.into(),
        request: request.clone(),
        status,
        latency_ms,
        ok: verdict.is_ok(),
        reason: verdict.as_ref().err().cloned(),
    });
    match verdict {
        Ok(()) => Ok(r.map(|r| r.body).unwrap_or_default()),
        Err(reason) => Err(SmokeFailure { step: c.name.into(), request, reason, report: report.clone() }),
    }
}
