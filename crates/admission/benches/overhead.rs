//! What the admission layer costs per request, on top of the service it protects.
//!
//! `cargo bench -p breakwater-admission --bench overhead -- --warm-up-time 1 --measurement-time 3`
//!
//! * `request_only`: building the request each iteration uses (subtract it from `refused`).
//! * `bare`: the trivial inner service alone (call, response, body read to the end).
//! * `admitted`: the same through the layer, adaptive mode, with room: classify, tenant key,
//!   admission under the class lock, the slot guard, the wrapped body, release and the latency
//!   sample at end of body (including the controller's window bookkeeping).
//! * `refused`: a full class: the decision, the 503 with its JSON envelope, `Retry-After` and
//!   extension, and reading that body.
//!
//! The futures complete on their first poll, so no runtime is involved: this is CPU per request.

use std::convert::Infallible;
use std::hint::black_box;

use breakwater_admission::{Admission, AdmissionConfig, ClassId, Mode, Refusal, RefusalReason, Route};
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};

type Body = Full<Bytes>;

fn request() -> Request<Body> {
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = http::Uri::from_static("/v1/conversations");
    req.headers_mut().insert("x-tenant", http::HeaderValue::from_static("42"));
    req
}

fn classify(req: &Request<Body>) -> Route {
    match req.uri().path() {
        "/health" | "/ready" | "/metrics" | "/v1/ops/status" => Route::Bypass,
        _ => Route::Class(ClassId::DEFAULT),
    }
}

fn tenant(req: &Request<Body>) -> Option<u64> {
    req.headers().get("x-tenant").and_then(|v| v.to_str().ok()?.parse().ok())
}

fn inner() -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>>,
> + Clone {
    tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}"))))
    })
}

/// Calls once and reads the whole body; every future here is ready on first poll.
fn once<S, B>(svc: &mut S) -> usize
where
    S: Service<Request<Body>, Response = Response<B>>,
    B: http_body::Body<Data = Bytes>,
{
    let Some(Ok(())) = svc.ready().now_or_never().map(|r| r.map(|_| ())) else { panic!("not ready") };
    let Some(Ok(res)) = svc.call(request()).now_or_never() else { panic!("not immediate") };
    let status = usize::from(res.status().as_u16());
    let body = res.into_body().collect().now_or_never();
    status + body.map_or(0, |b| b.map_or(0, |b| b.to_bytes().len()))
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission");

    // The harness alone: building the request every iteration builds (and dropping it).
    group.bench_function("request_only", |b| b.iter(|| black_box(request())));

    let mut bare = inner();
    group.bench_function("bare", |b| b.iter(|| black_box(once(&mut bare))));

    let admission = Admission::new(AdmissionConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    let layer = admission.layer(classify as fn(&Request<Body>) -> Route, tenant as fn(&Request<Body>) -> Option<u64>);
    let mut admitted = layer.layer(inner());
    group.bench_function("admitted", |b| {
        b.iter(|| black_box(once(&mut admitted)));
    });
    assert_eq!(admission.snapshot().load.shed.total(), 0);

    // A class with one slot, held for the whole run by a response whose body is never read,
    // and no queue: every request is refused.
    let mut cfg = AdmissionConfig { mode: Mode::Static, ..AdmissionConfig::default() };
    cfg.classes[0].static_limit = 1;
    cfg.classes[0].queue_capacity = 0;
    let full = Admission::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut refused =
        full.layer(classify as fn(&Request<Body>) -> Route, tenant as fn(&Request<Body>) -> Option<u64>).layer(inner());
    let held = refused.call(request()).now_or_never();
    // Checked before any bench runs, so that a filter that skips "refused" cannot skip it.
    black_box(once(&mut refused));
    assert!(full.snapshot().load.shed.queue_full > 0, "the held slot refuses");
    group.bench_function("refused", |b| {
        b.iter(|| black_box(once(&mut refused)));
    });
    // The decision alone: the future is dropped unpolled, so no response is rendered.
    group.bench_function("refused_decision_only", |b| {
        b.iter(|| black_box(refused.call(request())));
    });
    // The refusal a refused response carries in its extensions, as a user's renderer finds it.
    let refusal = {
        let Some(Ok(res)) = refused.call(request()).now_or_never() else { panic!("not immediate") };
        res.extensions().get::<Refusal>().copied().unwrap_or_else(|| panic!("a refusal carries its Refusal"))
    };
    assert_eq!(refusal.reason, RefusalReason::QueueFull);
    group.bench_function("refusal_json_only", |b| {
        b.iter(|| black_box(black_box(&refusal).to_json()));
    });
    drop(held);

    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
