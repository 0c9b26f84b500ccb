//! `MAX_UNANSWERED_CONNECTIONS`: a connection storm is refused at once instead of queueing
//! inside the process.
//!
//! A connection counts as unanswered from its accept until its first response, its end, or
//! [`UNANSWERED_AT_MOST`]. While the cap is reached, a new connection's first request is
//! answered `503 load_shed` without running the app (a probe's is served), and the connection is
//! kept open for the client's next attempt. The refusal's `Retry-After` is a slot handed out at
//! the rate the counted connections are being answered (the cap over their mean time to a first
//! answer by the app), so the refused clients come back spread over the seconds the backlog takes
//! to serve instead of together.
//!
//! The connections accepted behind count too, until their first request is answered (the
//! refusal, or a probe's answer): in a storm the loop accepts thousands at once, and a connection
//! let through while they are still unread would wait behind all of them on the runtime's queue.
//!
//! Against a hostile client: a connection whose request head arrives in pieces (a slowloris
//! trickling its headers) stops counting as soon as a read leaves its head incomplete
//! ([`ReleasedOnPieces`]), so trickling clients cannot hold the cap. A silent connection holds
//! its place for a second at most (an honest client's request may not have arrived yet when its
//! connection is accepted), so a client opening the cap's worth of silent connections every
//! second keeps other new connections' first requests refused; each of their retries, on the
//! same connection, is served. The accept rate and `MAX_CONNECTIONS` still bound what such a
//! client can open. An honest head whose pieces arrive apart (written in parts, or large over a
//! slow network; hyper reads whatever the socket holds before it gives up the poll) stops
//! counting early too, which only lets the cap undercount.

use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, Response};
use futures_util::future::Either;

use super::timeouts::ConnTrack;
use crate::admission::BYPASS;
use crate::error::{ErrorCode, ErrorEnvelope};

/// How long a connection counts as unanswered at most: a client that connects and sends nothing
/// (or trickles its headers) stops holding new connections back after this.
pub(super) const UNANSWERED_AT_MOST: Duration = Duration::from_secs(1);

/// The longest `Retry-After` a reconnecting client is told, seconds: the cap's slots here, and
/// admission's `streams` class (`crate::admission`). A refused client comes back within about
/// twice this (clients add up to as much again in jitter), on the same connection, where
/// admission decides. 10 s against 5 s: a storm takes longer to open and its admitted openings'
/// p99 is lower, the refused coming back further apart (measured in
/// docs/lab/history/2026-12-05-storm-unanswered-cap.md).
pub(crate) const RECONNECT_LONGEST_RETRY_AFTER: u32 = 10;

/// The time to a first answer assumed before any was measured.
const FIRST_GUESS: Duration = Duration::from_millis(100);

/// The unanswered connections and their mean time from accept to first answer.
#[derive(Debug)]
pub(super) struct Backlog {
    count: AtomicUsize,
    /// Exponentially weighted mean, microseconds.
    answer_us: AtomicU64,
}

impl Backlog {
    pub(super) fn new() -> Self {
        Self { count: AtomicUsize::new(0), answer_us: AtomicU64::new(micros(FIRST_GUESS)) }
    }

    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The mean time from accept to first answer.
    pub(super) fn time_to_answer(&self) -> Duration {
        Duration::from_micros(self.answer_us.load(Ordering::Relaxed))
    }

    fn record(&self, took: Duration) {
        // A lost update under a race only drops one sample of a smoothed figure.
        let old = self.answer_us.load(Ordering::Relaxed);
        let new = micros(took).clamp(1_000, 1_000_000);
        self.answer_us.store(old - old / 8 + new / 8, Ordering::Relaxed);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One accepted connection, counted until its first response, its end or
/// [`UNANSWERED_AT_MOST`], whichever comes first.
pub(super) struct Unanswered {
    backlog: Arc<Backlog>,
    accepted: Instant,
    counted: AtomicBool,
    /// Whether its first answer is timed: not for a connection accepted behind, whose first
    /// answer is the refusal, not the app's.
    timed: bool,
}

impl Unanswered {
    /// Counts a connection just accepted; `timed`: whether its first answer is the app's.
    pub(super) fn count(backlog: &Arc<Backlog>, timed: bool) -> Arc<Self> {
        backlog.count.fetch_add(1, Ordering::Relaxed);
        Arc::new(Self { backlog: backlog.clone(), accepted: Instant::now(), counted: AtomicBool::new(true), timed })
    }

    /// Its first response: stops counting it, and times it.
    pub(super) fn answered(&self) {
        if self.release() && self.timed {
            self.backlog.record(self.accepted.elapsed());
        }
    }

    /// Stops counting it, untimed (it ended, or went past [`UNANSWERED_AT_MOST`]).
    pub(super) fn release(&self) -> bool {
        let was = self.counted.swap(false, Ordering::Relaxed);
        if was {
            self.backlog.count.fetch_sub(1, Ordering::Relaxed);
        }
        was
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.release();
    }
}

pin_project_lite::pin_project! {
    /// A connection's future that stops counting it as unanswered when one of its polls ends with
    /// a request head begun and not complete. hyper reads and parses in the same poll and hands a
    /// complete head to the app within it, so a head still arriving then came in pieces.
    pub(super) struct ReleasedOnPieces<F> {
        #[pin]
        inner: F,
        track: Arc<ConnTrack>,
        unanswered: Option<Arc<Unanswered>>,
    }
}

impl<F> ReleasedOnPieces<F> {
    pub(super) fn new(inner: F, track: Arc<ConnTrack>, unanswered: Option<Arc<Unanswered>>) -> Self {
        Self { inner, track, unanswered }
    }

    /// The connection itself (to ask it to shut down gracefully).
    pub(super) fn inner(self: Pin<&mut Self>) -> Pin<&mut F> {
        self.project().inner
    }
}

impl<F: Future> Future for ReleasedOnPieces<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let polled = this.inner.poll(cx);
        if polled.is_pending()
            && this.track.head_arriving()
            && let Some(u) = this.unanswered.take()
        {
            u.release();
        }
        polled
    }
}

