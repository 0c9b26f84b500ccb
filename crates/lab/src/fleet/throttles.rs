//! The fleet-wide throttles: tasks behind the balancer hold one tenant to its limit together,
//! through one Redis; with that Redis killed, each task falls back to its share of the limit
//! (`THROTTLE_API_TASKS`), so the fleet as a whole still holds it.
//!
//! One tenant's agent sends an open loop of cheap reads at five times its limit through the
//! balancer, on a Redis of the run's own (the shared one is never killed). While Redis is up
//! the fleet admits `burst + floor(rate * t)` of them in `t` seconds, +-1 (GCRA on Redis's clock:
//! docs/ADMISSION.md); halfway through, Redis is killed, and from then on the fleet admits at
//! most `burst + rate * t`, +1. Every 429 must carry `Retry-After`; nothing may fail.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::processes::ops_status;
use super::{Ctx, haproxy, log};
use crate::rig::services::RedisServer;

/// The tenant's limit and the loop's rate: five times the limit.
#[derive(Debug, Clone, Copy)]
struct Load {
    rate_per_sec: f64,
    burst: u32,
    offered_per_sec: f64,
}

/// The full run's: far under what the loop offers, and high enough that a third of it (each
/// task's share while Redis is down) still admits several requests a second.
const FULL: Load = Load { rate_per_sec: 30.0, burst: 30, offered_per_sec: 150.0 };
/// `--quick`'s (CI's debug builds, a quarter core each): a third of the full run's, so that the
/// tasks' debug builds serve it with room on a slow machine (at the full run's load, one CI
/// machine's tasks answered 62 of about 2,400 requests with admission's and the bulkhead's 503s);
/// each task's share is still over three requests a second.
const QUICK: Load = Load { rate_per_sec: 10.0, burst: 10, offered_per_sec: 50.0 };

/// One window of the run: while Redis was up, or after it was killed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Window {
    pub(crate) name: String,
    /// From the window's first request sent to its last, seconds.
    pub(crate) seconds: f64,
    pub(crate) sent: usize,
    pub(crate) admitted: usize,
    /// `burst + floor(rate * seconds)`.
    pub(crate) expected: u64,
}

/// What the run recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    /// When and at which commit (a run without the surge adds to the saved record).
    #[serde(default)]
    pub(crate) measured: String,
    pub(crate) tasks: u32,
    pub(crate) rate_per_sec: f64,
    pub(crate) burst: u32,
    pub(crate) offered_per_sec: f64,
    /// While Redis was up (answered before the kill), then everything after.
    pub(crate) windows: Vec<Window>,
    pub(crate) throttled: usize,
    /// 429s with a `Retry-After` of at least one second.
    pub(crate) throttled_with_retry_after: usize,
    /// Answers other than 2xx and 429, by status and code, and transport failures.
    pub(crate) other: BTreeMap<String, usize>,
    /// Requests each task checked in process, before the kill and at the end
    /// (`/v1/ops/status`).
    pub(crate) fallback_checks_before: Vec<u64>,
    pub(crate) fallback_checks_after: Vec<u64>,
    /// From the kill until every task said `degraded`, ms (`None`: not every task did).
    pub(crate) all_degraded_after_ms: Option<u64>,
}

