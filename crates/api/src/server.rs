//! Serving: the accept loop, connection limits and timeouts, and graceful shutdown.
//!
//! axum's own `serve` sets no idle or header timeouts, so connections are served through
//! hyper-util's builder (as axum's `serve-with-hyper` example does):
//!
//! - at most `MAX_CONNECTIONS` open connections; past that, new ones wait in the listen backlog;
//! - a header-read timeout from a request's first byte to its last header (slowloris: a client
//!   trickling headers is cut off);
//! - an idle keep-alive timeout longer than the load balancer's (an ALB idles out at 60 s; a
//!   server that closes an idle connection first races the balancer's next request into a reset);
//! - on shutdown, every connection is told to finish its in-flight request and close, and the
//!   server waits for them up to the grace period.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// Counts open connections against the cap.
#[derive(Debug)]
pub struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
    open: AtomicUsize,
}

impl Connections {
    /// A counter allowing `max` connections.
    #[must_use]
    pub fn new(max: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(max)), max, open: AtomicUsize::new(0) }
    }

    /// Connections open now.
    #[must_use]
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The cap.
    #[must_use]
    pub fn max(&self) -> usize {
        self.max
    }
}

/// What [`serve`] can serve: the app with its outer layers, as one cloneable tower service.
pub trait HttpService:
    tower::Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> HttpService for S where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = std::convert::Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Connection-level settings.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Idle keep-alive timeout.
    pub keep_alive_timeout: Duration,
    /// Header read timeout.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get after shutdown begins.
    pub shutdown_grace: Duration,
}

/// Serves `app` on `listener` until `shutdown` is cancelled, then drains.
///
/// # Errors
/// Never for a single connection's failure; only when the listener itself fails for good.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    connections: Arc<Connections>,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> io::Result<()>
where
    S: HttpService,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Runs while a keep-alive connection idles too: this is the idle timeout. The short
        // header-read timeout is `ConnTrack`'s.
        .header_read_timeout(options.keep_alive_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(Duration::from_secs(20)));
    let builder = Arc::new(builder);
    let tracker = TaskTracker::new();

    loop {
        let permit = tokio::select! {
            permit = connections.permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    // EMFILE/ENFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let connections = connections.clone();
        connections.open.fetch_add(1, Ordering::Relaxed);
        let builder = builder.clone();
        let app = app.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            serve_connection(&builder, stream, peer, app, options.header_read_timeout, shutdown).await;
            connections.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }

    drop(listener);
    tracker.close();
    if tokio::time::timeout(options.shutdown_grace, tracker.wait()).await.is_err() {
        tracing::warn!(open = tracker.len(), "shutdown grace period over; closing remaining connections");
    }
    Ok(())
}

async fn serve_connection<S: HttpService>(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    peer: SocketAddr,
    app: S,
    header_read_timeout: Duration,
    shutdown: CancellationToken,
) {
    let track = Arc::new(ConnTrack::new());
    let io = TokioIo::new(TrackedIo { inner: stream, track: track.clone() });
    let on_request = track.clone();
    let service = TowerToHyperService::new(app.map_request(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(InFlight::start(&on_request));
        req.map(Body::new)
    }));
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, %peer, "connection ended with an error");
                }
                break;
            }
            () = shutdown.cancelled(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = track.head_overdue(header_read_timeout) => {
                tracing::debug!(%peer, "request headers not received in time: closing");
                break;
            }
        }
    }
}

/// Per-connection bookkeeping for the header-read timeout.
///
/// hyper's own `header_read_timeout` also runs while a keep-alive connection sits idle between
/// requests, so it is set to the (long) keep-alive timeout and acts as the idle timeout; the
/// (short) header-read timeout is enforced here, from the first byte of a request head until
/// the request reaches the service.
#[derive(Debug)]
struct ConnTrack {
    epoch: Instant,
    /// Milliseconds since `epoch` (plus one) when the current request head began; 0 when none.
    head_started: AtomicU64,
    in_flight: AtomicUsize,
    head_began: tokio::sync::Notify,
}

impl ConnTrack {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            head_started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            head_began: tokio::sync::Notify::new(),
        }
    }

    fn on_bytes_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 && self.head_started.load(Ordering::Relaxed) == 0 {
            let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
            self.head_started.store(ms, Ordering::Relaxed);
            self.head_began.notify_one();
        }
    }

    /// Resolves when a request head has been arriving for longer than `timeout`.
    async fn head_overdue(&self, timeout: Duration) {
        loop {
            let started = self.head_started.load(Ordering::Relaxed);
            if started == 0 {
                self.head_began.notified().await;
                continue;
            }
            let deadline = self.epoch + Duration::from_millis(started - 1) + timeout;
            tokio::time::sleep_until(deadline.into()).await;
            if self.head_started.load(Ordering::Relaxed) == started {
                return;
            }
        }
    }
}

/// Marks a request as in flight on its connection from the moment its head is parsed until the
/// request (and so its response) is dropped.
#[derive(Debug, Clone)]
struct InFlight {
    _guard: Arc<InFlightGuard>,
}

#[derive(Debug)]
struct InFlightGuard(Arc<ConnTrack>);

impl InFlight {
    fn start(track: &Arc<ConnTrack>) -> Self {
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
    struct TrackedIo<T> {
        #[pin]
        inner: T,
        track: Arc<ConnTrack>,
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
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
