//! A caller that comes back before its `Retry-After` pays in time, not in our CPU.
//!
//! A refusal is cheap, but not free: tens of microseconds of a quarter core each, most of it
//! hyper and the kernel's loopback work. A closed-loop caller that ignores `Retry-After` comes
//! straight back, so 192 of them can spend the whole quota on refusals and starve the admitted
//! work (the retry storm). Per connection, this layer remembers when admission's last refusal
//! said to come back (`Retry-After`, capped at `RETRY_HOLD_MAX_MS`). A request on that connection
//! that arrives earlier is handled as usual, and if it is admitted it is answered at once; if
//! admission refuses it again, the refusal is held until the earlier one's time has come, and
//! never longer than `RETRY_HOLD_MAX_MS`.
//!
//! Only admission's own refusals are held (they carry its `Refusal` and no slot). A 429 of the
//! throttles or a 503 `db_saturated` comes from inside an admitted request: its response body
//! still holds the admission slot until it is written, so holding it would keep the slot, and
//! count the hold as service time in the limiter. A caller that waits
//! for each answer is thereby slowed to one refusal per `Retry-After`, waiting on a timer that
//! costs nothing, and a caller that honours `Retry-After` is never held.
//!
//! The connection is the caller only when clients connect directly. Behind a proxy that carries
//! many clients over its connections (`TRUSTED_PROXIES` > 0, an ALB), one client's early return
//! would hold another's refusal, so the hold is off there.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, header};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::Service;

/// One connection's memory of its last refusal.
#[derive(Debug, Default)]
pub struct ConnectionHold {
    /// When the last refusal told the caller to come back.
    not_before: Mutex<Option<Instant>>,
}

/// Wraps one connection's service.
#[derive(Debug, Clone)]
pub struct RetryHold<S> {
    inner: S,
    hold: Arc<ConnectionHold>,
    max: Duration,
    held: Arc<AtomicU64>,
}

impl<S> RetryHold<S> {
    /// `inner` for one connection; holds at most `max` (zero: never); counts holds in `held`.
    pub fn new(inner: S, max: Duration, held: Arc<AtomicU64>) -> Self {
        Self { inner, hold: Arc::default(), max, held }
    }
}

/// The `Retry-After` of one of admission's refusals, in whole seconds.
fn retry_after(response: &Response<Body>) -> Option<u64> {
    response.extensions().get::<breakwater_admission::Refusal>()?;
    response.headers().get(header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()
}

impl<S> Service<Request<Body>> for RetryHold<S>
where
    S: Service<Request<Body>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = HoldFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        HoldFuture {
            state: HoldState::Calling { fut: self.inner.call(req) },
            hold: self.hold.clone(),
            max: self.max,
            held: self.held.clone(),
        }
    }
}

pin_project! {
    /// Future of [`RetryHold`].
    pub struct HoldFuture<F> {
        #[pin]
        state: HoldState<F>,
        hold: Arc<ConnectionHold>,
        max: Duration,
        held: Arc<AtomicU64>,
    }
}

pin_project! {
    #[project = HoldStateProj]
    enum HoldState<F> {
        Calling { #[pin] fut: F },
        Holding { sleep: Pin<Box<Sleep>>, response: Option<Response<Body>> },
    }
}

impl<F, E> Future for HoldFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                HoldStateProj::Calling { fut } => {
                    let response = ready!(fut.poll(cx))?;
                    let Some(secs) = retry_after(&response).filter(|_| !this.max.is_zero()) else {
                        return Poll::Ready(Ok(response));
                    };
                    let now = Instant::now();
                    let mut not_before = this.hold.not_before.lock().unwrap_or_else(PoisonError::into_inner);
                    // Never held longer than the cap, however many refusals came back early at once.
                    let send_at = match *not_before {
                        Some(t) if t > now => t.min(now + *this.max),
                        _ => now,
                    };
                    *not_before = Some(send_at + Duration::from_secs(secs).min(*this.max));
                    drop(not_before);
                    if send_at == now {
                        return Poll::Ready(Ok(response));
                    }
                    this.held.fetch_add(1, Ordering::Relaxed);
                    let sleep = Box::pin(tokio::time::sleep_until(send_at));
                    this.state.set(HoldState::Holding { sleep, response: Some(response) });
                }
                HoldStateProj::Holding { sleep, response } => {
                    ready!(sleep.as_mut().poll(cx));
                    let response = response.take().expect("a held response is sent once");
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}
