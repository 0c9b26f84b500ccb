//! Callers that come back before their `Retry-After` pay in time, not in the service's CPU.
//!
//! A refusal is cheap but not free: tens of microseconds of CPU each under a small quota, most
//! of it the HTTP stack and the kernel's socket work. A caller that ignores `Retry-After` comes
//! straight back, so enough of them can spend the whole CPU on refusals (a retry storm). The
//! pacer bounds that spend without slowing anyone it need not slow:
//!
//! A refusal to a caller that was told, by an earlier refusal, to come back later and came back
//! before then is *early*. An early refusal is held until the time the caller was told (never
//! longer than [`PacingConfig::max_hold`]), so a caller that waits for each answer before asking
//! again gets one refusal per `Retry-After` however fast it spins, and waits on a timer that costs
//! nothing. A caller that honours `Retry-After` is always refused at once, and an early request
//! that admission admits is served at once: only refusals are held.
//!
//! Callers are told apart by a key the user of the layer derives from the request. The API's is
//! the verified user (or the client's address for a request without a valid token) on one
//! connection: the identity, so that behind a load balancer, whose connections carry many
//! callers, one caller's haste does not hold another's refusals; the connection, so that the
//! workers of one token are held each until its own `Retry-After` rather than released together.
//!
//! The layer recognises the refusals it may pace by their response extensions: admission's own
//! [`Refusal`], or a [`PaceableRefusal`] that an outer layer (a throttle answering before
//! admission) puts on a refusal of its own. Either carries no slot and nothing pooled, so
//! delaying it holds nothing shared. A response that still holds something (a throttle's 429 or
//! a database bulkhead's 503 from inside an admitted request, whose body carries the admission
//! slot) must not be marked.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use serde::Serialize;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::keys::KeyHasher;
use crate::refusal::Refusal;
use crate::state::lock;

/// Marks a refusal made outside admission that holds nothing shared, so that the pacer may delay
/// it when its caller came back early. Put it in the response's extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PaceableRefusal {
    /// What the refusal's `Retry-After` header says, in its whole seconds (as admission's own
    /// [`Refusal`]): the pacer holds an early caller until the time it was told, which is the
    /// header's, not whenever the refusing limit frees.
    pub retry_after_seconds: u32,
}

/// Settings of the pacer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PacingConfig {
    /// The longest an early refusal is held, whatever the caller was told. Zero turns pacing off.
    pub max_hold: Duration,
}

impl PacingConfig {
    /// No pacing.
    pub const OFF: Self = Self { max_hold: Duration::ZERO };

    fn is_off(&self) -> bool {
        self.max_hold.is_zero()
    }
}

/// Live figures of the pacer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PacingSnapshot {
    /// The longest hold, milliseconds (0: pacing off).
    pub max_hold_ms: f64,
    /// Refusals that came back before their caller's `Retry-After`, since start.
    pub early_total: u64,
    /// Of those, the ones held.
    pub held_total: u64,
    /// Callers remembered now (told to come back later, and not yet due).
    pub callers: usize,
}

/// The pacer, shared by every service its layer makes. Cheap to clone.
#[derive(Clone)]
pub struct RetryPacing {
    shared: Arc<Shared>,
}

impl fmt::Debug for RetryPacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPacing").field("config", &self.shared.config).finish_non_exhaustive()
    }
}

struct Shared {
    config: PacingConfig,
    state: Mutex<State>,
    early: AtomicU64,
    held: AtomicU64,
}

struct State {
    /// Per caller, when its last refusal told it to come back.
    due: HashMap<u64, Instant, KeyHasher>,
    inserts: u32,
}

/// Callers remembered before the expired ones are dropped.
const PRUNE_AT: usize = 4096;
/// More callers than this still due after pruning: forget them all (not pacing a few early
/// callers is the safe failure).
const MOST_CALLERS: usize = 100_000;

