//! `loadlab streams`: N live-inbox streams (`GET /v1/stream`) held open against the API while
//! messages are written through it, and what they saw.
//!
//! Each stream is a connection of its own, as a browser tab's `EventSource` is. Streams are
//! spread evenly over the tenants (the per-tenant cap is per task), opened at `open_rate` a
//! second (0: all at once, a reconnect storm); a refused one tries again after its `Retry-After`
//! with jitter, as a reconnecting client does. While they are open, writers post messages at
//! `writes_per_sec` into one conversation per tenant. The report gives:
//! - how many opened, how long each took to its first frame, and how many were refused by status
//!   and by the envelope's code, with the longest `Retry-After` each code gave;
//! - every event received, and the events lost: an unfiltered stream sees each of its tenant's
//!   events, whose ids run 1, 2, 3..., so a gap between two ids a stream received is an event it
//!   missed, and an id it saw twice a duplicate;
//! - the latency from a `message.created`'s transaction to its arrival: the event's `at` is its
//!   transaction's start on the database's clock (this machine's), so the figure overstates
//!   commit-to-arrival by the writing transaction's own duration (a few milliseconds);
//! - heartbeats and `resync`s, and streams the server ended.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::client::Http;
use crate::stats::{Hist, Pcts};
use crate::tokens::{Tenant, Tokens};

/// What to run.
#[derive(Debug, Clone)]
pub struct StreamsConfig {
    /// The API's base URL (`http://host:port`).
    pub base: String,
    /// Streams to hold open.
    pub streams: usize,
    /// Streams opened a second; 0 opens them all at once.
    pub open_rate: f64,
    /// How long the streams are held once all are opened (writes run during it).
    pub hold: Duration,
    /// Messages written a second while the streams are held; 0 for idle streams.
    pub writes_per_sec: f64,
}

/// What the streams saw.
#[derive(Debug, Clone, Serialize)]
pub struct StreamsReport {
    pub streams: usize,
    pub opened: u64,
    /// Refusals at opening, by status (429 `stream_limit`, 503 `streams_full`, admission's
    /// 503...); a refused stream tries again after its `Retry-After` with jitter.
    pub refused: BTreeMap<u16, u64>,
    /// The same refusals by the envelope's `code` (`-` without one), each with the longest
    /// `Retry-After` it gave: which refusal kept a stream waiting longest.
    pub refusal_codes: BTreeMap<String, RefusalCode>,
    /// Streams that could not be opened at all (connection errors), by kind.
    pub errors: BTreeMap<String, u64>,
    /// From the start of the opening to the last stream's first frame, seconds.
    pub all_open_seconds: f64,
    /// Time from a stream's request to its first frame.
    pub open: Pcts,
    /// Each new connection's TCP connect, from the SYN to the handshake's end: a wait in the
    /// server's listen queue, or a SYN it dropped and the kernel sent again (after 1, 3, 7 s...).
    pub connect: Pcts,
    /// The request that opened a stream, from its sending on an open connection to the
    /// stream's first frame: what an admitted request took, without the connect's wait.
    pub admitted: Pcts,
    /// The same, for the openings sent as the first request of a new connection: these also
    /// wait for the server to accept the connection (in its listen queue, or for a handshake's
    /// last ACK that a full queue dropped, until the server's SYN-ACK is sent again).
    pub admitted_first_on_connection: Pcts,
    /// The same, for the openings sent on a connection that had carried a refusal: accepted
    /// already, so their time is the server's own.
    pub admitted_on_kept_connection: Pcts,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub events: u64,
    /// Events a stream missed: gaps in its tenant's ids.
    pub lost: u64,
    pub duplicates: u64,
    pub heartbeats: u64,
    pub resyncs: u64,
    /// Streams the server ended while they were held.
    pub ended_by_server: u64,
    /// `message.created`: from its transaction's start to its arrival.
    pub event_latency: Pcts,
}

/// Refusals with one envelope code.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RefusalCode {
    pub count: u64,
    /// The longest `Retry-After` among them, seconds (0: none had one).
    pub longest_retry_after_seconds: u64,
}

#[derive(Debug, Default)]
struct Tally {
    opened: AtomicU64,
    events: AtomicU64,
    lost: AtomicU64,
    duplicates: AtomicU64,
    heartbeats: AtomicU64,
    resyncs: AtomicU64,
    ended: AtomicU64,
    writes_ok: AtomicU64,
    writes_failed: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    tally: Tally,
    refused: Mutex<BTreeMap<u16, u64>>,
    refusal_codes: Mutex<BTreeMap<String, RefusalCode>>,
    errors: Mutex<BTreeMap<String, u64>>,
    open: Mutex<Hist>,
    connect: Mutex<Hist>,
    admitted: Mutex<Hist>,
    admitted_first: Mutex<Hist>,
    admitted_kept: Mutex<Hist>,
    latency: Mutex<Hist>,
    last_open: Mutex<Option<Instant>>,
}

