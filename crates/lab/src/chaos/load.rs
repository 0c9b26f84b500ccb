//! The suite's load: an open loop of the request mix (even requests post a message, odd ones read
//! an inbox page), each request's outcome, and their tally. Refusals (a refused connection, a
//! typed 503, 429) are counted apart from errors.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use super::testbed::TenantData;

pub(super) fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?)
}

/// What one request got.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    /// A complete response.
    Status { status: u16, code: Option<String>, created: Option<Uuid> },
    /// The connection was refused (a refusal: nothing was accepted).
    Refused,
    /// Anything else: a reset, a truncated body, a timeout.
    Failed(String),
}

/// The `x-request-id` of request `i` of a run; a posted message's body is the same text, so a
/// request can be found both in the API's log and in the table.
pub(super) fn request_id(run: &str, i: usize) -> String {
    format!("chaos-{run}-{i}")
}

/// Whether request `i` of the load mix posts a message (even `i`); odd `i` reads an inbox page.
pub(super) fn posts(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// One request of the load mix: even `i` posts a message, odd `i` reads an inbox page.
pub(super) async fn send(
    client: &reqwest::Client,
    base: &str,
    tenants: &[TenantData],
    run: &str,
    i: usize,
) -> (Duration, Outcome) {
    let t = &tenants[i / 2 % tenants.len()];
    let id = request_id(run, i);
    let started = Instant::now();
    let req = if posts(i) {
        let conv = t.conversations[i / 4 % t.conversations.len()];
        client
            .post(format!("{base}/v1/conversations/{conv}/messages"))
            .bearer_auth(&t.token)
            .json(&json!({ "body": id }))
    } else {
        client.get(format!("{base}/v1/conversations?limit=10")).bearer_auth(&t.token)
    };
    let req = req.header("x-request-id", &id);
    let outcome = match req.send().await {
        Err(e) if e.is_connect() => Outcome::Refused,
        Err(e) => Outcome::Failed(format!("{e:?}")),
        Ok(res) => {
            let status = res.status().as_u16();
            match res.text().await {
                Err(e) => Outcome::Failed(format!("body: {e:?}")),
                Ok(text) => {
                    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    let code = body["error"]["code"].as_str().map(str::to_owned);
                    let created = if status == 201 { body["id"].as_str().and_then(|s| s.parse().ok()) } else { None };
                    Outcome::Status { status, code, created }
                }
            }
        }
    };
    (started.elapsed(), outcome)
}

impl Sample {
    pub(super) fn is_2xx(&self) -> bool {
        matches!(self.outcome, Outcome::Status { status: 200..=299, .. })
    }
}

/// A request of an open-loop run: when it was sent (since the run began), how long it took,
/// and what it got.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    /// The request's number in its run (see [`request_id`]).
    pub(super) i: usize,
    pub(super) at: Duration,
    pub(super) took: Duration,
    pub(super) outcome: Outcome,
}

/// Open-loop load at `rate` for `duration`: requests are sent on schedule whether or not the
/// earlier ones have answered (so a stall shows as latency, not as a slower sender).
pub(super) fn open_loop(
    run: &'static str,
    base: String,
    tenants: Vec<TenantData>,
    rate: f64,
    duration: Duration,
    t0: Instant,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let Ok(client) = client() else { return Vec::new() };
        let interval = Duration::from_secs_f64(1.0 / rate);
        let mut tasks = Vec::new();
        let mut i = 0usize;
        let mut next = Instant::now();
        let end = Instant::now() + duration;
        while next < end {
            tokio::time::sleep_until(next.into()).await;
            let (client, base, tenants) = (client.clone(), base.clone(), tenants.clone());
            let at = t0.elapsed();
            tasks.push(tokio::spawn(async move {
                let (took, outcome) = send(&client, &base, &tenants, run, i).await;
                Sample { i, at, took, outcome }
            }));
            i += 1;
            next += interval;
        }
        let mut out = Vec::new();
        for t in tasks {
            if let Ok(s) = t.await {
                out.push(s);
            }
        }
        out
    })
}

/// 503s that say the database (or the handler's deadline) failed the request.
pub(super) const TYPED_503: &[&str] = &["db_unavailable", "db_saturated", "request_timeout"];

/// 503s of admission control: refusals under overload, by design.
pub(super) const SHED_503: &[&str] = &["load_shed", "queue_timeout"];

/// Counts of a run's outcomes.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) ok: usize,
    pub(super) typed_503: usize,
    pub(super) shed: usize,
    pub(super) throttled: usize,
    other_4xx: usize,
    pub(super) server_errors: usize,
    pub(super) refused: usize,
    pub(super) failed: usize,
    pub(super) first_failure: Option<String>,
    pub(super) codes: BTreeMap<String, usize>,
}

impl Tally {
    /// Deliberate refusals: typed 503s (database, deadline), admission's 503s and 429s.
    pub(super) fn refusals(&self) -> usize {
        self.typed_503 + self.shed + self.throttled
    }
}

pub(super) fn tally<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> Tally {
    let mut t = Tally::default();
    for s in samples {
        match &s.outcome {
            Outcome::Status { status, code, .. } => {
                if let Some(c) = code {
                    *t.codes.entry(format!("{status} {c}")).or_default() += 1;
                }
                match *status {
                    200..=299 => t.ok += 1,
                    429 => t.throttled += 1,
                    503 if code.as_deref().is_some_and(|c| TYPED_503.contains(&c)) => t.typed_503 += 1,
                    503 if code.as_deref().is_some_and(|c| SHED_503.contains(&c)) => t.shed += 1,
                    400..=499 => t.other_4xx += 1,
                    _ => t.server_errors += 1,
                }
            }
            Outcome::Refused => t.refused += 1,
            Outcome::Failed(e) => {
                t.failed += 1;
                t.first_failure.get_or_insert_with(|| e.clone());
            }
        }
    }
    t
}

pub(super) fn describe(t: &Tally) -> String {
    let mut s = format!(
        "{} ok, {} typed 503 (database/deadline), {} shed 503 (admission), {} 429, {} other 4xx, {} other 5xx, \
         {} refused, {} failed",
        t.ok, t.typed_503, t.shed, t.throttled, t.other_4xx, t.server_errors, t.refused, t.failed
    );
    if !t.codes.is_empty() {
        s.push_str(&format!(" (codes: {:?})", t.codes));
    }
    if let Some(f) = &t.first_failure {
        s.push_str(&format!("; first failure: {}", f.chars().take(200).collect::<String>()));
    }
    s
}

/// The nearest-rank `p`th percentile (`p` in whole percent).
pub(super) fn percentile(mut v: Vec<Duration>, p: usize) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[(v.len() * p).div_ceil(100).clamp(1, v.len()) - 1]
}

/// `part` of `whole`, 0 when `whole` is 0.
pub(super) fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

pub(super) fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Closed-loop throughput of the load mix: what "half of capacity" is measured against.
pub(super) async fn capacity(base: &str, tenants: &[TenantData]) -> anyhow::Result<f64> {
    let client = client()?;
    let until = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for w in 0..16usize {
        let (client, base, tenants) = (client.clone(), base.to_owned(), tenants.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u64;
            let mut i = w;
            while Instant::now() < until {
                if let Outcome::Status { status, .. } = send(&client, &base, &tenants, "capacity", i).await.1
                    && (200..300).contains(&status)
                {
                    ok += 1;
                }
                i += 16;
            }
            ok
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await?;
    }
    Ok(f64::from(u32::try_from(total).unwrap_or(u32::MAX)) / 3.0)
}
