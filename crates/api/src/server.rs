//! Serving: the accept loop, connection limits and timeouts, and graceful shutdown.
//!
//! axum's own `serve` sets no idle or header timeouts, so connections are served through
//! hyper-util's builder (as axum's `serve-with-hyper` example does):
//!
//! - at most `MAX_CONNECTIONS` open connections. Past that the edge sheds: a new connection is
//!   accepted and answered a canned `503 load_shed` + `Retry-After` without running hyper, the
//!   router or anything behind them (except a `/health` request, which is still served, so the
//!   load balancer never sees a healthy task as dead). At most `MAX_REFUSING_CONNECTIONS` are being
//!   refused at once; past that a connection is reset at once, the cheapest refusal there is.
//!   `CONNECTION_OVERFLOW=backlog` restores the classic behaviour (the accept loop stops and new
//!   connections wait in the kernel's listen backlog, `LISTEN_BACKLOG` long);
//! - optionally, at most `MAX_ACCEPT_RATE` new connections a second (HAProxy's `maxconnrate`):
//!   past it the loop stops accepting for a moment and new connections wait in the listen
//!   backlog, whose overflow the kernel drops at no cost to the process. Under a small CPU quota
//!   this is what keeps a connection flood from spending the whole quota on accepting and
//!   refusing, which starves the connections already open (the load balancer's health checks
//!   among them);
//! - a header-read timeout from a request's first byte to its last header (slowloris: a client
//!   trickling headers is cut off);
//! - an idle keep-alive timeout longer than the load balancer's (an ALB idles out at 60 s; a
//!   server that closes an idle connection first races the balancer's next request into a reset);
//! - on shutdown, every connection is told to finish its in-flight request and close, and the
//!   server waits for them up to the grace period.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::admission::BYPASS;
use crate::error::{ErrorCode, ErrorEnvelope};
use crate::throttle::gcra::{self, Limit};

/// Which of the process's connections a request came on (in its extensions): the refusal pacer
/// tells callers apart by it, beside their identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub u64);

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(0);

/// What happens to a connection that arrives while `MAX_CONNECTIONS` are open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionOverflow {
    /// Accept it and answer a canned 503 `load_shed` (a `/health` request is still served);
    /// reset it when `MAX_REFUSING_CONNECTIONS` refusals are already under way.
    Refuse,
    /// Stop accepting: it waits in the kernel's listen backlog until a connection closes.
    Backlog,
}

/// Counts open connections against the cap, and the ones refused at the edge.
#[derive(Debug)]
pub struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
    open: AtomicUsize,
    overflow: ConnectionOverflow,
    refusing: Arc<Semaphore>,
    refusing_max: usize,
    refused: AtomicU64,
    reset: AtomicU64,
    served_over_cap: AtomicU64,
    accept_rate: Option<Limit>,
    paced: AtomicU64,
    write_stalls: AtomicU64,
}

