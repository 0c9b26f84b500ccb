//! `hostile-tenant`: one agent, well inside its throttles, attacks every shared resource it can
//! reach while the other tenants run their load at half of capacity, on an API pinned at the
//! production shape with `--release` where the host allows it:
//!
//! - stalled bodies: ten times the database pool's size of writes, spread over every write route,
//!   each declaring a body it never finishes, reopened as soon as the server closes them;
//! - slow readers: large list responses left unread for seconds;
//! - forged tokens: the victim tenant's id signed with another key, to be counted against its
//!   share of admission;
//! - ops paths (`/ready`, `/metrics`, `/v1/ops/status`) asked on the public port without a token.
//!
//! Expected: the other tenants get at least 99.5% 2xx at a p99 within the bound (200 ms for the
//! release build; the debug build is only held to a second), no database slot is ever held by a
//! stalled body (no request held a slot for half the body-read timeout: the bulkhead's longest
//! hold, from the ops listener, after the last 408), every stalled request
//! is answered 408 `body_timeout` at the body-read timeout, and no forged token or ops path is
//! served (401 and 404, or a 503 refusal when admission refuses them like any other request).
//!
//! The other tenants' requests, the forged tokens' and the ops paths' are classified as the
//! suite's load is (`load::Outcome`, the load lab's classifier): the other tenants' share served
//! is the lab's ok share, and the 503 a forged token or an ops path may get must be a refusal,
//! with the typed envelope. The stalled bodies and the slow readers speak HTTP over raw sockets
//! and are judged by their status line.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::load::{Outcome, Sample, capacity, client, describe, ms, open_loop, percentile, rotation, share, tally};
use super::testbed::{Api, Testbed, can_pin, find_api_pid, free_port, report_panics, stop_api, wait_healthy};
use super::verdict::Report;

const S: &str = "hostile-tenant";
/// The API's `DB_POOL_SIZE` in the suite (its default).
const POOL: usize = 10;
/// The API's `BODY_READ_TIMEOUT_MS` (its default).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the stalled writers saw.
#[derive(Debug, Default)]
struct Stalls {
    /// Requests sent with a body that never finished.
    sent: usize,
    /// Of those, answered 408 `body_timeout`.
    timed_out: usize,
    /// How long the longest one waited for its answer.
    longest: Duration,
    /// Answers other than 408 (the first few).
    other: Vec<String>,
}

/// One connection after another, each sending a write whose body stalls, until `stop`.
async fn stall(port: u16, head: String, stop: Arc<AtomicBool>) -> Stalls {
    let mut out = Stalls::default();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if conn.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        out.sent += 1;
        let started = Instant::now();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(BODY_READ_TIMEOUT * 3, conn.read_to_end(&mut answer)).await;
        out.longest = out.longest.max(started.elapsed());
        let text = String::from_utf8_lossy(&answer);
        if read.is_ok() && text.starts_with("HTTP/1.1 408") && text.contains("\"body_timeout\"") {
            out.timed_out += 1;
        } else if out.other.len() < 3 {
            out.other.push(text.lines().next().unwrap_or("no answer").to_owned());
        }
    }
    out
}

/// Asks for a large list, leaves the answer unread for two seconds, then reads it; until `stop`.
/// Returns the statuses of the answers (0: none within 5 s of the stall).
async fn slow_reader(port: u16, token: String, stop: Arc<AtomicBool>) -> Vec<u16> {
    let mut statuses = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)).await else { continue };
        let head = format!(
            "GET /v1/conversations?limit=100 HTTP/1.1\r\nhost: chaos\r\nauthorization: Bearer {token}\r\n\
             connection: close\r\n\r\n"
        );
        if conn.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut answer)).await;
        let status = std::str::from_utf8(answer.get(9..12).unwrap_or_default()).ok().and_then(|s| s.parse().ok());
        statuses.push(if read.is_ok() { status.unwrap_or(0) } else { 0 });
    }
    statuses
}