/// Runs the streams and the writers; returns what they saw.
///
/// # Errors
/// When the base URL is not `http://host:port`, there are no tokens, or a tenant has no
/// conversation to write into.
pub async fn run(config: &StreamsConfig, tokens: &Tokens) -> anyhow::Result<StreamsReport> {
    let uri: http::Uri = config.base.parse()?;
    let authority = match (uri.host(), uri.port_u16()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => format!("{h}:80"),
        _ => anyhow::bail!("--base must be http://host:port"),
    };
    anyhow::ensure!(!tokens.is_empty(), "streams need tokens (--tokens or --mint-tenants)");
    let tenants = tokens.tenants().to_vec();
    let shared = Arc::new(Shared::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let mut handles = Vec::with_capacity(config.streams);
    for n in 0..config.streams {
        if config.open_rate > 0.0 {
            #[allow(clippy::cast_precision_loss)] // stream counts far below 2^53
            let at = started + Duration::from_secs_f64(n as f64 / config.open_rate);
            tokio::time::sleep_until(at.into()).await;
        }
        let tenant = tenants[n % tenants.len()].clone();
        handles.push(tokio::spawn(hold(authority.clone(), tenant, shared.clone(), stop.clone())));
        if n % 64 == 63 {
            eprint!("\ropening streams: {}/{}", n + 1, config.streams);
        }
    }
    eprintln!("\ropening streams: {}/{} requested", config.streams, config.streams);
    // Let the last ones reach their first frame (refused ones retry) before the writes begin.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let settled = shared.tally.opened.load(Ordering::Relaxed) + shared.errors.lock().await.values().sum::<u64>();
        if settled >= config.streams as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_open_seconds = shared.last_open.lock().await.map_or(0.0, |t| (t - started).as_secs_f64());
    eprintln!(
        "opened {} of {} in {all_open_seconds:.1} s; holding {:?} with {} writes/s",
        shared.tally.opened.load(Ordering::Relaxed),
        config.streams,
        config.hold,
        config.writes_per_sec
    );
    if config.writes_per_sec > 0.0 {
        write(&config.base, &tenants, config.writes_per_sec, config.hold, &shared).await?;
    } else {
        tokio::time::sleep(config.hold).await;
    }
    // The last writes' events are on their way.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    for h in handles {
        let _ = h.await;
    }
    let t = &shared.tally;
    let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
    Ok(StreamsReport {
        streams: config.streams,
        opened: get(&t.opened),
        refused: shared.refused.lock().await.clone(),
        refusal_codes: shared.refusal_codes.lock().await.clone(),
        errors: shared.errors.lock().await.clone(),
        all_open_seconds,
        open: shared.open.lock().await.summary(),
        connect: shared.connect.lock().await.summary(),
        admitted: shared.admitted.lock().await.summary(),
        admitted_first_on_connection: shared.admitted_first.lock().await.summary(),
        admitted_on_kept_connection: shared.admitted_kept.lock().await.summary(),
        writes_ok: get(&t.writes_ok),
        writes_failed: get(&t.writes_failed),
        events: get(&t.events),
        lost: get(&t.lost),
        duplicates: get(&t.duplicates),
        heartbeats: get(&t.heartbeats),
        resyncs: get(&t.resyncs),
        ended_by_server: get(&t.ended),
        event_latency: shared.latency.lock().await.summary(),
    })
}

