//! A Server-Sent Events reader for the stream's tests: frames parsed as the EventSource
//! specification reads them (`id:`, `event:`, `data:`, `retry:` fields; `:` comment lines).
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::TestApp;

/// One dispatched frame (an event, a `retry:`, or a heartbeat comment).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<String>,
    pub retry_ms: Option<u64>,
    pub comment: Option<String>,
}

impl Frame {
    /// The `data:` as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().unwrap_or("null")).expect("data is JSON")
    }

    /// The `id:` as the tenant's event number.
    pub fn number(&self) -> i64 {
        self.id.as_deref().and_then(|s| s.parse().ok()).expect("a numeric id")
    }

    /// Whether it is a real event (not a hint or a heartbeat).
    pub fn is_event(&self) -> bool {
        self.event.is_some()
    }
}

/// An open stream.
pub struct Stream {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    res: reqwest::Response,
    buffer: String,
    /// Every frame read so far, heartbeats and hints included, and the raw text.
    pub seen: Vec<Frame>,
    pub text: String,
}

/// Opens `GET path` as a stream with `token`, and `Last-Event-ID` if given.
pub async fn open(app: &TestApp, path: &str, token: &str, last_event_id: Option<&str>) -> Stream {
    // No overall timeout: a stream lasts as long as the test reads it.
    let http = reqwest::Client::new();
    let mut req = http.get(app.url(path)).bearer_auth(token);
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let res = req.send().await.expect("stream request sent");
    Stream {
        status: res.status(),
        headers: res.headers().clone(),
        res,
        buffer: String::new(),
        seen: Vec::new(),
        text: String::new(),
    }
}

impl Stream {
    /// The next frame within `wait`, or `None` (nothing came, or the stream ended).
    pub async fn next_frame(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let frame = parse(&block);
                self.seen.push(frame.clone());
                return Some(frame);
            }
            let chunk = tokio::time::timeout_at(deadline, self.res.chunk()).await.ok()?.ok()??;
            let text = String::from_utf8(chunk.to_vec()).expect("UTF-8");
            self.text.push_str(&text);
            self.buffer.push_str(&text);
        }
    }

    /// The next real event within `wait`, skipping hints and heartbeats.
    pub async fn next_event(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let frame = self.next_frame(left).await?;
            if frame.is_event() {
                return Some(frame);
            }
        }
    }

    /// Events until one whose data satisfies `until` (included), each within `wait`.
    pub async fn events_until(&mut self, wait: Duration, until: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        let mut out = Vec::new();
        loop {
            let frame = self.next_event(wait).await.unwrap_or_else(|| panic!("the stream went quiet after {out:#?}"));
            let done = until(&frame);
            out.push(frame);
            if done {
                return out;
            }
        }
    }

    /// The rest of the body (a refusal's envelope).
    pub async fn res_text(self) -> String {
        self.res.text().await.unwrap_or_default()
    }

    /// Whether the server ended the stream within `wait` (frames read meanwhile are kept).
    pub async fn ends_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.res.chunk()).await {
                Err(_) => return false,
                Ok(Ok(Some(chunk))) => {
                    let text = String::from_utf8(chunk.to_vec()).expect("UTF-8");
                    self.text.push_str(&text);
                    self.buffer.push_str(&text);
                    while let Some(end) = self.buffer.find("\n\n") {
                        let block: String = self.buffer.drain(..end + 2).collect();
                        self.seen.push(parse(&block));
                    }
                }
                Ok(Ok(None) | Err(_)) => return true,
            }
        }
    }
}

fn parse(block: &str) -> Frame {
    let mut f = Frame::default();
    for line in block.lines() {
        if let Some(comment) = line.strip_prefix(':') {
            f.comment = Some(comment.trim().to_owned());
            continue;
        }
        let (field, value) = line.split_once(':').map_or((line, ""), |(k, v)| (k, v.strip_prefix(' ').unwrap_or(v)));
        match field {
            "id" => f.id = Some(value.to_owned()),
            "event" => f.event = Some(value.to_owned()),
            "data" => {
                f.data = Some(match f.data.take() {
                    Some(d) => format!("{d}\n{value}"),
                    None => value.to_owned(),
                });
            }
            "retry" => f.retry_ms = value.parse().ok(),
            _ => {}
        }
    }
    f
}
