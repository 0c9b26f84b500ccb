//! The webhook HTTP client: HTTP/1.1 over hyper with its own keep-alive pool, so that it knows
//! what a general-purpose client does not tell its caller: whether a failed request was reused
//! from the pool, and whether any byte of it was written to the socket.
//!
//! That knowledge is the replay rule (the InsForge report's lesson: replaying a non-idempotent
//! POST that reached the server prints a second price label):
//!
//! - A pooled connection is checked before reuse: hyper's view of it, plus a non-blocking
//!   `peek` on the socket, which sees a FIN or RST the server sent while the connection sat idle
//!   even when no task has polled the socket since. Such stale connections are dropped, never
//!   handed out.
//! - If a request on a *reused* connection fails before a single byte of it was written (the
//!   server closed it between the check and the write), it never reached the server and is
//!   replayed at once, once, on a new connection ([`ClientCounters::replays`]).
//! - Anything else is returned as an error that says whether the request may have reached the
//!   server. The caller (the `deliver_message` job) never replays those itself: the queue
//!   retries them with backoff and the same idempotency key, so the receiver can deduplicate.
//! - A failure on a freshly opened connection is never replayed at once either: at the leading
//!   edge of a burst it is the signature of an overloaded receiver, which needs backoff.
//!
//! Every connection's addresses are resolved here and checked against the webhook policy
//! ([`breakwater_domain::webhooks::is_forbidden`]), so DNS cannot steer a delivery to an
//! internal service. Redirects are not followed.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use breakwater_domain::webhooks::{WebhookPolicy, WebhookUrl, is_forbidden};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, pki_types::ServerName};

/// How the client behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Which addresses may be called.
    pub policy: WebhookPolicy,
    /// The longest a TCP (and TLS) connect may take.
    pub connect_timeout: Duration,
    /// The longest a whole delivery may take, connect to response body.
    pub request_timeout: Duration,
    /// How long an idle connection is kept for reuse. Keep it below the receivers' keep-alive
    /// timeout (Node's default is 5 s) so that the client, not the server, closes idle ones.
    pub idle_timeout: Duration,
    /// Idle connections kept per origin.
    pub max_idle_per_host: usize,
    /// Check pooled connections with a socket `peek` before reuse. Only tests turn it off, to
    /// exercise the replay path deterministically.
    pub check_stale: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        use crate::settings::defaults as d;
        Self {
            policy: WebhookPolicy::production(),
            connect_timeout: Duration::from_millis(d::WEBHOOK_CONNECT_TIMEOUT_MS),
            request_timeout: Duration::from_millis(d::WEBHOOK_TIMEOUT_MS),
            idle_timeout: Duration::from_secs(d::WEBHOOK_IDLE_SECS),
            max_idle_per_host: d::WEBHOOK_MAX_IDLE_PER_HOST,
            check_stale: true,
        }
    }
}

/// What the client did, since it was built.
#[derive(Debug, Default)]
pub struct ClientCounters {
    /// Connections opened.
    pub connections_opened: AtomicU64,
    /// Requests sent on a pooled connection.
    pub reused: AtomicU64,
    /// Pooled connections found closed by the server before reuse, and dropped.
    pub stale_dropped: AtomicU64,
    /// Requests replayed at once because they failed on a reused connection before any byte was
    /// written.
    pub replays: AtomicU64,
}

/// A snapshot of [`ClientCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientCounts {
    /// Connections opened.
    pub connections_opened: u64,
    /// Requests sent on a pooled connection.
    pub reused: u64,
    /// Stale pooled connections dropped before reuse.
    pub stale_dropped: u64,
    /// Immediate replays of requests that never left.
    pub replays: u64,
}

impl ClientCounters {
    /// A snapshot.
    pub fn snapshot(&self) -> ClientCounts {
        ClientCounts {
            connections_opened: self.connections_opened.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            stale_dropped: self.stale_dropped.load(Ordering::Relaxed),
            replays: self.replays.load(Ordering::Relaxed),
        }
    }
}

/// A response: its status and, for 429/503, how long the server asked us to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// `Retry-After` in seconds, when given as a number.
    pub retry_after: Option<Duration>,
}

/// Why a delivery got no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The URL's host resolves to an address the policy forbids: retrying will not help.
    #[error("{0}")]
    Forbidden(String),
    /// The request never reached the server (DNS, connect or TLS failure, or a connection that
    /// died before the request was written). Safe to retry, after a backoff.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The request was written, at least partly, and no response came: the server may have
    /// applied it. Retry only with the same idempotency key, after a backoff.
    #[error("no response (the request may have reached the server): {0}")]
    MayHaveReached(String),
    /// No response within the request timeout (the request may have reached the server).
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// The pooled webhook client. Cheap to clone; clones share the pool.
#[derive(Clone, Debug)]
pub struct WebhookClient {
    inner: Arc<Inner>,
}

