//! A connection past the cap, under `CONNECTION_OVERFLOW=refuse`: served (one request) if its
//! first request is a `GET` of a path admission never sheds (`/health`, `/openapi.json`),
//! answered the canned `503 load_shed` without hyper otherwise, and reset at once when
//! `MAX_REFUSING_CONNECTIONS` refusals are already under way.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::{Edge, HttpService};
use crate::admission::BYPASS;
use crate::error::{ErrorCode, ErrorEnvelope};

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

impl<S: HttpService> Edge<S> {
    /// A connection past the cap: served if it asks for `/health`, answered the
    /// canned 503 otherwise, reset at once if too many refusals are under way.
    pub(super) fn shed(edge: &Arc<Self>, stream: TcpStream, peer: SocketAddr) {
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
                task.serve_connection(&task.single_request, stream, peer, None, 0).await;
            } else {
                task.connections.refused.fetch_add(1, Ordering::Relaxed);
                refuse(stream).await;
            }
            drop(slot);
        });
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