impl RetryPacing {
    /// A pacer with these settings.
    #[must_use]
    pub fn new(config: PacingConfig) -> Self {
        let state = State { due: HashMap::default(), inserts: 0 };
        Self {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(state),
                early: AtomicU64::new(0),
                held: AtomicU64::new(0),
            }),
        }
    }

    /// The layer to put outside everything whose refusals it may pace. `caller` derives the key
    /// that tells callers apart (`None`: never paced).
    pub fn layer<K>(&self, caller: K) -> RetryPacingLayer<K> {
        RetryPacingLayer { pacing: self.clone(), caller }
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> PacingConfig {
        self.shared.config
    }

    /// Live figures.
    #[must_use]
    pub fn snapshot(&self) -> PacingSnapshot {
        let callers = lock(&self.shared.state).due.len();
        PacingSnapshot {
            max_hold_ms: self.shared.config.max_hold.as_secs_f64() * 1e3,
            early_total: self.shared.early.load(Ordering::Relaxed),
            held_total: self.shared.held.load(Ordering::Relaxed),
            callers,
        }
    }

    /// When to send a refusal to `caller` made `now` that says to come back after `retry_after`:
    /// now, unless the caller came back before its last refusal said to; then at that time (never
    /// later than the longest hold).
    pub fn schedule(&self, caller: u64, retry_after: Duration, now: Instant) -> Instant {
        let cfg = &self.shared.config;
        if cfg.is_off() {
            return now;
        }
        let mut st = lock(&self.shared.state);
        let send_at = match st.due.get(&caller).copied() {
            Some(due) if due > now => {
                self.shared.early.fetch_add(1, Ordering::Relaxed);
                // Each at its own time, not batched: releasing them together on a 50 ms tick made
                // an idle process's held refusals cheaper (48 us each instead of 171 us), but in a
                // busy one it sent them back in bursts, and served less (633 2xx/s against 705 at
                // 1,000 spinning callers, docs/ADMISSION.md).
                due.min(now + cfg.max_hold)
            }
            _ => now,
        };
        st.due.insert(caller, send_at + retry_after);
        st.inserts += 1;
        if st.due.len() > PRUNE_AT && st.inserts as usize > st.due.len() / 2 {
            st.due.retain(|_, due| *due > now);
            st.inserts = 0;
            if st.due.len() > MOST_CALLERS {
                st.due.clear();
            }
        }
        drop(st);
        if send_at > now {
            self.shared.held.fetch_add(1, Ordering::Relaxed);
        }
        send_at
    }
}

/// What a response's refusal says about coming back, if it is one the pacer may delay.
fn paceable<B>(response: &Response<B>) -> Option<Duration> {
    let ext = response.extensions();
    if let Some(r) = ext.get::<Refusal>() {
        return Some(Duration::from_secs(u64::from(r.retry_after_seconds)));
    }
    ext.get::<PaceableRefusal>().map(|p| Duration::from_secs(u64::from(p.retry_after_seconds)))
}

/// The layer of [`RetryPacing::layer`].
#[derive(Clone)]
pub struct RetryPacingLayer<K> {
    pacing: RetryPacing,
    caller: K,
}

impl<K> fmt::Debug for RetryPacingLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPacingLayer").field("pacing", &self.pacing).finish_non_exhaustive()
    }
}

impl<S, K: Clone> Layer<S> for RetryPacingLayer<K> {
    type Service = RetryPacingService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryPacingService { inner, pacing: self.pacing.clone(), caller: self.caller.clone() }
    }
}

/// The service [`RetryPacingLayer`] makes.
#[derive(Clone)]
pub struct RetryPacingService<S, K> {
    inner: S,
    pacing: RetryPacing,
    caller: K,
}

impl<S, K> fmt::Debug for RetryPacingService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPacingService").field("pacing", &self.pacing).finish_non_exhaustive()
    }
}

