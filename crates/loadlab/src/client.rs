//! The HTTP client: a lean pool of HTTP/1.1 keep-alive connections over hyper's connection
//! API. A request takes an idle connection or, when none is idle, opens a new one, so the pool
//! never quietly turns the open loop into a closed one; the engine's in-flight cap (reported
//! when reached) is the only bound. The pool counts the connections it opens for the audit.
//! (hyper-util's pooled client did the same job at roughly twice the CPU per request.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

/// A response read to its end.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

type Sender = SendRequest<Full<Bytes>>;

/// Idle connections per `host:port`.
type Idle = Mutex<HashMap<String, Vec<Sender>>>;

/// A shared, cheaply cloneable HTTP/1.1 client (plain TCP: the lab's targets are local).
#[derive(Debug, Clone)]
pub struct Http {
    idle: Arc<Idle>,
    /// Connections opened, counted over this client and every client made from it by
    /// [`Http::own_connections`].
    opened: Arc<AtomicU64>,
    timeout: Duration,
    /// Reuse connections (the default); without, each request opens its own and asks the server
    /// to close it after the response.
    keep_alive: bool,
}

impl Http {
    /// `timeout` covers the whole exchange: connect, send, and reading the body.
    pub fn new(timeout: Duration) -> Self {
        Self { idle: Arc::default(), opened: Arc::default(), timeout, keep_alive: true }
    }

    /// A client with the same settings and connection count but connections of its own: one
    /// closed-loop caller's, so that its requests always travel on its own connection, as a
    /// browser tab's or a k6 VU's do, rather than on whichever pooled one is free.
    #[must_use]
    pub fn own_connections(&self) -> Self {
        Self { idle: Arc::default(), ..self.clone() }
    }

    /// Every request on a connection of its own (`Connection: close`), as clients that do not
    /// keep connections alive, or a flood of new connections.
    #[must_use]
    pub fn without_keep_alive(mut self) -> Self {
        self.keep_alive = false;
        self
    }

    /// Connections opened so far (monotonic).
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn take_idle(&self, authority: &str) -> Option<Sender> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(authority)?;
        while let Some(s) = list.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put_idle(&self, authority: &str, s: Sender) {
        if s.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            match idle.get_mut(authority) {
                Some(list) => list.push(s),
                None => {
                    idle.insert(authority.to_owned(), vec![s]);
                }
            }
        }
    }

    async fn connect(&self, authority: &str) -> Result<Sender, String> {
        let stream = tokio::net::TcpStream::connect(authority).await.map_err(|e| kind_of_io(&e))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.map_err(|e| kind_of_hyper_error(&e))?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // Ends when the server closes or the last sender is dropped.
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// A connection ready for a request: an idle one, else a new one.
    async fn checkout(&self, authority: &str) -> Result<(Sender, bool), String> {
        while let Some(mut s) = self.take_idle(authority) {
            if s.ready().await.is_ok() {
                return Ok((s, true));
            }
        }
        Ok((self.connect(authority).await?, false))
    }

    /// Sends one request and reads the whole body. Failures come back as an error kind:
    /// `timeout`, `connect`, `reset`, `io`, `bad_response`, `bad_request`.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        headers: &[(http::HeaderName, HeaderValue)],
        body: Option<Bytes>,
    ) -> Result<Reply, String> {
        let uri: Uri = uri.parse().map_err(|_| "bad_request".to_owned())?;
        let authority = match (uri.host(), uri.port_u16()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => format!("{h}:80"),
            _ => return Err("bad_request".to_owned()),
        };
        let host =
            HeaderValue::from_str(uri.authority().map_or("", |a| a.as_str())).map_err(|_| "bad_request".to_owned())?;
        let path: Uri =
            uri.path_and_query().map_or("/", |p| p.as_str()).parse().map_err(|_| "bad_request".to_owned())?;
        let build = || {
            let mut req =
                Request::builder().method(method.clone()).uri(path.clone()).header(http::header::HOST, host.clone());
            for (k, v) in headers {
                req = req.header(k, v);
            }
            if body.is_some() {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
            }
            if !self.keep_alive {
                req = req.header(http::header::CONNECTION, "close");
            }
            req.body(Full::new(body.clone().unwrap_or_default())).map_err(|_| "bad_request".to_owned())
        };
        let exchange = async {
            let (mut sender, reused) = if self.keep_alive {
                self.checkout(&authority).await?
            } else {
                (self.connect(&authority).await?, false)
            };
            let resp = match sender.send_request(build()?).await {
                Ok(r) => r,
                // A kept-alive connection the server closed before our request went out:
                // nothing was sent, so once more on a fresh connection (as browsers do).
                Err(e) if reused && (e.is_canceled() || e.is_incomplete_message()) => {
                    sender = self.connect(&authority).await?;
                    sender.send_request(build()?).await.map_err(|e| kind_of_hyper_error(&e))?
                }
                Err(e) => return Err(kind_of_hyper_error(&e)),
            };
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| kind_of_hyper_error(&e))?.to_bytes();
            let close = parts
                .headers
                .get(http::header::CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            if !close && self.keep_alive {
                self.put_idle(&authority, sender);
            }
            Ok(Reply { status: parts.status.as_u16(), headers: parts.headers, body })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err("timeout".to_owned()),
        }
    }
}

/// The kind [`Http::send`] reports, for a failure of another client (reqwest's, say) whose
/// error's chain holds hyper's error or the OS's: `reset`, `connect`, `timeout`, `bad_response`
/// or `io`. A client's own timer is in no such chain: the caller knows it as `timeout`.
pub fn transport_kind(e: &(dyn std::error::Error + 'static)) -> String {
    let mut src = Some(e);
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
        K::ConnectionRefused | K::AddrNotAvailable | K::AddrInUse => "connect",
        K::TimedOut => "timeout",
        _ => "io",
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error of another client that wraps the OS's, as reqwest's connect errors do.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn another_clients_failure_gets_the_kind_send_reports() {
        use std::io::{Error, ErrorKind};
        assert_eq!(transport_kind(&Wrapped(Error::from(ErrorKind::ConnectionRefused))), "connect");
        assert_eq!(transport_kind(&Wrapped(Error::from(ErrorKind::ConnectionReset))), "reset");
        assert_eq!(transport_kind(&Error::from(ErrorKind::TimedOut)), "timeout");
        assert_eq!(transport_kind(&std::fmt::Error), "io");
    }
}