/// The accept loop's retry slots: one every `time to answer / cap`, from now or the last one
/// handed out, whichever is later.
pub(super) struct RetrySlots {
    next: Instant,
}

impl RetrySlots {
    pub(super) fn new() -> Self {
        Self { next: Instant::now() }
    }

    /// The `Retry-After` of one more refused connection, whole seconds (1 to
    /// [`RECONNECT_LONGEST_RETRY_AFTER`]).
    pub(super) fn take(&mut self, now: Instant, backlog: &Backlog, cap: usize) -> u32 {
        let every = backlog.time_to_answer().div_f64(cap.max(1) as f64);
        self.next = self.next.max(now) + every;
        let wait = self.next.duration_since(now).as_secs_f64().ceil();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to a small range
        let seconds = wait.clamp(1.0, f64::from(RECONNECT_LONGEST_RETRY_AFTER)) as u32;
        seconds
    }
}

/// Answers a connection's first request `503 load_shed` at once when it was accepted behind
/// (`refuse_with`: its `Retry-After`; 0 when it was not), unless that request is a probe.
#[derive(Clone)]
pub(super) struct RefuseFirst<S> {
    pub(super) inner: S,
    pub(super) refuse_with: Arc<AtomicU32>,
    pub(super) refused: Arc<AtomicU64>,
}

impl<S> tower::Service<Request<Body>> for RefuseFirst<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible>,
{
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Either<Ready<Result<Response<Body>, std::convert::Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // Spent by the first request, whatever it is: one refusal per connection at most.
        let retry_after = self.refuse_with.swap(0, Ordering::Relaxed);
        let probe = req.method() == Method::GET && BYPASS.contains(&req.uri().path());
        if retry_after == 0 || probe {
            return Either::Right(self.inner.call(req));
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Either::Left(std::future::ready(Ok(refusal(retry_after))))
    }
}

fn refusal(retry_after: u32) -> Response<Body> {
    let envelope =
        ErrorEnvelope::new(ErrorCode::LoadShed, "behind on new connections".to_owned(), Some(retry_after.into()));
    crate::error::unavailable(&envelope, HeaderValue::from(retry_after)).map(Body::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_answer_rate_up_to_the_longest_retry_after() {
        let backlog = Backlog::new();
        // 48 at a time, 48 ms each: 1,000 answers a second.
        for _ in 0..64 {
            backlog.record(Duration::from_millis(48));
        }
        let mut slots = RetrySlots::new();
        let now = Instant::now();
        // A thousand slots a second, for three seconds past the longest wait.
        let n = (RECONNECT_LONGEST_RETRY_AFTER as usize + 3) * 1_000;
        let waits: Vec<u32> = (0..n).map(|_| slots.take(now, &backlog, 48)).collect();
        assert_eq!(waits[0], 1);
        assert_eq!(waits[990], 1, "the first second's worth waits one second");
        assert_eq!(waits[1_500], 2);
        assert_eq!(waits[3_500], 4);
        assert_eq!(waits.last(), Some(&RECONNECT_LONGEST_RETRY_AFTER), "capped");
        // Once the slots handed out are in the past, the next refusal waits a second again.
        assert_eq!(slots.take(now + Duration::from_secs(n as u64 / 1_000 + 1), &backlog, 48), 1);
    }

    #[test]
    fn a_connection_stops_counting_once_whatever_ends_it() {
        let backlog = Arc::new(Backlog::new());
        let a = Unanswered::count(&backlog, true);
        let b = Unanswered::count(&backlog, false);
        assert_eq!(backlog.count(), 2);
        a.answered();
        a.answered();
        assert!(!a.release());
        assert_eq!(backlog.count(), 1);
        drop(b);
        assert_eq!(backlog.count(), 0);
        drop(a);
        assert_eq!(backlog.count(), 0);
    }
}
