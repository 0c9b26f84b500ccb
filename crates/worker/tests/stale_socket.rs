//! The webhook client's replay rule against a local server that closes idle keep-alive
//! connections (the InsForge report's stale-socket race): stale pooled connections are dropped
//! before reuse; a request that failed on a reused connection before any byte left is replayed
//! at once; a request that may have reached the server never is.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_domain::webhooks::{WebhookPolicy, WebhookUrl};
use breakwater_worker::client::{ClientOptions, SendError, WebhookClient};
use bytes::Bytes;
use http::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Clone, Copy)]
enum Mode {
    /// Answer every request; close a connection idle for this long (RST when `reset`).
    CloseIdle { after: Duration, reset: bool },
    /// Answer the requests of a connection before the `nth`; read that one, then close without
    /// answering.
    Drop { nth: usize },
}

#[derive(Default)]
struct Seen {
    connections: AtomicU64,
    bodies: Mutex<Vec<String>>,
}

/// A raw HTTP/1.1 server on its own thread and runtime, so that a test may block its own.
fn serve(mode: Mode) -> (u16, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let port = std_listener.local_addr().unwrap().port();
    let state = Arc::clone(&seen);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                state.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(connection(stream, mode, Arc::clone(&state)));
            }
        });
    });
    (port, seen)
}

async fn connection(mut stream: TcpStream, mode: Mode, seen: Arc<Seen>) {
    let mut served = 0;
    loop {
        let request = match mode {
            Mode::CloseIdle { after, reset } => match tokio::time::timeout(after, read_request(&mut stream)).await {
                Ok(Some(body)) => body,
                Ok(None) => return,
                Err(_) => {
                    if reset {
                        stream.set_zero_linger().unwrap();
                    }
                    return; // dropped: FIN, or RST with linger 0
                }
            },
            Mode::Drop { .. } => match read_request(&mut stream).await {
                Some(body) => body,
                None => return,
            },
        };
        seen.bodies.lock().unwrap().push(request);
        served += 1;
        if matches!(mode, Mode::Drop { nth } if nth == served) {
            return; // read, maybe applied, never answered
        }
        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nkeep-alive: timeout=60\r\n\r\n";
        if stream.write_all(reply).await.is_err() {
            return;
        }
    }
}

async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize =
                head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                return Some(String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned());
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn client(check_stale: bool) -> WebhookClient {
    WebhookClient::new(ClientOptions {
        policy: WebhookPolicy::development().allow_private(true),
        // Longer than the server's idle timeout: the mismatch behind stale sockets.
        idle_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(5),
        check_stale,
        ..ClientOptions::default()
    })
}

fn url(port: u16) -> WebhookUrl {
    WebhookUrl::parse(&format!("http://127.0.0.1:{port}/hook"), &WebhookPolicy::development().allow_private(true))
        .unwrap()
}

async fn post(client: &WebhookClient, port: u16, body: &'static str) -> Result<u16, SendError> {
    client.post(&url(port), HeaderMap::new(), Bytes::from_static(body.as_bytes())).await.map(|r| r.status.as_u16())
}

/// Blocks this (current-thread) runtime, so no task of the client notices the server's close:
/// the pooled connection is exactly as stale as an unpolled socket in a busy process.
fn block_runtime(d: Duration) {
    std::thread::sleep(d);
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_dropped_before_reuse() {
    for reset in [false, true] {
        let (port, seen) = serve(Mode::CloseIdle { after: Duration::from_millis(100), reset });
        let client = client(true);
        assert_eq!(post(&client, port, "one").await.unwrap(), 200);
        block_runtime(Duration::from_millis(400));
        assert_eq!(post(&client, port, "two").await.unwrap(), 200);

        let counts = client.counters();
        assert_eq!((counts.stale_dropped, counts.replays, counts.connections_opened), (1, 0, 2), "reset={reset}");
        assert_eq!(seen.bodies.lock().unwrap().clone(), ["one", "two"]);
        assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn a_request_that_failed_before_leaving_a_reused_connection_is_replayed_once() {
    // The server resets the idle connection; the staleness check is off so the client walks
    // into the race the check normally closes: the write fails, nothing of it left.
    let (port, seen) = serve(Mode::CloseIdle { after: Duration::from_millis(100), reset: true });
    let client = client(false);
    assert_eq!(post(&client, port, "one").await.unwrap(), 200);
    block_runtime(Duration::from_millis(400));
    assert_eq!(post(&client, port, "two").await.unwrap(), 200);

    let counts = client.counters();
    assert_eq!((counts.replays, counts.reused, counts.connections_opened), (1, 1, 2));
    assert_eq!(seen.bodies.lock().unwrap().clone(), ["one", "two"], "the replay reached the server once");
}

#[tokio::test]
async fn a_request_that_may_have_reached_the_server_is_not_replayed() {
    let (port, seen) = serve(Mode::Drop { nth: 2 });
    let client = client(true);
    assert_eq!(post(&client, port, "one").await.unwrap(), 200);
    let err = post(&client, port, "two").await.unwrap_err();

    assert!(matches!(err, SendError::MayHaveReached(_)), "{err:?}");
    assert_eq!(client.counters().replays, 0);
    assert_eq!(seen.bodies.lock().unwrap().clone(), ["one", "two"], "sent once; the queue retries it later");
}

#[tokio::test]
async fn failures_on_fresh_connections_are_not_replayed() {
    // Refused: never reached anyone, but not replayed at once either (backoff through the queue).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let err = post(&client(true), port, "x").await.unwrap_err();
    assert!(matches!(err, SendError::NotSent(_)), "{err:?}");

    // Read and dropped on a fresh connection: the leading edge of an overloaded receiver.
    let (port, seen) = serve(Mode::Drop { nth: 1 });
    let client = client(true);
    let err = post(&client, port, "y").await.unwrap_err();
    assert!(matches!(err, SendError::MayHaveReached(_)), "{err:?}");
    assert_eq!(client.counters().replays, 0);
    assert_eq!(seen.bodies.lock().unwrap().clone(), ["y"]);
}

#[tokio::test]
async fn private_addresses_are_refused_before_connecting_unless_allowed() {
    let (port, seen) = serve(Mode::CloseIdle { after: Duration::from_secs(5), reset: false });
    let strict = WebhookClient::new(ClientOptions { policy: WebhookPolicy::development(), ..ClientOptions::default() });
    let url =
        WebhookUrl::parse(&format!("http://localhost:{port}/hook"), &WebhookPolicy::development().allow_private(true))
            .unwrap();
    let err = strict.post(&url, HeaderMap::new(), Bytes::new()).await.unwrap_err();
    assert!(matches!(err, SendError::Forbidden(_)), "{err:?}");
    assert_eq!(seen.connections.load(Ordering::SeqCst), 0);
}
