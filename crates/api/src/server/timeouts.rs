//! The per-connection timeouts hyper does not keep itself: the header-read timeout, from a
//! request head's first byte until the request reaches the service, and the write stall
//! timeout, a response that has not written one byte for too long (the client stopped reading).
//! The connection's stream reports its reads and writes to its [`ConnTrack`], on which the
//! connection task waits.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Per-connection bookkeeping for the header-read timeout.
///
/// hyper's own `header_read_timeout` also runs while a keep-alive connection sits idle between
/// requests, so it is set to the (long) keep-alive timeout and acts as the idle timeout; the
/// (short) header-read timeout is enforced here, from the first byte of a request head until
/// the request reaches the service.
#[derive(Debug)]
pub(super) struct ConnTrack {
    epoch: Instant,
    /// Milliseconds since `epoch` (plus one) when the current request head began; 0 when none.
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    head_began: tokio::sync::Notify,
    /// Milliseconds since `epoch` (plus one) since when a write has made no progress (the client
    /// stopped reading and the socket's buffers are full); 0 while writes progress.
    write_stalled: AtomicU64,
    write_began_stalling: tokio::sync::Notify,
}

impl ConnTrack {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            head_started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            head_began: tokio::sync::Notify::new(),
            write_stalled: AtomicU64::new(0),
            write_began_stalling: tokio::sync::Notify::new(),
        }
    }

    fn since_epoch_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// After each write: a write that could not proceed starts (or continues) a stall; one that
    /// wrote anything ends it.
    fn on_write<T>(&self, result: &Poll<io::Result<T>>, progressed: impl FnOnce(&T) -> bool) {
        match result {
            Poll::Pending => {
                if self.write_stalled.load(Ordering::Relaxed) == 0 {
                    self.write_stalled.store(self.since_epoch_ms(), Ordering::Relaxed);
                    self.write_began_stalling.notify_one();
                }
            }
            Poll::Ready(Ok(n)) if progressed(n) => self.write_stalled.store(0, Ordering::Relaxed),
            Poll::Ready(_) => {}
        }
    }

    /// Resolves when a response has been stuck, not one byte written, for longer than `timeout`.
    pub(super) async fn write_overdue(&self, timeout: Duration) {
        self.overdue(&self.write_stalled, &self.write_began_stalling, timeout).await;
    }

    fn on_bytes_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 && self.head_started.load(Ordering::Relaxed) == 0 {
            self.head_started.store(self.since_epoch_ms(), Ordering::Relaxed);
            self.head_began.notify_one();
        }
    }

    /// Whether a request head has begun to arrive and is not complete yet.
    pub(super) fn head_arriving(&self) -> bool {
        self.head_started.load(Ordering::Relaxed) != 0
    }

    /// Resolves when a request head has been arriving for longer than `timeout`.
    pub(super) async fn head_overdue(&self, timeout: Duration) {
        self.overdue(&self.head_started, &self.head_began, timeout).await;
    }

    /// Resolves when the moment in `since` (milliseconds since `epoch`, plus one; 0: none, and
    /// `began` is notified when one is set) is more than `timeout` old and still the same.
    async fn overdue(&self, since: &AtomicU64, began: &tokio::sync::Notify, timeout: Duration) {
        loop {
            let started = since.load(Ordering::Relaxed);
            if started == 0 {
                began.notified().await;
                continue;
            }
            let deadline = self.epoch + Duration::from_millis(started - 1) + timeout;
            tokio::time::sleep_until(deadline.into()).await;
            if since.load(Ordering::Relaxed) == started {
                return;
            }
        }
    }
}

/// Marks a request as in flight on its connection from the moment its head is parsed until the
/// request (and so its response) is dropped.
#[derive(Debug, Clone)]
pub(super) struct InFlight {
    _guard: Arc<InFlightGuard>,
}

#[derive(Debug)]
struct InFlightGuard(Arc<ConnTrack>);

impl InFlight {
    pub(super) fn start(track: &Arc<ConnTrack>) -> Self {
        track.in_flight.fetch_add(1, Ordering::Relaxed);
        track.head_started.store(0, Ordering::Relaxed);
        Self { _guard: Arc::new(InFlightGuard(track.clone())) }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A stream that tells its [`ConnTrack`] when request bytes arrive.
    pub(super) struct TrackedIo<T> {
        #[pin]
        pub(super) inner: T,
        pub(super) track: Arc<ConnTrack>,
    }
}

impl<T: AsyncRead> AsyncRead for TrackedIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let result = this.inner.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.track.on_bytes_read();
        }
        result
    }
}

impl<T: AsyncWrite> AsyncWrite for TrackedIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write(cx, buf);
        this.track.on_write(&result, |n| *n > 0);
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write_vectored(cx, bufs);
        this.track.on_write(&result, |n| *n > 0);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        let result = this.inner.poll_flush(cx);
        this.track.on_write(&result, |()| true);
        result
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}