impl Connections {
    /// A counter allowing `max` connections, refusing at most `refusing_max` more at once.
    #[must_use]
    pub fn new(max: usize, overflow: ConnectionOverflow, refusing_max: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
            open: AtomicUsize::new(0),
            overflow,
            refusing: Arc::new(Semaphore::new(refusing_max)),
            refusing_max,
            refused: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            served_over_cap: AtomicU64::new(0),
            accept_rate: None,
            paced: AtomicU64::new(0),
            write_stalls: AtomicU64::new(0),
        }
    }

    /// Accepts at most `per_sec` new connections a second, in bursts of up to a tenth of a
    /// second's worth (at least 16). `0` means no limit.
    #[must_use]
    pub fn with_accept_rate(mut self, per_sec: u32) -> Self {
        self.accept_rate =
            (per_sec > 0).then(|| Limit { rate_per_sec: f64::from(per_sec), burst: (per_sec / 10).max(16) });
        self
    }

    /// The accept rate limit, if any.
    #[must_use]
    pub fn accept_rate(&self) -> Option<Limit> {
        self.accept_rate
    }

    /// Times the accept loop paused for the accept rate limit, since start.
    #[must_use]
    pub fn paced(&self) -> u64 {
        self.paced.load(Ordering::Relaxed)
    }

    /// Connections closed because the client stopped reading its response for longer than
    /// `WRITE_STALL_TIMEOUT_SECS`, since start.
    #[must_use]
    pub fn write_stalls(&self) -> u64 {
        self.write_stalls.load(Ordering::Relaxed)
    }

    /// What happens past the cap.
    #[must_use]
    pub fn overflow(&self) -> ConnectionOverflow {
        self.overflow
    }

    /// Most connections being refused at once.
    #[must_use]
    pub fn refusing_max(&self) -> usize {
        self.refusing_max
    }

    /// Connections answered the canned 503 at the edge, since start.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections reset at accept because too many refusals were under way, since start.
    #[must_use]
    pub fn reset(&self) -> u64 {
        self.reset.load(Ordering::Relaxed)
    }

    /// `/health` requests served on a connection over the cap, since start.
    #[must_use]
    pub fn served_over_cap(&self) -> u64 {
        self.served_over_cap.load(Ordering::Relaxed)
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
    /// The longest a response may go without one byte written (the client not reading) before
    /// the connection is closed.
    pub write_stall_timeout: Duration,
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
    let edge = Arc::new(Edge {
        app,
        keep_alive: http_builder(options, true),
        // A health request over the cap gets one request on its connection: it holds a
        // refusal slot, which must come back quickly.
        single_request: http_builder(options, false),
        connections,
        options,
        shutdown,
        tracker: TaskTracker::new(),
    });
    let (connections, shutdown, tracker) = (&edge.connections, &edge.shutdown, &edge.tracker);
    let mut pacer = connections.accept_rate.map(Pacer::new);

    loop {
        if let Some(pacer) = pacer.as_mut()
            && let Some(wait) = pacer.take()
        {
            connections.paced.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                () = tokio::time::sleep(wait) => continue,
                () = shutdown.cancelled() => break,
            }
        }
        // With a backlog overflow the loop stops accepting at the cap.
        let reserved = if connections.overflow == ConnectionOverflow::Backlog {
            tokio::select! {
                permit = connections.permits.clone().acquire_owned() => match permit {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
                () = shutdown.cancelled() => break,
            }
        } else {
            None
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
        let Ok(permit) = reserved.map_or_else(|| connections.permits.clone().try_acquire_owned(), Ok) else {
            Edge::shed(&edge, stream, peer);
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.open.fetch_add(1, Ordering::Relaxed);
        let task = edge.clone();
        tracker.spawn(async move {
            task.serve_connection(&task.keep_alive, stream, peer).await;
            task.connections.open.fetch_sub(1, Ordering::Relaxed);
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

/// The accept rate limit: one GCRA bucket (the throttles' arithmetic) on the loop's own clock.
struct Pacer {
    limit: Limit,
    epoch: Instant,
    tat: Option<i64>,
}

impl Pacer {
    fn new(limit: Limit) -> Self {
        Self { limit, epoch: Instant::now(), tat: None }
    }

    /// Takes one accept: `None` when it may go ahead now, or how long to wait before asking again.
    fn take(&mut self) -> Option<Duration> {
        let now = i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX);
        match gcra::check(self.tat, now, self.limit) {
            gcra::Outcome::Admitted { tat, .. } => {
                self.tat = Some(tat);
                None
            }
            gcra::Outcome::Refused { retry_after_us } => {
                Some(Duration::from_micros(u64::try_from(retry_after_us).unwrap_or(0).max(1)))
            }
        }
    }
}

/// Binds `addr` with a listen backlog of `backlog` connections (the kernel caps it at
/// `net.core.somaxconn`). `SO_REUSEADDR` is set, as `TcpListener::bind` does, so a restarted
/// process binds at once despite connections in `TIME_WAIT`.
///
/// # Errors
/// When the socket cannot be created, bound or put in the listening state.
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

fn http_builder(options: ServeOptions, keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Runs while a keep-alive connection idles too: this is the idle timeout. The short
        // header-read timeout is `ConnTrack`'s.
        .header_read_timeout(options.keep_alive_timeout)
        .keep_alive(keep_alive);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(Duration::from_secs(20)));
    builder
}

/// The target of the debug event logged for every request hyper hands to the app, before any
/// layer runs (`RUST_LOG=info,breakwater_api::request_read=debug` turns it on).
pub const REQUEST_READ: &str = "breakwater_api::request_read";

/// How long a connection over the cap may take to show its request line before it is refused.
const PEEK_WAIT: Duration = Duration::from_millis(100);
/// How long a refused connection is kept open, discarding input, for its client to read the 503
/// and close first (closing with unread input would reset the connection and could lose it).
const REFUSAL_LINGER: Duration = Duration::from_millis(500);
/// Most request bytes read and discarded before the 503 is written.
const REFUSAL_DRAIN_BYTES: usize = 64 * 1024;

/// The edge's answer past the connection cap: the API's envelope, written without hyper.
static REFUSAL: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let body = ErrorEnvelope::new(ErrorCode::LoadShed, "connection limit reached".to_owned(), Some(1)).to_bytes();
    let mut bytes = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(&body);
    bytes
});

/// What the accept loop shares with its connection tasks.
struct Edge<S> {
    app: S,
    keep_alive: auto::Builder<TokioExecutor>,
    single_request: auto::Builder<TokioExecutor>,
    connections: Arc<Connections>,
    options: ServeOptions,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl<S: HttpService> Edge<S> {
    /// A connection past the cap: served if it asks for `/health`, answered the
    /// canned 503 otherwise, reset at once if too many refusals are under way.
    fn shed(edge: &Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let Ok(slot) = edge.connections.refusing.clone().try_acquire_owned() else {
            // RST on drop: no task, no buffers, no TIME_WAIT.
            let _ = stream.set_zero_linger();
            edge.connections.reset.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let task = edge.clone();
        edge.tracker.spawn(async move {
            if asks_for_bypass_path(&stream).await {
                task.connections.served_over_cap.fetch_add(1, Ordering::Relaxed);
                task.serve_connection(&task.single_request, stream, peer).await;
            } else {
                task.connections.refused.fetch_add(1, Ordering::Relaxed);
                refuse(stream).await;
            }
            drop(slot);
        });
    }

    async fn serve_connection(&self, builder: &auto::Builder<TokioExecutor>, stream: TcpStream, peer: SocketAddr) {
        let header_read_timeout = self.options.header_read_timeout;
        let track = Arc::new(ConnTrack::new());
        let io = TokioIo::new(TrackedIo { inner: stream, track: track.clone() });
        let on_request = track.clone();
        let connection = ConnectionId(NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed));
        let app = self.app.clone();
        let service = TowerToHyperService::new(app.map_request(move |mut req: Request<hyper::body::Incoming>| {
            // Off under the default filter. The reliability suite turns it on to tell a request
            // the server read from one it never saw (the keep-alive close race).
            tracing::debug!(
                target: REQUEST_READ,
                request_id = req.headers().get(&crate::REQUEST_ID).and_then(|v| v.to_str().ok()),
                "request read"
            );
            req.extensions_mut().insert(ConnectInfo(peer));
            req.extensions_mut().insert(connection);
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
                () = self.shutdown.cancelled(), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = track.head_overdue(header_read_timeout) => {
                    tracing::debug!(%peer, "request headers not received in time: closing");
                    break;
                }
                () = track.write_overdue(self.options.write_stall_timeout) => {
                    tracing::debug!(%peer, "the client stopped reading its response: closing");
                    self.connections.write_stalls.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// Whether the connection's first request line is a GET of a path admission never sheds.
async fn asks_for_bypass_path(stream: &TcpStream) -> bool {
    let mut head = [0u8; 32];
    let Ok(Ok(n)) = tokio::time::timeout(PEEK_WAIT, stream.peek(&mut head)).await else {
        return false;
    };
    let Some(target) = head[..n].strip_prefix(b"GET ") else {
        return false;
    };
    BYPASS
        .iter()
        .any(|path| target.strip_prefix(path.as_bytes()).is_some_and(|rest| matches!(rest.first(), Some(b' ' | b'?'))))
}

async fn refuse(mut stream: TcpStream) {
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < REFUSAL_DRAIN_BYTES {
        match stream.try_read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    if tokio::time::timeout(REFUSAL_LINGER, stream.write_all(&REFUSAL)).await.is_err() {
        let _ = stream.set_zero_linger();
        return;
    }
    let _ = stream.shutdown().await;
    let _ =
        tokio::time::timeout(REFUSAL_LINGER, async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} })
            .await;
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
    /// Milliseconds since `epoch` (plus one) since when a write has made no progress (the client
    /// stopped reading and the socket's buffers are full); 0 while writes progress.
    write_stalled: AtomicU64,
    write_began_stalling: tokio::sync::Notify,
}

impl ConnTrack {
    fn new() -> Self {
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
    async fn write_overdue(&self, timeout: Duration) {
        self.overdue(&self.write_stalled, &self.write_began_stalling, timeout).await;
    }

    fn on_bytes_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 && self.head_started.load(Ordering::Relaxed) == 0 {
            self.head_started.store(self.since_epoch_ms(), Ordering::Relaxed);
            self.head_began.notify_one();
        }
    }

    /// Resolves when a request head has been arriving for longer than `timeout`.
    async fn head_overdue(&self, timeout: Duration) {
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

impl crate::figures::Publish for Connections {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Lines, NOT_ALARMED, SETTING, Unit};
        out.gauge("connections_open", "Open client connections", self.open())
            .emf("ConnectionsOpen", Unit::Count, Lines::Task)
            .ops("open");
        out.gauge("connections_max", "Connection cap", self.max()).no_emf(SETTING).ops("max");
        out.counter(
            "connections_refused",
            "Connections answered 503 load_shed at accept (over the cap)",
            self.refused(),
        )
        .emf("ConnectionsRefused", Unit::Count, Lines::Task)
        .ops("refused");
        out.counter(
            "connections_reset",
            "Connections reset at accept (over the cap, refusals saturated)",
            self.reset(),
        )
        .emf("ConnectionsRefused", Unit::Count, Lines::Task)
        .ops("reset");
        out.counter("connections_accept_paced", "Times the accept loop paused for MAX_ACCEPT_RATE", self.paced())
            .no_emf(NOT_ALARMED)
            .ops("accept_paced");
    }
}
