//! The HTTP client: hyper's pooled client over plain TCP, with a connector that counts the
//! connections it opens. The pool has no cap: when no connection is idle it opens another, so
//! the pool never quietly turns the open loop into a closed one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

type ConnectFuture = Pin<
    Box<
        dyn Future<Output = Result<TokioIo<TcpStream>, Box<dyn std::error::Error + Send + Sync>>>
            + Send,
    >,
>;

/// Wraps hyper's connector to count every connection opened (the self-audit reports it).
#[derive(Debug, Clone)]
struct CountingConnector {
    inner: HttpConnector,
    opened: Arc<AtomicU64>,
}

impl tower::Service<Uri> for CountingConnector {
    type Response = TokioIo<TcpStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let opened = Arc::clone(&self.opened);
        let fut = self.inner.call(dst);
        Box::pin(async move {
            let conn = fut.await?;
            opened.fetch_add(1, Ordering::Relaxed);
            Ok(conn)
        })
    }
}

/// A response read to its end.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A shared, cheaply cloneable HTTP client.
#[derive(Debug, Clone)]
pub struct Http {
    client: Client<CountingConnector, Full<Bytes>>,
    opened: Arc<AtomicU64>,
    timeout: Duration,
}

impl Http {
    /// `timeout` covers the whole exchange: connect, send, and reading the body.
    pub fn new(timeout: Duration) -> Self {
        let mut inner = HttpConnector::new();
        inner.set_nodelay(true);
        inner.set_connect_timeout(Some(timeout));
        let opened = Arc::new(AtomicU64::new(0));
        let connector = CountingConnector {
            inner,
            opened: Arc::clone(&opened),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        Self {
            client,
            opened,
            timeout,
        }
    }

    /// Connections opened so far (monotonic).
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends one request and reads the whole body. Failures come back as an error kind:
    /// `timeout`, `connect`, `reset`, `io`, `bad_request`.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        headers: &[(http::HeaderName, HeaderValue)],
        body: Option<Bytes>,
    ) -> Result<Reply, String> {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|_| "bad_request".to_owned())?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| kind_of_client_error(&e))?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| kind_of_hyper_error(&e))?
                .to_bytes();
            Ok(Reply {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
            })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err("timeout".to_owned()),
        }
    }
}

fn kind_of_client_error(e: &hyper_util::client::legacy::Error) -> String {
    if e.is_connect() {
        return "connect".to_owned();
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            return kind_of_hyper_error(h);
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return kind_of_io(io);
        }
        src = s.source();
    }
    "io".to_owned()
}

fn kind_of_hyper_error(e: &hyper::Error) -> String {
    if e.is_incomplete_message() || e.is_canceled() {
        return "reset".to_owned();
    }
    if e.is_parse() {
        return "bad_response".to_owned();
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return kind_of_io(io);
        }
        src = s.source();
    }
    "io".to_owned()
}

fn kind_of_io(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => "reset",
        K::ConnectionRefused => "connect",
        K::TimedOut => "timeout",
        _ => "io",
    }
    .to_owned()
}
