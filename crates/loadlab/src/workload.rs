//! What arrivals do: hit fixed URLs (ramps and sweeps), read like the reader population, or
//! walk an agent's journey with think time between steps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};

use crate::classify::Outcome;
use crate::engine::{Arrival, BoxFuture, Req, Workload};

fn rng_for(a: &Arrival) -> SmallRng {
    SmallRng::seed_from_u64(a.step.seed ^ a.n.wrapping_mul(0x2545_F491_4F6C_DD1D))
}

/// GETs one of a fixed set of URLs per arrival, round-robin, or POSTs `body` to it, with a
/// weighted tenant's token when the run has tokens.
#[derive(Debug)]
pub struct Urls {
    pub urls: Vec<String>,
    /// JSON to POST; `None`: GET.
    pub body: Option<Bytes>,
}

impl Workload for Urls {
    fn arrive(self: Arc<Self>, a: Arrival) -> BoxFuture {
        Box::pin(async move {
            let Some(url) = self.urls.get(usize::try_from(a.n % self.urls.len().max(1) as u64).unwrap_or(0)) else {
                return;
            };
            let mut rng = rng_for(&a);
            let mut req = Req::get(url.clone(), "url");
            if let Some(body) = &self.body {
                req.method = Method::POST;
                req.body = Some(body.clone());
            }
            if !a.step.tokens.is_empty() {
                req.tenant = a.tenant(&mut rng);
            }
            a.call(req, &mut rng).await;
        })
    }
}

/// The reader population: lists the inbox or the contacts, one request per arrival.
#[derive(Debug)]
pub struct Readers {
    pub base: String,
}

impl Workload for Readers {
    fn arrive(self: Arc<Self>, a: Arrival) -> BoxFuture {
        Box::pin(async move {
            let mut rng = rng_for(&a);
            let tenant = a.tenant(&mut rng);
            let (uri, endpoint) = if rng.random_bool(0.5) {
                (format!("{}/v1/conversations?status=open&limit=25", self.base), "inbox")
            } else {
                (format!("{}/v1/contacts?limit=25", self.base), "contacts")
            };
            let mut req = Req::get(uri, endpoint);
            req.tenant = tenant;
            req.expect_json = true;
            a.call(req, &mut rng).await;
        })
    }
}

/// Steps in an agent journey.
pub const AGENT_STEPS: usize = 5;

/// An agent's journey: list the inbox, open a conversation from it, read its messages,
/// reply, change its status; exponential think time (mean `think`) between steps. Each
/// step's latency counts from its own intended time (the previous reply plus think time).
/// A refused or failed step ends the journey, as it would end a person's.
#[derive(Debug)]
pub struct AgentJourney {
    pub base: String,
    pub think: Duration,
}

impl AgentJourney {
    fn think(&self, rng: &mut SmallRng) -> Duration {
        let mean = self.think.as_secs_f64();
        if mean <= 0.0 {
            return Duration::ZERO;
        }
        let s = Exp::new(1.0 / mean).map_or(mean, |e| e.sample(rng));
        Duration::from_secs_f64(s.min(mean * 5.0))
    }
}

/// Picks a random item's `id` from a list response.
pub fn pick_id(body: &[u8], rng: &mut impl Rng) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let items = v.get("items")?.as_array()?;
    if items.is_empty() {
        return None;
    }
    let item = items.get(rng.random_range(0..items.len()))?;
    match item.get("id")? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl Workload for AgentJourney {
    fn arrive(self: Arc<Self>, a: Arrival) -> BoxFuture {
        Box::pin(async move {
            let mut rng = rng_for(&a);
            let tenant = a.tenant(&mut rng);
            let base = &self.base;
            let req = |method: Method, uri: String, endpoint: &'static str, body: Option<Bytes>| Req {
                method,
                uri,
                tenant,
                endpoint,
                body,
                expect_json: true,
                idempotency_key: endpoint == "reply",
                headers: Vec::new(),
            };
            let (o, reply) = a
                .request(
                    a.intended,
                    req(Method::GET, format!("{base}/v1/conversations?status=open&limit=25"), "inbox", None),
                )
                .await;
            let Some(id) = (o == Outcome::Ok).then(|| reply.and_then(|r| pick_id(&r.body, &mut rng))).flatten() else {
                return;
            };
            let reply_body = format!("{{\"body\":\"loadlab reply {}\"}}", a.n);
            let status = if rng.random_bool(0.5) { "pending" } else { "open" };
            let steps = [
                req(Method::GET, format!("{base}/v1/conversations/{id}"), "conversation", None),
                req(Method::GET, format!("{base}/v1/conversations/{id}/messages?limit=50"), "messages", None),
                req(
                    Method::POST,
                    format!("{base}/v1/conversations/{id}/messages"),
                    "reply",
                    Some(Bytes::from(reply_body)),
                ),
                req(
                    Method::PATCH,
                    format!("{base}/v1/conversations/{id}"),
                    "status",
                    Some(Bytes::from(format!("{{\"status\":\"{status}\"}}"))),
                ),
            ];
            for r in steps {
                let intended = Instant::now() + self.think(&mut rng);
                tokio::time::sleep_until(intended.into()).await;
                let (o, _) = a.request(intended, r).await;
                if !o.is_ok() {
                    return;
                }
            }
        })
    }
}