impl Record {
    /// The goals, each with whether it was met.
    pub(crate) fn goals(&self) -> Vec<(String, String, bool)> {
        let mut out = Vec::new();
        if let Some(up) = self.windows.first() {
            let off = up.admitted as i64 - up.expected as i64;
            out.push((
                format!("Redis up: admitted in {:.1} s = burst + floor(rate x t), +-1", up.seconds),
                format!("{} admitted, {} expected ({off:+})", up.admitted, up.expected),
                off.abs() <= 1,
            ));
        }
        if let Some(down) = self.windows.get(1) {
            out.push((
                format!("Redis killed: admitted in {:.1} s <= burst + rate x t, +1", down.seconds),
                format!("{} admitted, at most {}", down.admitted, down.expected + 1),
                down.admitted as u64 <= down.expected + 1,
            ));
        }
        out.push((
            "429s with Retry-After".into(),
            format!("{} of {}", self.throttled_with_retry_after, self.throttled),
            self.throttled > 0 && self.throttled_with_retry_after == self.throttled,
        ));
        let failed: usize = self.other.values().sum();
        out.push((
            "anything but 2xx and 429 (5xx, the balancer's own answers, resets)".into(),
            if self.other.is_empty() { "0".into() } else { format!("{:?}", self.other) },
            failed == 0,
        ));
        let fell_back = self.fallback_checks_after.iter().zip(&self.fallback_checks_before).all(|(a, b)| a > b);
        out.push((
            "every task fell back to its share".into(),
            format!(
                "in-process checks per task {:?} (before the kill {:?}); all degraded {}",
                self.fallback_checks_after,
                self.fallback_checks_before,
                self.all_degraded_after_ms.map_or_else(|| "never".into(), |ms| format!("{ms} ms after the kill")),
            ),
            fell_back && self.all_degraded_after_ms.is_some(),
        ));
        out
    }

    /// The report's section.
    pub(crate) fn markdown(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(
            m,
            "**Fleet-wide throttles**{}. {} tasks behind the balancer, one Redis of the run's own; one \
             tenant limited to {} req/s with a burst of {}, its agent sending {} req/s of inbox reads through the \
             balancer; Redis killed halfway (each task then holds 1/{} of the limit: `THROTTLE_API_TASKS`).\n",
            if self.measured.is_empty() { String::new() } else { format!(" (measured {})", self.measured) },
            self.tasks,
            self.rate_per_sec,
            self.burst,
            self.offered_per_sec,
            self.tasks
        );
        let _ = writeln!(m, "| goal | measured | met |\n|---|---|---|");
        for (goal, measured, met) in self.goals() {
            let _ = writeln!(m, "| {goal} | {measured} | {} |", if met { "yes" } else { "**no**" });
        }
        m
    }
}

/// What one request got: when it was sent and answered (since the start), and the answer.
struct Sample {
    sent: Duration,
    answered: Duration,
    outcome: std::result::Result<(u16, Option<String>, bool), String>,
}

