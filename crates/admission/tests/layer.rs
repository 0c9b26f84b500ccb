//! The layer's contract: accounting (a slot is held until the body is sent, and freed on panic,
//! error and disconnect), the queue's bound and waits, deadlines, bypass, route classes, the
//! refusal envelope, and the two known tower composition traps.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use breakwater_admission::{Admission, AdmissionConfig, ClassConfig, ClassId, Mode, Refusal, RefusalReason, Route};
use bytes::Bytes;
use common::{Admitted, Body, admitted, request};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

fn static_config(limit: usize, queue: usize) -> AdmissionConfig {
    let mut cfg = AdmissionConfig { mode: Mode::Static, ..AdmissionConfig::default() };
    cfg.classes[0].static_limit = limit;
    cfg.classes[0].queue_capacity = queue;
    cfg
}

fn admission(cfg: AdmissionConfig) -> Admission {
    Admission::new(cfg).unwrap_or_else(|e| panic!("{e}"))
}

/// Holds every request until the test adds permits; counts how many are inside at once.
#[derive(Clone)]
struct Gate {
    open: Arc<Semaphore>,
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Gate {
    fn new() -> Self {
        Self {
            open: Arc::new(Semaphore::new(0)),
            inside: Arc::new(AtomicUsize::new(0)),
            most: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Service<Request<Body>> for Gate {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let g = self.clone();
        Box::pin(async move {
            let now = g.inside.fetch_add(1, Ordering::SeqCst) + 1;
            g.most.fetch_max(now, Ordering::SeqCst);
            if req.uri().path() == "/panic" {
                panic!("handler panicked");
            }
            if let Ok(p) = g.open.acquire().await {
                p.forget();
            }
            g.inside.fetch_sub(1, Ordering::SeqCst);
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    }
}

async fn status<S>(svc: S, req: Request<Body>) -> (StatusCode, Option<Refusal>)
where
    S: Service<Request<Body>, Response = Response<breakwater_admission::AdmissionBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let Ok(res) = svc.oneshot(req).await else { panic!("service error") };
    let refusal = res.extensions().get::<Refusal>().copied();
    let status = res.status();
    let _ = res.into_body().collect().await;
    (status, refusal)
}

fn in_flight(a: &Admission) -> usize {
    a.snapshot().load.in_flight
}

fn queued(a: &Admission) -> usize {
    a.snapshot().load.queue_depth
}

/// Lets spawned tasks run until they block.
async fn run_pending() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// A streamed body the test feeds chunk by chunk.
struct Streamed(mpsc::Receiver<Bytes>);

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

/// One request through `a` to a handler that returns at once with a [`Streamed`] body (marked
/// [`breakwater_admission::LongLived`] when `long_lived`): the response, and the sender that feeds
/// its body.
async fn streamed_response(
    a: &Admission,
    long_lived: bool,
) -> (mpsc::Sender<Bytes>, Response<breakwater_admission::AdmissionBody<Streamed>>) {
    let (tx, rx) = mpsc::channel(4);
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let inner = tower::service_fn(move |_req: Request<Body>| {
        let body = rx.lock().ok().and_then(|mut r| r.take());
        async move {
            let Some(rx) = body else { panic!("one call only") };
            let mut res = Response::new(Streamed(rx));
            if long_lived {
                res.extensions_mut().insert(breakwater_admission::LongLived);
            }
            Ok::<_, Infallible>(res)
        }
    });
    let svc = a.layer(|_: &Request<Body>| Route::Class(ClassId::DEFAULT), |_: &Request<Body>| None).layer(inner);
    let Ok(res) = svc.oneshot(request("/", None)).await;
    (tx, res)
}

/// A layer with one slot and `queue` places over a [`Gate`], and a request from `tenant` that
/// holds the slot (in the handler, until the gate opens).
async fn one_slot_held(
    queue: usize,
    tenant: Option<u64>,
) -> (Admission, Gate, Admitted<Gate>, JoinHandle<(StatusCode, Option<Refusal>)>) {
    let a = admission(static_config(1, queue));
    let gate = Gate::new();
    let svc = admitted(&a, gate.clone());
    let holder = tokio::spawn(status(svc.clone(), request("/", tenant)));
    run_pending().await;
    (a, gate, svc, holder)
}

/// One request from `tenant`: why it was refused (`None` when served) and when, from `t0`.
async fn timed(svc: Admitted<Gate>, tenant: Option<u64>, t0: Instant) -> (Option<RefusalReason>, Duration) {
    let out = status(svc, request("/", tenant)).await;
    (out.1.map(|r| r.reason), t0.elapsed())
}

#[tokio::test]
async fn the_slot_is_held_until_the_body_has_been_sent() {
    let a = admission(static_config(1, 4));
    let (tx, res) = streamed_response(&a, false).await;
    assert_eq!(in_flight(&a), 1, "the handler returned but the body is not sent");
    let mut body = res.into_body();
    let _ = tx.send(Bytes::from_static(b"part")).await;
    assert!(body.frame().await.is_some());
    assert_eq!(in_flight(&a), 1, "half the body sent");
    drop(tx);
    assert!(body.frame().await.is_none());
    assert_eq!(in_flight(&a), 0, "end of stream frees the slot");
    assert_eq!(a.snapshot().load.admitted_total, 1);
}

#[tokio::test]
async fn a_long_lived_response_frees_its_slot_with_its_head() {
    let a = admission(static_config(1, 0));
    let (tx, res) = streamed_response(&a, true).await;
    assert_eq!(in_flight(&a), 0, "a stream's head is its request's end");
    assert_eq!(a.snapshot().load.admitted_total, 1);
    assert!(a.snapshot().load.p50_ms.is_some(), "the time to its head is a latency sample");
    // Its body still runs.
    let mut body = res.into_body();
    let _ = tx.send(Bytes::from_static(b"event")).await;
    assert!(body.frame().await.is_some());
    assert_eq!(in_flight(&a), 0);
}

#[tokio::test]
async fn a_body_dropped_midway_frees_the_slot() {
    let a = admission(static_config(1, 4));
    let (tx, res) = streamed_response(&a, false).await;
    let _ = tx.send(Bytes::from_static(b"part")).await;
    let mut body = res.into_body();
    assert!(body.frame().await.is_some());
    drop(body); // the client went away mid-stream
    assert_eq!(in_flight(&a), 0);
    // An unfinished response is not a latency sample.
    assert_eq!(a.snapshot().load.p50_ms, None);
}

#[tokio::test]
async fn a_panicking_handler_frees_its_slot_for_the_next_waiter() {
    let a = admission(static_config(1, 4));
    let gate = Gate::new();
    let svc = admitted(&a, gate.clone());
    let crashed = tokio::spawn(status(svc.clone(), request("/panic", None)));
    assert!(crashed.await.is_err_and(|e| e.is_panic()));
    assert_eq!(in_flight(&a), 0);
    gate.open.add_permits(1);
    assert_eq!(status(svc, request("/", None)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_client_disconnect_frees_the_slot_and_the_queue_place() {
    let (a, gate, svc, holder) = one_slot_held(4, None).await;
    let waiter = tokio::spawn(status(svc.clone(), request("/", None)));
    run_pending().await;
    assert_eq!((in_flight(&a), queued(&a)), (1, 1));
    waiter.abort(); // the queued client hangs up
    run_pending().await;
    assert_eq!(queued(&a), 0);
    holder.abort(); // the admitted client hangs up mid-handler
    run_pending().await;
    assert_eq!(in_flight(&a), 0);
    assert_eq!(gate.inside.load(Ordering::SeqCst), 1, "the handler future was dropped, not run");
}

#[tokio::test]
async fn a_slot_granted_to_a_waiter_that_left_passes_to_the_next() {
    let (a, gate, mut svc, holder) = one_slot_held(4, None).await;
    // Two queued futures, never polled: the first is granted the slot, then dropped unpolled.
    let first = svc.call(request("/", None));
    let second = svc.call(request("/", None));
    assert_eq!(queued(&a), 2);
    gate.open.add_permits(1);
    assert_eq!(holder.await.map(|r| r.0).ok(), Some(StatusCode::OK));
    assert_eq!((in_flight(&a), queued(&a)), (1, 1), "granted to the first waiter");
    drop(first);
    assert_eq!((in_flight(&a), queued(&a)), (1, 0), "passed on to the second");
    gate.open.add_permits(1);
    let Ok(res) = second.await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_limit_is_global_across_connections() {
    // hyper and axum clone the service once per connection; the limit must not multiply.
    let a = admission(static_config(4, 64));
    let gate = Gate::new();
    let layer = a.layer(|_: &Request<Body>| Route::Class(ClassId::DEFAULT), |_: &Request<Body>| None);
    let mut calls = Vec::new();
    for connection in 0..8 {
        // Half the connections from clones of one service, half from separate `layer` calls.
        let svc =
            if connection % 2 == 0 { layer.layer(gate.clone()) } else { layer.clone().layer(gate.clone()).clone() };
        for _ in 0..5 {
            calls.push(tokio::spawn(status(svc.clone(), request("/", None))));
        }
    }
    run_pending().await;
    assert_eq!(in_flight(&a), 4);
    assert_eq!(queued(&a), 36);
    gate.open.add_permits(40);
    for c in calls {
        assert_eq!(c.await.map(|r| r.0).ok(), Some(StatusCode::OK));
    }
    assert_eq!(gate.most.load(Ordering::SeqCst), 4, "never more than the limit inside");
}

/// Load shedding that treats `poll_ready -> Pending` as overload sheds spuriously over a
/// `Buffer` once the task's coop budget runs out (tower's `LoadShed<Buffer<_>>` trap). Admission
/// decides on its own counters, never on readiness.
#[tokio::test]
async fn over_a_buffer_an_exhausted_coop_budget_is_not_overload() {
    const N: usize = 2000;
    let ok = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let a = admission(static_config(N, 16));
    let svc = ServiceBuilder::new()
        .layer(a.layer(|_: &Request<Body>| Route::Class(ClassId::DEFAULT), |_: &Request<Body>| None))
        .buffer(N)
        .service(ok);
    // All from one task, so the coop budget is spent long before the last request.
    let mut all: FuturesUnordered<_> = (0..N).map(|_| svc.clone().oneshot(request("/", None))).collect();
    let mut statuses = Vec::new();
    while let Some(r) = all.next().await {
        statuses.push(r.map(|res| res.status()).ok());
    }
    assert_eq!(statuses.len(), N);
    assert!(statuses.iter().all(|s| *s == Some(StatusCode::OK)));
    let snap = a.snapshot();
    assert_eq!((snap.load.admitted_total, snap.load.shed.total()), (N as u64, 0));
}

#[tokio::test(start_paused = true)]
async fn the_queue_honours_its_bound_and_its_max_wait() {
    let (a, _gate, svc, _holder) = one_slot_held(4, None).await;
    let t0 = Instant::now();
    let tries: Vec<_> = (0..7).map(|_| tokio::spawn(timed(svc.clone(), None, t0))).collect();
    let mut results = Vec::new();
    for t in tries {
        results.extend(t.await.ok());
    }
    let full: Vec<_> = results.iter().filter(|r| r.0 == Some(RefusalReason::QueueFull)).collect();
    let timeouts: Vec<_> = results.iter().filter(|r| r.0 == Some(RefusalReason::QueueTimeout)).collect();
    assert_eq!(full.len(), 3, "{results:?}");
    assert!(full.iter().all(|r| r.1 == Duration::ZERO), "a full queue refuses at once");
    assert_eq!(timeouts.len(), 4);
    let max_wait = Duration::from_millis(100);
    assert!(timeouts.iter().all(|r| r.1 >= max_wait && r.1 < max_wait + Duration::from_millis(2)));
    let snap = a.snapshot();
    assert_eq!((snap.load.shed.queue_full, snap.load.shed.queue_timeout), (3, 4));
    assert_eq!(snap.load.queue_depth, 0);
}

#[tokio::test(start_paused = true)]
async fn sustained_overload_shortens_the_wait_and_the_queue_of_the_tenant_causing_it() {
    let (_a, _gate, svc, _holder) = one_slot_held(8, Some(1)).await;
    // Nobody found a free slot for longer than the CoDel interval: sustained overload, and
    // another tenant is waiting, so it is at that tenant's expense.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let _light = tokio::spawn(status(svc.clone(), request("/", Some(2))));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let t0 = Instant::now();
    let late = tokio::spawn(timed(svc.clone(), Some(1), t0));
    let (reason, waited) = late.await.unwrap_or((None, Duration::MAX));
    assert_eq!(reason, Some(RefusalReason::QueueTimeout));
    assert_eq!(waited, Duration::from_millis(5), "the overload wait, not the 100 ms max");

    // The tenant causing it may queue only what can drain within the short wait (here, one
    // slot's worth): its further arrivals are refused at once instead of after the wait.
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(tokio::spawn(timed(svc.clone(), Some(1), Instant::now())));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut outcomes = Vec::new();
    for w in waiters {
        outcomes.push(w.await.unwrap_or((None, Duration::MAX)));
    }
    let at_once = (Some(RefusalReason::QueueFull), Duration::ZERO);
    assert_eq!(outcomes, [(Some(RefusalReason::QueueTimeout), Duration::from_millis(5)), at_once, at_once]);
}

/// Alone in its class a tenant is not "causing" the overload at anyone's expense: in sustained
/// overload it keeps the normal wait, so work that the target could carry is not refused.
#[tokio::test(start_paused = true)]
async fn a_tenant_alone_in_sustained_overload_keeps_the_normal_wait() {
    let (_a, _gate, svc, _holder) = one_slot_held(8, None).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t0 = Instant::now();
    let late = tokio::spawn(timed(svc, None, t0));
    let (reason, waited) = late.await.unwrap_or((None, Duration::MAX));
    assert_eq!((reason, waited), (Some(RefusalReason::QueueTimeout), Duration::from_millis(100)));
}

/// At a small limit one flooding tenant often holds every slot. A light tenant arriving then is
/// not "the only tenant" of sustained overload: it keeps the normal wait (and is served first),
/// where the flooding tenant gets the short one. So does its second request, arriving while its
/// first still waits.
#[tokio::test(start_paused = true)]
async fn in_sustained_overload_a_light_tenant_keeps_the_normal_wait() {
    let (_a, gate, svc, _holder) = one_slot_held(8, Some(1)).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t0 = Instant::now();
    let timed = |svc: common::Admitted<Gate>, tenant: u64| async move {
        let out = status(svc, request("/", Some(tenant))).await;
        (out.0, out.1.map(|r| r.reason), t0.elapsed())
    };
    // The light tenant arrives first: then the flooder's overload is at its expense.
    let light = tokio::spawn(timed(svc.clone(), 2));
    run_pending().await;
    let flooder = tokio::spawn(timed(svc.clone(), 1));
    run_pending().await;
    let light_again = tokio::spawn(timed(svc.clone(), 2));
    run_pending().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    gate.open.add_permits(3); // the holder finishes after 20 ms; then whoever gets its slot
    let flooder = flooder.await.ok();
    let light = light.await.ok();
    let light_again = light_again.await.ok();
    assert_eq!(
        flooder,
        Some((StatusCode::SERVICE_UNAVAILABLE, Some(RefusalReason::QueueTimeout), Duration::from_millis(5))),
        "the flooding tenant gets the overload wait"
    );
    assert_eq!(light, Some((StatusCode::OK, None, Duration::from_millis(20))), "the light tenant waits for the slot");
    assert_eq!(light_again, light, "a light tenant with a request already waiting is still light");
}

/// The control for the coop-budget test: tower's own `LoadShed` over the same `Buffer` does
/// shed, with nothing overloaded. If this ever stops failing the other way, the trap is gone.
#[tokio::test]
async fn control_tower_load_shed_over_a_buffer_sheds_spuriously() {
    const N: usize = 2000;
    let ok = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let svc = ServiceBuilder::new().load_shed().buffer(N).service(ok);
    let mut all: FuturesUnordered<_> = (0..N).map(|_| svc.clone().oneshot(request("/", None))).collect();
    let mut shed = 0;
    while let Some(r) = all.next().await {
        shed += usize::from(r.is_err());
    }
    assert!(shed > 0, "LoadShed<Buffer> shed nothing this time");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_cannot_be_met_is_refused_at_the_door() {
    let (a, _gate, svc, _holder) = one_slot_held(8, None).await;
    let _queued: Vec<_> = (0..3).map(|_| tokio::spawn(status(svc.clone(), request("/", None)))).collect();
    run_pending().await;
    // Before any measurement the drain rate is guessed as limit / target = 5/s: 4 ahead = 0.8 s.
    let mut hurried = request("/", None);
    hurried.headers_mut().insert("x-request-timeout", http::HeaderValue::from_static("50"));
    let t0 = Instant::now();
    let (code, refusal) = status(svc.clone(), hurried).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(t0.elapsed(), Duration::ZERO);
    let refusal = refusal.unwrap_or_else(|| panic!("no refusal extension"));
    assert_eq!(refusal.reason, RefusalReason::Deadline);
    assert_eq!(refusal.reason.code(), "queue_timeout");
    assert_eq!(refusal.client_timeout_ms, 50);
    assert!(refusal.wait_ms >= 700, "{refusal:?}");

    let mut patient = request("/", None);
    patient.headers_mut().insert("request-timeout", http::HeaderValue::from_static("5000"));
    let waiting = tokio::spawn(status(svc, patient));
    run_pending().await;
    assert_eq!(queued(&a), 4, "a deadline that can be met waits like anyone");
    drop(waiting);
    assert_eq!(a.snapshot().load.shed.deadline, 1);
}

#[tokio::test]
async fn bypass_routes_are_never_counted_queued_or_refused() {
    let (a, gate, svc, _holder) = one_slot_held(0, None).await;
    assert_eq!(status(svc.clone(), request("/", None)).await.0, StatusCode::SERVICE_UNAVAILABLE);
    gate.open.add_permits(2); // the holder's and the health check's
    let (code, refusal) = status(svc, request("/health", None)).await;
    assert_eq!((code, refusal), (StatusCode::OK, None));
    let snap = a.snapshot();
    assert_eq!((snap.bypassed_total, snap.load.admitted_total), (1, 1));
}

#[tokio::test]
async fn cheap_reads_do_not_wait_behind_saturated_lists() {
    let mut cfg = static_config(1, 2);
    let reads = cfg.add_class(ClassConfig { static_limit: 8, ..ClassConfig::new("reads") });
    let a = admission(cfg);
    let gate = Gate::new();
    let svc = a
        .layer(
            move |req: &Request<Body>| match req.uri().path() {
                "/lists" => Route::Class(ClassId::DEFAULT),
                _ => Route::Class(reads),
            },
            |_: &Request<Body>| None,
        )
        .layer(gate.clone());
    let lists: Vec<_> = (0..3).map(|_| tokio::spawn(status(svc.clone(), request("/lists", None)))).collect();
    run_pending().await;
    let read = tokio::spawn(status(svc.clone(), request("/read", None)));
    run_pending().await;
    let snap = a.snapshot();
    assert_eq!(snap.classes[0].load.in_flight, 1);
    assert_eq!(snap.classes[0].load.queue_depth, 2);
    assert_eq!(snap.classes[1].load.in_flight, 1, "the read went straight in");
    assert_eq!(snap.classes[1].load.queue_depth, 0);
    gate.open.add_permits(10);
    assert_eq!(read.await.map(|r| r.0).ok(), Some(StatusCode::OK));
    for l in lists {
        assert_eq!(l.await.map(|r| r.0).ok(), Some(StatusCode::OK));
    }
}

#[tokio::test]
async fn a_refusal_is_a_typed_503_with_retry_after() {
    let (_a, _gate, svc, _holder) = one_slot_held(0, None).await;
    let Ok(res) = svc.oneshot(request("/", None)).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let header = |name| res.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    let retry: u32 = header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(retry >= 1);
    let refusal = res.extensions().get::<Refusal>().copied();
    assert_eq!(refusal.map(|r| r.reason), Some(RefusalReason::QueueFull));
    let bytes = res.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    assert_eq!(
        json,
        serde_json::json!({"error": {
            "type": "service_unavailable",
            "code": "load_shed",
            "message": "over capacity (in-flight 1/1, queue 0/0)",
            "recovery": {"retryable": true, "retry_after_seconds": retry}
        }})
    );
}

#[tokio::test]
async fn off_mode_never_refuses_but_still_counts() {
    let a = admission(AdmissionConfig { mode: Mode::Off, ..AdmissionConfig::default() });
    let gate = Gate::new();
    let svc = admitted(&a, gate.clone());
    let calls: Vec<_> = (0..500).map(|_| tokio::spawn(status(svc.clone(), request("/", None)))).collect();
    run_pending().await;
    let snap = a.snapshot();
    assert_eq!((snap.load.in_flight, snap.limit, snap.load.queue_depth), (500, None, 0));
    gate.open.add_permits(500);
    for c in calls {
        assert_eq!(c.await.map(|r| r.0).ok(), Some(StatusCode::OK));
    }
    let snap = a.snapshot();
    assert_eq!((snap.load.high_water, snap.load.shed.total()), (500, 0));
    let json = serde_json::to_value(&snap).unwrap_or_default();
    assert_eq!(json["mode"], "off");
    assert_eq!(json["classes"][0]["name"], "default");
    assert!(json["p95_ms"].is_number());
}