/// The highest bulkhead use and waiters seen on the ops listener, every 100 ms, and the samples.
async fn watch_bulkhead(ops: String, stop: Arc<AtomicBool>) -> (u64, u64, usize) {
    let Ok(http) = client() else { return (0, 0, 0) };
    let (mut in_use, mut waiting, mut polls) = (0, 0, 0);
    while !stop.load(Ordering::Relaxed) {
        if let Ok(r) = http.get(format!("{ops}/v1/ops/status")).send().await
            && let Ok(v) = r.json::<Value>().await
        {
            in_use = in_use.max(v["layers"]["bulkhead"]["in_use"].as_u64().unwrap_or(0));
            waiting = waiting.max(v["layers"]["bulkhead"]["waiting"].as_u64().unwrap_or(0));
            polls += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (in_use, waiting, polls)
}

/// The longest any request has held a database slot since the API started, ms.
async fn longest_hold_ms(ops: &str) -> anyhow::Result<f64> {
    let v: Value = client()?.get(format!("{ops}/v1/ops/status")).send().await?.json().await?;
    v["layers"]["bulkhead"]["longest_hold_ms"].as_f64().ok_or_else(|| anyhow::anyhow!("no longest_hold_ms: {v}"))
}

/// Runs the scenario on an API process of its own, its load at half of that process's own
/// capacity (a quarter for the debug build). With `--release`, where the host allows it (root and a cgroup filesystem), the
/// process is pinned at the production shape, 0.25 core / 512 MiB. The debug build (CI's) runs
/// unpinned: pinned, it is several times slower than anything deployed, and the attacker's fixed
/// load (20 slow readers of 100-row pages) alone overloads it.
pub(super) async fn run(bed: &Testbed, release: bool, report: &mut Report) -> anyhow::Result<()> {
    let pinned = release && can_pin();
    let mut api = bed.spawn_api(free_port()?, &[], pinned)?;
    if pinned {
        api.pid = find_api_pid(api.child.id()).ok_or_else(|| anyhow::anyhow!("the pinned API's pid"))?;
    }
    wait_healthy(&api.base(), Duration::from_secs(30)).await?;
    let capacity = capacity(&api.base(), &bed.tenants).await?;
    // The goal's load is half of capacity, at the production shape (release, pinned). The debug
    // build pays several times the release build's CPU for the same attack, on the same two cores
    // as the load and the attackers, so it runs the others at a quarter.
    let share_of_capacity = if release { 0.5 } else { 0.25 };
    let rate = (capacity * share_of_capacity).clamp(10.0, 400.0);
    report.note(format!(
        "{S}: the API runs {} at {capacity:.0} req/s of capacity; the other tenants' load at {rate:.0} req/s \
         ({share_of_capacity}x)",
        if pinned { "pinned (0.25 core, 512 MiB)" } else { "unpinned (a debug build, or not root, or no cgroups)" }
    ));
    let result = attack(bed, &api, rate, release, report).await;
    stop_api(&mut api);
    report_panics(&api, S, report);
    result
}

async fn attack(bed: &Testbed, api: &Api, rate: f64, release: bool, report: &mut Report) -> anyhow::Result<()> {
    let duration = Duration::from_secs(if bed.quick { 15 } else { 30 });
    let attacker = &bed.attacker;
    let conv = attacker.conversations[0];
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let load = open_loop(S, api.base(), bed.tenants.clone(), rate, duration, t0);

    let stallers = stall_every_write_route(api.port, &attacker.token, conv, &stop);
    let readers: Vec<_> =
        (0..20).map(|_| tokio::spawn(slow_reader(api.port, attacker.token.clone(), stop.clone()))).collect();

    let forged = forge_token(bed)?;
    let base = api.base();
    let forgers = rotation(
        "forged",
        vec![format!("{base}/v1/conversations?limit=10"), format!("{base}/v1/contacts?limit=10")],
        Some(&forged),
        rate,
        duration,
    )?;
    let ops_probes = rotation(
        "ops-paths",
        vec![format!("{base}/ready"), format!("{base}/metrics"), format!("{base}/v1/ops/status")],
        None,
        rate / 2.0,
        duration,
    )?;
    let watcher = tokio::spawn(watch_bulkhead(api.ops_base(), stop.clone()));

    let samples = load.await?;
    stop.store(true, Ordering::Relaxed);
    let stalls = sum_stalls(stallers).await?;
    let mut read = Vec::new();
    for r in readers {
        read.extend(r.await?);
    }
    let forged: Vec<Outcome> = forgers.await?.into_iter().map(|s| s.outcome).collect();
    let probes: Vec<Outcome> = ops_probes.await?.into_iter().map(|s| s.outcome).collect();
    let (in_use, waiting, polls) = watcher.await?;
    // Read after every stalled write has had its 408, so a slot one of them held would count.
    let longest = longest_hold_ms(&api.ops_base()).await?;

    other_tenants(&samples, rate, release, report);
    // A full bulkhead does not say a client holds a slot: at a quarter core the quota's pauses
    // fill it with ordinary work (docs/RELIABILITY.md). How long a slot was held does: a stalled
    // write that had taken one would hold it until its 408, the whole body-read timeout.
    let bound = BODY_READ_TIMEOUT / 2;
    report.check(
        S,
        "no database slot waits on a client",
        &format!(
            "no request held a database slot for {} ms (half the body-read timeout); the bulkhead's longest hold, read after the last 408",
            bound.as_millis()
        ),
        format!(
            "the longest hold {longest:.0} ms; the bulkhead at most {in_use} of {POOL} in use and {waiting} waiting over {polls} samples (every 100 ms)"
        ),
        polls > 0 && longest < bound.as_secs_f64() * 1e3,
    );
    report.check(
        S,
        "stalled bodies are cut at the body-read timeout",
        &format!("every one answered 408 body_timeout within {} s", BODY_READ_TIMEOUT.as_secs() + 2),
        format!(
            "{} of {} sent answered 408, the longest after {}{}",
            stalls.timed_out,
            stalls.sent,
            ms(stalls.longest),
            if stalls.other.is_empty() { String::new() } else { format!("; other answers: {:?}", stalls.other) }
        ),
        stalls.sent >= POOL * 10
            && stalls.other.is_empty()
            && stalls.longest <= BODY_READ_TIMEOUT + Duration::from_secs(2),
    );
    let mut slow_pages = std::collections::BTreeMap::<u16, usize>::new();
    for s in &read {
        *slow_pages.entry(*s).or_default() += 1;
    }
    report.note(format!(
        "{S}: slow readers asked {} pages of 100 and read each after a 2 s stall; statuses {slow_pages:?}",
        read.len()
    ));
    // A forged token or an ops path may also be refused (a typed 503) under load, like any
    // request; what must never happen is a 2xx, or anything but the refusal or the 401/404.
    let mut refused_or = |what: &str, outcomes: &[Outcome], answer: u16| {
        let mut by = std::collections::BTreeMap::<String, usize>::new();
        for o in outcomes {
            *by.entry(o.label()).or_default() += 1;
        }
        let answered = |o: &Outcome| matches!(o, Outcome::Answered { status, .. } if *status == answer);
        let refused = |o: &Outcome| o.refusal().is_some_and(|(status, _)| status == 503);
        report.check(
            S,
            what,
            &format!("every one {answer}, or a 503 refusal; none served"),
            format!("{} requests by status: {by:?}", outcomes.len()),
            outcomes.iter().all(|o| answered(o) || refused(o)) && outcomes.iter().any(answered),
        );
    };
    refused_or("forged tokens claiming the victim's tenant are refused", &forged, 401);
    refused_or("/ready, /metrics and /v1/ops/status are not on the public port", &probes, 404);
    Ok(())
}

/// Stalled bodies on every write route, ten times the pool: each connection sends its head and
/// the start of a body, then nothing.
fn stall_every_write_route(
    port: u16,
    token: &str,
    conv: uuid::Uuid,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Stalls>> {
    let routes = [
        ("POST", "/v1/contacts".to_owned()),
        ("POST", "/v1/conversations".to_owned()),
        ("PATCH", format!("/v1/conversations/{conv}")),
        ("POST", format!("/v1/conversations/{conv}/messages")),
    ];
    (0..POOL * 10)
        .map(|i| {
            let (method, path) = &routes[i % routes.len()];
            let head = format!(
                "{method} {path} HTTP/1.1\r\nhost: chaos\r\nauthorization: Bearer {token}\r\n\
                 content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"bo"
            );
            tokio::spawn(stall(port, head, Arc::clone(stop)))
        })
        .collect()
}

/// The stalled connections' outcomes, added up.
async fn sum_stalls(stallers: Vec<tokio::task::JoinHandle<Stalls>>) -> anyhow::Result<Stalls> {
    let mut stalls = Stalls::default();
    for s in stallers {
        let s = s.await?;
        stalls.sent += s.sent;
        stalls.timed_out += s.timed_out;
        stalls.longest = stalls.longest.max(s.longest);
        stalls.other.extend(s.other.into_iter().take(3usize.saturating_sub(stalls.other.len())));
    }
    Ok(stalls)
}

/// A token claiming the victim's tenant, signed with another key.
fn forge_token(bed: &Testbed) -> anyhow::Result<String> {
    let victim = &bed.tenants[0];
    let out = std::process::Command::new(bed.bin.join("breakwater-api"))
        .args(["token", "--tenant", &victim.tenant.to_string(), "--user", &victim.user.to_string(), "--role", "admin"])
        .env("JWT_SECRET", "a-forger-s-own-key-a-forger-s-own-key-0123456789")
        .output()?;
    anyhow::ensure!(out.status.success(), "minting the forged token failed");
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// The other tenants' load is served, within its latency bound.
fn other_tenants(samples: &[Sample], rate: f64, release: bool, report: &mut Report) {
    let all = tally(samples);
    report.note(format!(
        "{S} run: {} requests of the other tenants at {rate:.0} req/s: {}",
        samples.len(),
        describe(&all)
    ));
    let ok_share = share(all.ok, samples.len());
    report.check(
        S,
        "the other tenants are served",
        ">= 99.5% 2xx",
        format!("{:.2}% ({} of {})", ok_share * 100.0, all.ok, samples.len()),
        ok_share >= 0.995,
    );
    let p99 = percentile(samples.iter().filter(|s| s.outcome.is_ok()).map(|s| s.took).collect(), 99);
    let bound = if release { Duration::from_millis(200) } else { Duration::from_secs(1) };
    report.check(
        S,
        "the other tenants' p99",
        if release { "<= 200 ms" } else { "<= 1000 ms (debug build; 200 ms with --release)" },
        ms(p99),
        p99 <= bound,
    );
}