impl Ctx<'_> {
    /// The run at the most tasks the fleet runs, for the heaviest tenant of `tokens`; its
    /// record, and the goals it missed that a run may not miss. The first goal (exact to +-1
    /// while Redis is up) is a timing and only reported; the others (the fleet within the limit
    /// without Redis, Retry-After on every 429, nothing failed, every task fell back) are
    /// correctness.
    pub(super) async fn throttles_checked(&self, tokens: &std::path::Path) -> Result<(Record, Vec<String>)> {
        let tenants = breakwater_loadlab::tokens::Tokens::from_file(tokens, breakwater_loadlab::tokens::DEV_SECRET)?;
        let (_, tenant) = tenants.heaviest().context("no tenants in the tokens file")?;
        let record = self.throttles(self.plan.max_tasks, tenant).await.context("the throttles' run")?;
        let goals = record.goals();
        for (goal, measured, met) in &goals {
            log(&format!("throttles: {goal}: {measured}{}", if *met { "" } else { "  (MISSED)" }));
        }
        let broken = goals.into_iter().skip(1).filter(|g| !g.2).map(|g| g.0).collect();
        Ok((record, broken))
    }

    /// The fleet-wide throttles' run: `tasks` tasks up, the load, Redis killed halfway.
    pub(super) async fn throttles(&self, tasks: u32, tenant: &breakwater_loadlab::tokens::Tenant) -> Result<Record> {
        let half = Duration::from_secs(if self.plan.quick { 8 } else { 15 });
        let load = if self.plan.quick { QUICK } else { FULL };
        log(&format!(
            "== throttles: {tasks} tasks, one tenant at {} req/s (its limit {}/s, burst {}), Redis killed at {} s ==",
            load.offered_per_sec,
            load.rate_per_sec,
            load.burst,
            half.as_secs()
        ));
        let redis = RedisServer::start(super::free_port()?, &self.runs.join("throttles-redis.log"))?;
        let redis_url = redis.url();
        let launch = self.launch_as("throttles", "adaptive", &redis_url, Some((load.rate_per_sec, load.burst)));
        let (balancer, procs) = self.serving("throttles", tasks, &launch).await?;
        let slots: Vec<_> = self.slots().into_iter().take(tasks as usize).collect();
        let measured = self.throttle_load(&slots, redis, half, load.offered_per_sec, tenant).await;
        for p in procs {
            p.stop(Duration::from_secs(15)).await;
        }
        balancer.stop().await;
        let (samples, kill_at, before, after, degraded) = measured?;
        Ok(record(tasks, load, &samples, kill_at, before, after, degraded))
    }

    /// The open loop, the kill halfway, and each task's fallback counters either side of it.
    #[allow(clippy::type_complexity)]
    async fn throttle_load(
        &self,
        slots: &[haproxy::Slot],
        redis: RedisServer,
        half: Duration,
        offered_per_sec: f64,
        tenant: &breakwater_loadlab::tokens::Tenant,
    ) -> Result<(Vec<Sample>, Duration, Vec<u64>, Vec<u64>, Option<Duration>)> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).pool_max_idle_per_host(256).build()?;
        let ops: Vec<SocketAddr> = slots.iter().map(|s| s.ops).collect();
        let url = format!("http://{}/v1/conversations?status=open&limit=1", self.listen());
        let t0 = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / offered_per_sec);
        let mut requests = tokio::task::JoinSet::new();
        let mut next = t0;
        let mut redis = Some(redis);
        let (mut kill_at, mut before, mut poller) = (None, Vec::new(), None);
        let end = t0 + 2 * half;
        while next < end {
            tokio::time::sleep_until(next.into()).await;
            if redis.is_some() && t0.elapsed() >= half {
                before = fallback_checks(&http, &ops).await;
                drop(redis.take());
                let killed = Instant::now();
                kill_at = Some(killed.duration_since(t0));
                log(&format!("{:>4.1} s: Redis killed", t0.elapsed().as_secs_f64()));
                // Apart from the sender, so that the loop stays on its schedule.
                let (http, ops) = (http.clone(), ops.clone());
                poller = Some(tokio::spawn(async move {
                    while Instant::now() < end {
                        if all_degraded(&http, &ops).await {
                            return Some(killed.elapsed());
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    None
                }));
            }
            let (http, url, auth) = (http.clone(), url.clone(), tenant.authorization.clone());
            let sent = t0.elapsed();
            requests.spawn(async move {
                let outcome = match http.get(&url).header(reqwest::header::AUTHORIZATION, auth).send().await {
                    Err(e) => Err(format!("{e}")),
                    Ok(res) => {
                        let status = res.status().as_u16();
                        let retry_after = res
                            .headers()
                            .get(reqwest::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                            .is_some_and(|s| s >= 1);
                        let body: serde_json::Value = res.json().await.unwrap_or_default();
                        let code = body.pointer("/error/code").and_then(|c| c.as_str()).map(str::to_owned);
                        Ok((status, code, retry_after))
                    }
                };
                Sample { sent, answered: t0.elapsed(), outcome }
            });
            next += interval;
        }
        let mut samples = Vec::new();
        while let Some(s) = requests.join_next().await {
            samples.push(s.context("a request's task")?);
        }
        let after = fallback_checks(&http, &ops).await;
        let degraded = match poller {
            Some(p) => p.await.context("the status poller")?,
            None => None,
        };
        Ok((samples, kill_at.context("the run ended before the kill")?, before, after, degraded))
    }
}

/// Each task's in-process throttle checks so far.
async fn fallback_checks(http: &reqwest::Client, ops: &[SocketAddr]) -> Vec<u64> {
    let mut out = Vec::new();
    for o in ops {
        let v = ops_status(http, *o).await;
        out.push(v.as_ref().and_then(|v| v.pointer("/layers/throttles/fallback_checks")?.as_u64()).unwrap_or(0));
    }
    out
}

async fn all_degraded(http: &reqwest::Client, ops: &[SocketAddr]) -> bool {
    for o in ops {
        let v = ops_status(http, *o).await;
        if v.as_ref().and_then(|v| v.pointer("/layers/throttles/state")?.as_str()) != Some("degraded") {
            return false;
        }
    }
    true
}

/// The windows and tallies: a request answered before the kill is Redis's; everything else
/// (sent before it and answered after included) counts against the fallback.
fn record(
    tasks: u32,
    load: Load,
    samples: &[Sample],
    kill_at: Duration,
    before: Vec<u64>,
    after: Vec<u64>,
    degraded: Option<Duration>,
) -> Record {
    let ok = |s: &&&Sample| matches!(s.outcome, Ok((200..=299, _, _)));
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a few hundred, never negative
    let window = |name: &str, of: Vec<&Sample>| {
        let first = of.iter().map(|s| s.sent).min().unwrap_or_default();
        let last = of.iter().map(|s| s.sent).max().unwrap_or_default();
        let seconds = last.saturating_sub(first).as_secs_f64();
        Window {
            name: name.to_owned(),
            seconds,
            sent: of.len(),
            admitted: of.iter().filter(ok).count(),
            expected: u64::from(load.burst) + (load.rate_per_sec * seconds).floor() as u64,
        }
    };
    let (up, down): (Vec<&Sample>, Vec<&Sample>) = samples.iter().partition(|s| s.answered < kill_at);
    let mut other = BTreeMap::new();
    let (mut throttled, mut with_retry_after) = (0, 0);
    for s in samples {
        match &s.outcome {
            Ok((200..=299, _, _)) => {}
            Ok((429, _, retry_after)) => {
                throttled += 1;
                with_retry_after += usize::from(*retry_after);
            }
            Ok((status, code, _)) => {
                *other.entry(format!("{status} {}", code.as_deref().unwrap_or("-"))).or_default() += 1;
            }
            Err(_) => *other.entry("transport failure".to_owned()).or_default() += 1,
        }
    }
    Record {
        measured: String::new(),
        tasks,
        rate_per_sec: load.rate_per_sec,
        burst: load.burst,
        offered_per_sec: load.offered_per_sec,
        windows: vec![window("Redis up", up), window("Redis killed", down)],
        throttled,
        throttled_with_retry_after: with_retry_after,
        other,
        fallback_checks_before: before,
        fallback_checks_after: after,
        all_degraded_after_ms: degraded.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sent_ms: u64, status: u16) -> Sample {
        let sent = Duration::from_millis(sent_ms);
        Sample { sent, answered: sent + Duration::from_millis(2), outcome: Ok((status, None, status == 429)) }
    }

    #[test]
    fn the_windows_split_at_the_kill_and_the_goals_read_them() {
        // 10 s up: burst + 300 admitted exactly; 10 s down: one over the bound.
        let mut samples = Vec::new();
        let (mut up_ok, mut down_ok) = (0, 0);
        for i in 0..3000u64 {
            let t = i * 20 / 3; // 150 a second
            let up = t < 10_000;
            let admit = if up { up_ok < 330 } else { down_ok < 332 };
            if admit {
                if up { up_ok += 1 } else { down_ok += 1 }
            }
            samples.push(sample(t, if admit { 200 } else { 429 }));
        }
        let r = record(
            3,
            FULL,
            &samples,
            Duration::from_millis(10_000),
            vec![0; 3],
            vec![5; 3],
            Some(Duration::from_millis(30)),
        );
        assert_eq!(r.windows[0].admitted, 330);
        assert_eq!(r.windows[0].expected, 30 + 299, "the window is first to last send: 9.993 s");
        assert_eq!(r.windows[1].admitted, 332);
        let goals = r.goals();
        assert!(goals[0].2, "{goals:?}");
        assert!(!goals[1].2, "332 is over 30 + 299 + 1: {goals:?}");
        assert!(goals[2].2 && goals[3].2 && goals[4].2, "{goals:?}");
        let mut forged = samples;
        forged.push(Sample {
            sent: Duration::from_secs(1),
            answered: Duration::from_secs(1),
            outcome: Ok((429, Some("rate_limited".into()), false)),
        });
        let r = record(3, FULL, &forged, Duration::from_millis(10_000), vec![0; 3], vec![0, 5, 5], None);
        let goals = r.goals();
        assert!(!goals[2].2, "a 429 without Retry-After fails the goal");
        assert!(!goals[4].2, "a task that never fell back fails the goal");
    }
}