impl<S, K, B, ResBody> Service<Request<B>> for RetryPacingService<S, K>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    K: Fn(&Request<B>) -> Option<u64>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = PacedFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let caller = (self.caller)(&req);
        PacedFuture { state: PacedState::Calling { fut: self.inner.call(req) }, pacing: self.pacing.clone(), caller }
    }
}

pin_project! {
    /// Future of [`RetryPacingService`].
    pub struct PacedFuture<F, B> {
        #[pin]
        state: PacedState<F, B>,
        pacing: RetryPacing,
        caller: Option<u64>,
    }
}

pin_project! {
    #[project = PacedStateProj]
    enum PacedState<F, B> {
        Calling { #[pin] fut: F },
        Holding { sleep: Pin<Box<Sleep>>, response: Option<Response<B>> },
    }
}

impl<F, B> fmt::Debug for PacedFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            PacedState::Calling { .. } => "calling",
            PacedState::Holding { .. } => "holding",
        };
        f.debug_struct("PacedFuture").field("state", &state).finish()
    }
}

impl<F, B, E> Future for PacedFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                PacedStateProj::Calling { fut } => {
                    let response = ready!(fut.poll(cx))?;
                    let (Some(caller), Some(retry_after)) = (*this.caller, paceable(&response)) else {
                        return Poll::Ready(Ok(response));
                    };
                    let now = Instant::now();
                    let send_at = this.pacing.schedule(caller, retry_after, now);
                    if send_at <= now {
                        return Poll::Ready(Ok(response));
                    }
                    let sleep = Box::pin(tokio::time::sleep_until(send_at));
                    this.state.set(PacedState::Holding { sleep, response: Some(response) });
                }
                PacedStateProj::Holding { sleep, response } => {
                    ready!(sleep.as_mut().poll(cx));
                    let response = response.take().expect("a held response is sent once");
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pacer(max_hold_ms: u64) -> RetryPacing {
        RetryPacing::new(PacingConfig { max_hold: Duration::from_millis(max_hold_ms) })
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_waited_is_refused_at_once() {
        let p = pacer(2000);
        let t0 = Instant::now();
        assert_eq!(p.schedule(1, SECOND, t0), t0, "a first refusal is never held");
        let later = t0 + Duration::from_millis(1001);
        assert_eq!(p.schedule(1, SECOND, later), later, "it came back after its Retry-After");
        assert_eq!(p.snapshot().early_total, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_early_refusal_is_held_until_the_callers_retry_after() {
        let p = pacer(2000);
        let t0 = Instant::now();
        p.schedule(1, SECOND, t0);
        let early = t0 + Duration::from_millis(30);
        assert_eq!(p.schedule(1, SECOND, early), t0 + SECOND, "held until it was told to come back");
        // Told to come back two seconds after that one was sent.
        assert_eq!(p.schedule(1, SECOND, early + Duration::from_millis(1)), t0 + 2 * SECOND);
        // Another caller is not held for the first one's haste.
        assert_eq!(p.schedule(2, SECOND, early), early);
        let s = p.snapshot();
        assert_eq!((s.early_total, s.held_total), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn no_hold_outlasts_the_cap() {
        let p = pacer(2000);
        let t0 = Instant::now();
        p.schedule(1, Duration::from_secs(60), t0);
        assert_eq!(p.schedule(1, Duration::from_secs(60), t0), t0 + 2 * SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn off_never_holds() {
        let p = RetryPacing::new(PacingConfig::OFF);
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(p.schedule(1, SECOND, t0), t0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn expired_callers_are_forgotten() {
        let p = pacer(1000);
        let t0 = Instant::now();
        for caller in 0..(PRUNE_AT as u64 * 2) {
            p.schedule(caller, SECOND, t0);
        }
        let later = t0 + Duration::from_secs(5);
        for caller in 0..(PRUNE_AT as u64 * 2) {
            p.schedule(1_000_000 + caller, SECOND, later);
        }
        assert!(p.snapshot().callers <= PRUNE_AT * 2, "{}", p.snapshot().callers);
    }
}