/// Posts messages at `rate` a second for `hold`, round-robin over the tenants, into one
/// conversation of each.
async fn write(base: &str, tenants: &[Tenant], rate: f64, hold: Duration, shared: &Shared) -> anyhow::Result<()> {
    let http = Http::new(Duration::from_secs(10));
    let mut targets = Vec::new();
    for t in tenants {
        let auth = [(http::header::AUTHORIZATION, t.authorization.clone())];
        let r = http
            .send(Method::GET, &format!("{base}/v1/conversations?limit=1"), &auth, None)
            .await
            .map_err(|e| anyhow::anyhow!("listing {}'s conversations: {e}", t.tenant_id))?;
        let page: serde_json::Value = serde_json::from_slice(&r.body)?;
        let id = page["items"][0]["id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("tenant {} has no conversation to write into: {page}", t.tenant_id))?;
        targets.push((format!("{base}/v1/conversations/{id}/messages"), t.authorization.clone()));
    }
    let started = Instant::now();
    let mut n: u64 = 0;
    let mut inflight = tokio::task::JoinSet::new();
    loop {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^53
        let at = started + Duration::from_secs_f64(n as f64 / rate);
        if at - started >= hold {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        #[allow(clippy::cast_possible_truncation)] // modulo a small length
        let (uri, auth) = targets[(n % targets.len() as u64) as usize].clone();
        let http = http.clone();
        let body = Bytes::from(format!(r#"{{"body":"stream probe {n}"}}"#));
        inflight.spawn(async move {
            let headers = [
                (http::header::AUTHORIZATION, auth),
                (http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json")),
            ];
            http.send(Method::POST, &uri, &headers, Some(body)).await.is_ok_and(|r| r.status == 201)
        });
        n += 1;
        while let Some(done) = inflight.try_join_next() {
            let counter = if done.unwrap_or(false) { &shared.tally.writes_ok } else { &shared.tally.writes_failed };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
    while let Some(done) = inflight.join_next().await {
        let counter = if done.unwrap_or(false) { &shared.tally.writes_ok } else { &shared.tally.writes_failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// One stream: open it (again after each refusal, once its `Retry-After` with jitter has
/// passed, as a reconnecting client does), then read it until `stop`.
async fn hold(authority: String, tenant: Tenant, shared: Arc<Shared>, stop: tokio_util::sync::CancellationToken) {
    let asked = Instant::now();
    // A refused stream asks again on the same connection while the server keeps it open, as a
    // browser's connection pool does.
    let mut connection = None;
    loop {
        match open(&authority, &tenant, &shared, asked, &stop, &mut connection).await {
            Opened::Refused(wait) => {
                let wait = wait.mul_f64(1.0 + rand::random_range(0.0..1.0));
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            Opened::Done => return,
        }
    }
}

enum Opened {
    /// Refused: try again after this.
    Refused(Duration),
    /// Read until it ended, or failed to open.
    Done,
}

async fn open(
    authority: &str,
    tenant: &Tenant,
    shared: &Arc<Shared>,
    asked: Instant,
    stop: &tokio_util::sync::CancellationToken,
    connection: &mut Option<SendRequest<Empty<Bytes>>>,
) -> Opened {
    let fail = |kind: &str| {
        let shared = shared.clone();
        let kind = kind.to_owned();
        async move {
            *shared.errors.lock().await.entry(kind).or_default() += 1;
            Opened::Done
        }
    };
    let reusable = match connection.take() {
        Some(mut s) => s.ready().await.is_ok().then_some(s),
        None => None,
    };
    let kept = reusable.is_some();
    let mut sender = match reusable {
        Some(s) => s,
        None => {
            let connecting = Instant::now();
            let Ok(stream) = tokio::net::TcpStream::connect(authority).await else { return fail("connect").await };
            shared.connect.lock().await.record(connecting.elapsed());
            let _ = stream.set_nodelay(true);
            let Ok((sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await else {
                return fail("handshake").await;
            };
            tokio::spawn(async move {
                let _ = conn.await;
            });
            sender
        }
    };
    let request = Request::builder()
        .method(Method::GET)
        .uri("/v1/stream")
        .header(http::header::HOST, authority)
        .header(http::header::AUTHORIZATION, tenant.authorization.clone())
        .body(Empty::<Bytes>::new());
    let Ok(request) = request else { return fail("request").await };
    let sent = Instant::now();
    let Ok(response) = sender.send_request(request).await else { return fail("send").await };
    if response.status() != http::StatusCode::OK {
        *shared.refused.lock().await.entry(response.status().as_u16()).or_default() += 1;
        let seconds = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // Its body is the envelope, read so the connection can carry the next attempt.
        let body = response.into_body().collect().await.map(http_body_util::Collected::to_bytes).unwrap_or_default();
        let code = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "-".to_owned());
        {
            let mut codes = shared.refusal_codes.lock().await;
            let tally = codes.entry(code).or_default();
            tally.count += 1;
            tally.longest_retry_after_seconds = tally.longest_retry_after_seconds.max(seconds.unwrap_or(0));
        }
        *connection = Some(sender);
        // No Retry-After: a refusal that is not to be retried (401, 403, 400).
        return seconds.map_or(Opened::Done, |s| Opened::Refused(Duration::from_secs(s.max(1))));
    }
    let mut body = response.into_body();
    let mut reader = Reader::default();
    let mut first = true;
    loop {
        let frame = tokio::select! {
            () = stop.cancelled() => return Opened::Done,
            frame = body.frame() => frame,
        };
        let Some(Ok(frame)) = frame else {
            shared.tally.ended.fetch_add(1, Ordering::Relaxed);
            return Opened::Done;
        };
        let Ok(data) = frame.into_data() else { continue };
        if first {
            first = false;
            shared.tally.opened.fetch_add(1, Ordering::Relaxed);
            shared.open.lock().await.record(asked.elapsed());
            let took = sent.elapsed();
            shared.admitted.lock().await.record(took);
            let split = if kept { &shared.admitted_kept } else { &shared.admitted_first };
            split.lock().await.record(took);
            *shared.last_open.lock().await = Some(Instant::now());
        }
        for event in reader.push(&data) {
            reader.account(&event, shared).await;
        }
    }
}

/// One dispatched SSE frame.
#[derive(Debug, Default)]
struct Frame {
    id: Option<i64>,
    event: Option<String>,
    data: String,
    comment: bool,
}

/// Splits a stream's bytes into frames, and keeps the ids it has seen.
#[derive(Debug, Default)]
struct Reader {
    buffer: String,
    last_id: Option<i64>,
}

impl Reader {
    fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        self.buffer.push_str(&String::from_utf8_lossy(bytes));
        let mut out = Vec::new();
        while let Some(end) = self.buffer.find("\n\n") {
            let block: String = self.buffer.drain(..end + 2).collect();
            let mut f = Frame::default();
            for line in block.lines() {
                if line.starts_with(':') {
                    f.comment = true;
                } else if let Some((field, value)) = line.split_once(':') {
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "id" => f.id = value.parse().ok(),
                        "event" => f.event = Some(value.to_owned()),
                        "data" => f.data.push_str(value),
                        _ => {}
                    }
                }
            }
            out.push(f);
        }
        out
    }

    async fn account(&mut self, f: &Frame, shared: &Shared) {
        let t = &shared.tally;
        match f.event.as_deref() {
            None if f.comment => {
                t.heartbeats.fetch_add(1, Ordering::Relaxed);
            }
            None => {}
            Some("resync") => {
                t.resyncs.fetch_add(1, Ordering::Relaxed);
                self.last_id = f.id;
            }
            Some(kind) => {
                t.events.fetch_add(1, Ordering::Relaxed);
                if let Some(id) = f.id {
                    match self.last_id {
                        Some(last) if id <= last => {
                            t.duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(last) => {
                            t.lost.fetch_add(u64::try_from(id - last - 1).unwrap_or(0), Ordering::Relaxed);
                        }
                        None => {}
                    }
                    self.last_id = Some(self.last_id.map_or(id, |l| l.max(id)));
                }
                if kind == "message.created"
                    && let Some(latency) = latency_of(&f.data)
                {
                    shared.latency.lock().await.record(latency);
                }
            }
        }
    }
}

/// From the event's `at` to now (zero if the clocks disagree).
fn latency_of(data: &str) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    let at = chrono::DateTime::parse_from_rfc3339(v["at"].as_str()?).ok()?;
    Some((chrono::Utc::now() - at.with_timezone(&chrono::Utc)).to_std().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gaps_are_lost_events_and_repeats_duplicates() {
        let shared = Shared::default();
        let mut r = Reader::default();
        let text = "retry: 2000\n\n: heartbeat\n\nid: 1\nevent: conversation.created\ndata: {}\n\n\
                    id: 2\nevent: message.created\ndata: {\"at\":\"2026-01-01T00:00:00Z\"}\n\n\
                    id: 5\nevent: conversation.updated\ndata: {}\n\nid: 5\nevent: conversation.updated\ndata: {}\n\nid: 6";
        // Split mid-frame: the reader keeps what is not yet a whole frame.
        let (a, b) = text.split_at(40);
        let mut frames = r.push(a.as_bytes());
        frames.extend(r.push(b.as_bytes()));
        assert_eq!(frames.len(), 6, "{frames:?}");
        for f in &frames {
            r.account(f, &shared).await;
        }
        let t = &shared.tally;
        assert_eq!(t.events.load(Ordering::Relaxed), 4);
        assert_eq!(t.lost.load(Ordering::Relaxed), 2, "3 and 4 never came");
        assert_eq!(t.duplicates.load(Ordering::Relaxed), 1);
        assert_eq!(t.heartbeats.load(Ordering::Relaxed), 1);
        assert_eq!(shared.latency.lock().await.len(), 1);
        assert!(r.buffer.contains("id: 6"), "an unfinished frame waits for its end");
    }
}