struct Inner {
    options: ClientOptions,
    tls: TlsConnector,
    idle: Mutex<HashMap<Origin, Vec<Idle>>>,
    counters: ClientCounters,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("options", &self.options).field("counters", &self.counters).finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Origin {
    https: bool,
    host: String,
    port: u16,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    /// A second handle on the socket, for the staleness `peek`.
    probe: std::net::TcpStream,
    /// Bytes written to the socket so far (TLS records included).
    written: Arc<AtomicU64>,
}

impl Conn {
    /// Whether the server closed (or reset) the connection, or sent something unasked, while it
    /// was idle. `peek` never consumes: hyper still reads whatever is there.
    fn is_stale(&self) -> bool {
        let mut byte = [0u8; 1];
        match self.probe.peek(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Ok(_) | Err(_) => true,
        }
    }
}

impl WebhookClient {
    /// A client with the given options.
    ///
    /// # Panics
    /// Never in practice: building the TLS configuration with the bundled roots cannot fail.
    #[must_use]
    pub fn new(options: ClientOptions) -> Self {
        let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        #[allow(clippy::expect_used)] // the ring provider supports the default protocol versions
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports TLS 1.2 and 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            inner: Arc::new(Inner {
                options,
                tls: TlsConnector::from(Arc::new(tls)),
                idle: Mutex::new(HashMap::new()),
                counters: ClientCounters::default(),
            }),
        }
    }

    /// The client's counters.
    #[must_use]
    pub fn counters(&self) -> ClientCounts {
        self.inner.counters.snapshot()
    }

    /// The options it was built with.
    #[must_use]
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// POSTs `body` to `url` with `headers`, within the request timeout.
    ///
    /// # Errors
    /// See [`SendError`]; a response with any status is `Ok`.
    pub async fn post(&self, url: &WebhookUrl, headers: HeaderMap, body: Bytes) -> Result<Reply, SendError> {
        let timeout = self.inner.options.request_timeout;
        tokio::time::timeout(timeout, self.post_inner(url, headers, body))
            .await
            .unwrap_or(Err(SendError::Timeout(timeout)))
    }

