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
//! - optionally, at most `MAX_UNANSWERED_CONNECTIONS` accepted and not answered once yet: past
//!   it a new connection's first request is answered a `503 load_shed` at once (a probe's is
//!   served) and the connection kept for the next attempt, with a `Retry-After` that spreads
//!   the refused clients over the seconds the backlog takes (`behind.rs`). A reconnection storm
//!   is then refused at once instead of queueing in the process's run queue;
//! - a header-read timeout from a request's first byte to its last header (slowloris: a client
//!   trickling headers is cut off);
//! - an idle keep-alive timeout longer than the load balancer's (an ALB idles out at 60 s; a
//!   server that closes an idle connection first races the balancer's next request into a reset);
//! - on shutdown, every connection is told to finish its in-flight request and close, and the
//!   server waits for them up to the grace period.

mod behind;
mod shed;
mod timeouts;

pub(crate) use behind::RECONNECT_LONGEST_RETRY_AFTER;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::throttle::gcra::{self, Limit};
use behind::{Backlog, RefuseFirst, ReleasedOnPieces, RetrySlots, UNANSWERED_AT_MOST, Unanswered};
use timeouts::{ConnTrack, InFlight, TrackedIo};

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
    /// Most connections accepted and not answered once yet; `0`: no limit.
    max_unanswered: usize,
    backlog: Arc<Backlog>,
    refused_behind: Arc<AtomicU64>,
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
            max_unanswered: 0,
            backlog: Arc::new(Backlog::new()),
            refused_behind: Arc::new(AtomicU64::new(0)),
        }
    }

    /// While `max` connections accepted before it have not been answered once, a new
    /// connection's first request is answered `503 load_shed` at once (a probe's is served), and
    /// the connection kept for the client's next attempt. `0` means no limit.
    #[must_use]
    pub fn with_max_unanswered(mut self, max: usize) -> Self {
        self.max_unanswered = max;
        self
    }

    /// Connections accepted and not answered once yet.
    #[must_use]
    pub fn unanswered(&self) -> usize {
        self.backlog.count()
    }

    /// The cap on unanswered connections (`0`: none).
    #[must_use]
    pub fn max_unanswered(&self) -> usize {
        self.max_unanswered
    }

    /// First requests answered `503 load_shed` because their connection came while
    /// `max_unanswered` were unanswered, since start.
    #[must_use]
    pub fn refused_behind(&self) -> u64 {
        self.refused_behind.load(Ordering::Relaxed)
    }

    /// Accepts at most `per_sec` new connections a second, in bursts of up to `burst` (`0`: a
    /// tenth of a second's worth, at least 16). `per_sec` `0` means no limit.
    #[must_use]
    pub fn with_accept_rate(mut self, per_sec: u32, burst: u32) -> Self {
        let burst = if burst == 0 { (per_sec / 10).max(16) } else { burst };
        self.accept_rate = (per_sec > 0).then(|| Limit { rate_per_sec: f64::from(per_sec), burst });
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
    let mut slots = RetrySlots::new();

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
        let behind = connections.max_unanswered > 0 && connections.backlog.count() >= connections.max_unanswered;
        let refuse_with =
            if behind { slots.take(Instant::now(), &connections.backlog, connections.max_unanswered) } else { 0 };
        let _ = stream.set_nodelay(true);
        connections.open.fetch_add(1, Ordering::Relaxed);
        let unanswered = (connections.max_unanswered > 0).then(|| Unanswered::count(&connections.backlog, !behind));
        let task = edge.clone();
        tracker.spawn(async move {
            task.serve_connection(&task.keep_alive, stream, peer, unanswered, refuse_with).await;
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
    async fn serve_connection(
        &self,
        builder: &auto::Builder<TokioExecutor>,
        stream: TcpStream,
        peer: SocketAddr,
        unanswered: Option<Arc<Unanswered>>,
        refuse_with: u32,
    ) {
        let header_read_timeout = self.options.header_read_timeout;
        let track = Arc::new(ConnTrack::new());
        let io = TokioIo::new(TrackedIo { inner: stream, track: track.clone() });
        let on_request = track.clone();
        let connection = ConnectionId(NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed));
        // A connection accepted behind has its first request refused inside the request-read
        // hook, so the request counts as read (the header-read timeout stops) like any other.
        let app = RefuseFirst {
            inner: self.app.clone(),
            refuse_with: Arc::new(std::sync::atomic::AtomicU32::new(refuse_with)),
            refused: self.connections.refused_behind.clone(),
        };
        let first_answer = unanswered.clone();
        let service = app
            .map_request(move |mut req: Request<hyper::body::Incoming>| {
                // Off under the default filter. The reliability suite turns it on to tell a
                // request the server read from one it never saw (the keep-alive close race).
                tracing::debug!(
                    target: REQUEST_READ,
                    request_id = req.headers().get(&crate::REQUEST_ID).and_then(|v| v.to_str().ok()),
                    "request read"
                );
                req.extensions_mut().insert(ConnectInfo(peer));
                req.extensions_mut().insert(connection);
                req.extensions_mut().insert(InFlight::start(&on_request));
                req.map(Body::new)
            })
            .map_response(move |response| {
                if let Some(u) = &first_answer {
                    u.answered();
                }
                response
            });
        let service = TowerToHyperService::new(service);
        let conn = builder.serve_connection_with_upgrades(io, service);
        let conn = ReleasedOnPieces::new(conn, track.clone(), unanswered.clone());
        tokio::pin!(conn);
        let mut closing = false;
        let counted_until = tokio::time::sleep(UNANSWERED_AT_MOST);
        tokio::pin!(counted_until);
        let mut counting = unanswered.is_some();
        loop {
            tokio::select! {
                () = counted_until.as_mut(), if counting => {
                    counting = false;
                    if let Some(u) = &unanswered {
                        u.release();
                    }
                }
                result = conn.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(error = %err, %peer, "connection ended with an error");
                    }
                    break;
                }
                () = self.shutdown.cancelled(), if !closing => {
                    conn.as_mut().inner().graceful_shutdown();
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

impl crate::figures::Publish for Connections {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Lines, NOT_ALARMED, Unit};
        out.gauge("connections_open", "Open client connections", self.open())
            .emf("ConnectionsOpen", Unit::Count, Lines::Task)
            .ops("open");
        out.setting("connections_max", "Connection cap", self.max()).ops("max");
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
        out.gauge("connections_unanswered", "Connections accepted and not answered once yet", self.unanswered())
            .no_emf(NOT_ALARMED)
            .ops("unanswered");
        out.setting(
            "connections_max_unanswered",
            "Unanswered connections past which a new one's first request is refused (0: no cap)",
            self.max_unanswered(),
        )
        .ops("max_unanswered");
        out.counter(
            "connections_refused_behind",
            "First requests answered 503 load_shed because MAX_UNANSWERED_CONNECTIONS were unanswered",
            self.refused_behind(),
        )
        .emf("ConnectionsRefused", Unit::Count, Lines::Task)
        .ops("refused_behind");
        out.counter("connections_accept_paced", "Times the accept loop paused for MAX_ACCEPT_RATE", self.paced())
            .no_emf(NOT_ALARMED)
            .ops("accept_paced");
    }
}