    async fn post_inner(&self, url: &WebhookUrl, headers: HeaderMap, body: Bytes) -> Result<Reply, SendError> {
        let origin = Origin { https: url.is_https(), host: url.host(), port: url.port() };
        let mut replayed = false;
        loop {
            let (mut conn, reused) = match self.checkout(&origin) {
                Some(conn) => (conn, true),
                None => (self.connect(url, &origin).await?, false),
            };
            let before = conn.written.load(Ordering::Acquire);
            let request = build_request(url, &origin, &headers, body.clone())?;
            let sent = match conn.sender.ready().await {
                Ok(()) => conn.sender.try_send_request(request).await.map_err(|mut e| {
                    let returned = e.take_message().is_some();
                    (returned, e.into_error())
                }),
                Err(e) => Err((true, e)),
            };
            match sent {
                Ok(response) => {
                    let status = response.status();
                    let retry_after = retry_after(response.headers());
                    let keep_alive = !closes(response.headers());
                    // Read (and bound) the body so the connection can be reused; a body that
                    // fails or is too large only costs the connection, the status stands.
                    let drained = Limited::new(response.into_body(), 64 * 1024).collect().await.is_ok();
                    if keep_alive && drained {
                        self.checkin(origin, conn);
                    }
                    return Ok(Reply { status, retry_after });
                }
                Err((returned, error)) => {
                    let unwritten = returned || conn.written.load(Ordering::Acquire) == before;
                    if unwritten && reused && !replayed {
                        replayed = true;
                        self.inner.counters.replays.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%error, host = %origin.host, "stale connection: replaying the unsent request");
                        continue;
                    }
                    return Err(if unwritten {
                        SendError::NotSent(error.to_string())
                    } else {
                        SendError::MayHaveReached(error.to_string())
                    });
                }
            }
        }
    }

    fn checkout(&self, origin: &Origin) -> Option<Conn> {
        let options = &self.inner.options;
        let mut idle = self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let list = idle.get_mut(origin)?;
        // Most recently used first: it is the warmest, and the others age out.
        while let Some(entry) = list.pop() {
            if entry.since.elapsed() >= options.idle_timeout {
                continue;
            }
            if entry.conn.sender.is_closed()
                || !entry.conn.sender.is_ready()
                || (options.check_stale && entry.conn.is_stale())
            {
                self.inner.counters.stale_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.inner.counters.reused.fetch_add(1, Ordering::Relaxed);
            return Some(entry.conn);
        }
        None
    }

    fn checkin(&self, origin: Origin, conn: Conn) {
        let max = self.inner.options.max_idle_per_host;
        let mut idle = self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let list = idle.entry(origin).or_default();
        if list.len() < max {
            list.push(Idle { conn, since: Instant::now() });
        }
    }

    async fn connect(&self, url: &WebhookUrl, origin: &Origin) -> Result<Conn, SendError> {
        let options = &self.inner.options;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((origin.host.as_str(), origin.port))
            .await
            .map_err(|e| SendError::NotSent(format!("{} does not resolve: {e}", origin.host)))?
            .collect();
        if !options.policy.allow_private
            && let Some(bad) = addrs.iter().find(|a| is_forbidden(a.ip()))
        {
            return Err(SendError::Forbidden(format!(
                "{} resolves to {}, a private, loopback or reserved address",
                origin.host,
                bad.ip()
            )));
        }
        let mut last_error = format!("{} has no address", origin.host);
        for addr in addrs {
            match tokio::time::timeout(options.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => return self.handshake(url, origin, stream).await,
                Ok(Err(e)) => last_error = format!("connect to {addr}: {e}"),
                Err(_) => last_error = format!("connect to {addr}: timed out"),
            }
        }
        Err(SendError::NotSent(last_error))
    }

    async fn handshake(&self, url: &WebhookUrl, origin: &Origin, stream: TcpStream) -> Result<Conn, SendError> {
        let not_sent = |what: &str, e: &dyn std::fmt::Display| SendError::NotSent(format!("{what}: {e}"));
        stream.set_nodelay(true).map_err(|e| not_sent("socket", &e))?;
        let std_stream = stream.into_std().map_err(|e| not_sent("socket", &e))?;
        let probe = std_stream.try_clone().map_err(|e| not_sent("socket", &e))?;
        let stream = TcpStream::from_std(std_stream).map_err(|e| not_sent("socket", &e))?;
        let written = Arc::new(AtomicU64::new(0));
        let counted = Counted { inner: stream, written: Arc::clone(&written) };
        let io: Box<dyn Io> = if url.is_https() {
            let name = ServerName::try_from(origin.host.clone()).map_err(|e| not_sent("TLS server name", &e))?;
            let tls = tokio::time::timeout(self.inner.options.connect_timeout, self.inner.tls.connect(name, counted))
                .await
                .map_err(|_| SendError::NotSent("TLS handshake timed out".into()))?
                .map_err(|e| not_sent("TLS handshake", &e))?;
            Box::new(tls)
        } else {
            Box::new(counted)
        };
        let (sender, connection) =
            http1::handshake(TokioIo::new(io)).await.map_err(|e| not_sent("HTTP handshake", &e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::trace!(error = %e, "webhook connection ended");
            }
        });
        // The TLS handshake wrote bytes; only the request's own bytes matter from here.
        self.inner.counters.connections_opened.fetch_add(1, Ordering::Relaxed);
        Ok(Conn { sender, probe, written })
    }
}

fn build_request(
    url: &WebhookUrl,
    origin: &Origin,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, SendError> {
    let parsed = url.url();
    let path = match parsed.query() {
        Some(q) => format!("{}?{q}", parsed.path()),
        None => parsed.path().to_owned(),
    };
    let default_port = if origin.https { 443 } else { 80 };
    let host = match (origin.port == default_port, parsed.host_str()) {
        (true, Some(h)) => h.to_owned(),
        (false, Some(h)) => format!("{h}:{}", origin.port),
        (_, None) => return Err(SendError::Forbidden("webhook URL has no host".into())),
    };
    let mut request = Request::post(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(header::USER_AGENT, HeaderValue::from_static(concat!("breakwater-worker/", env!("CARGO_PKG_VERSION"))))
        .body(Full::new(body))
        .map_err(|e| SendError::Forbidden(format!("webhook URL cannot be requested: {e}")))?;
    request.headers_mut().extend(headers.clone());
    Ok(request)
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

fn closes(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))))
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A socket that counts the bytes written to it.
struct Counted {
    inner: TcpStream,
    written: Arc<AtomicU64>,
}

impl Counted {
    fn count(&self, result: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = &result {
            self.written.fetch_add(*n as u64, Ordering::Release);
        }
        result
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.count(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.count(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
