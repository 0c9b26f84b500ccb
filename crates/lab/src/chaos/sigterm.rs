//! `sigterm`: the API terminated under load, and a new process started on the same port.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use super::load::{Outcome, REFUSED_AT_CONNECT, Sample, describe, ms, open_loop, posts, request_id, tally};
use super::testbed::{Api, Testbed, report_panics, terminate, wait_healthy};
use super::verdict::Report;

const S: &str = "sigterm";

pub(super) async fn run(bed: &Testbed, mut api: Api, rate: f64, report: &mut Report) -> anyhow::Result<Api> {
    let duration = Duration::from_secs(14);
    let t0 = Instant::now();
    let load = open_loop("sigterm", api.base(), bed.tenants.clone(), rate, duration, t0);
    // Readiness and the listener, probed on a new connection each time (as a load balancer does).
    let prober = tokio::spawn(probe_ready(api.ops_base(), t0, duration));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let term_at = t0.elapsed();
    terminate(&api.child)?;
    // Wait for the listener to close, then start the new process on the same port at once.
    let port = api.port;
    let closed_at = loop {
        if std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_err() {
            break t0.elapsed();
        }
        anyhow::ensure!(t0.elapsed() < term_at + Duration::from_secs(30), "the listener never closed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let spawned_at = t0.elapsed();
    let new_api = bed.spawn_api(port, &[("RUST_LOG", READ_LOG)], false)?;
    let serving = wait_healthy(&new_api.base(), Duration::from_secs(20)).await;
    let exit = loop {
        if let Some(status) = api.child.try_wait()? {
            break Some((t0.elapsed(), status));
        }
        if t0.elapsed() > term_at + Duration::from_secs(40) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let samples = load.await?;
    let probes = prober.await?.context("prober")?;
    let all = tally(&samples);
    report.note(format!("sigterm run: {} requests at {rate:.0} req/s: {}", samples.len(), describe(&all)));

    let not_ready_at = probes.iter().find(|(t, g)| *t >= term_at && g != "200").map(|(t, g)| (*t, g.clone()));
    report.check(
        S,
        "readiness turns false before the listener closes",
        "/ready 503 after SIGTERM, before connections are refused",
        format!(
            "/ready {} at +{}; listener closed at +{}",
            not_ready_at.as_ref().map_or("-", |(_, g)| g.as_str()),
            not_ready_at.as_ref().map_or("never".into(), |(t, _)| ms(t.saturating_sub(term_at))),
            ms(closed_at.saturating_sub(term_at))
        ),
        not_ready_at.as_ref().is_some_and(|(t, g)| g == "503" && *t < closed_at),
    );
    accepted_requests(bed, [&api, &new_api], &samples, term_at, report).await?;
    report.check(
        S,
        "the old process exits cleanly within the grace period",
        "exit 0 within 30 s of SIGTERM",
        exit.map_or("still running after 40 s".into(), |(t, st)| {
            format!("{st} after {}", ms(t.saturating_sub(term_at)))
        }),
        exit.is_some_and(|(t, st)| st.success() && t.saturating_sub(term_at) < Duration::from_secs(30)),
    );
    let serve_ms = serving.as_ref().map_or_else(|e| format!("{e}"), |d| ms(*d));
    report.check(
        S,
        "a new process on the same port serves at once",
        "/health 200 within 5 s of its start",
        format!("{serve_ms} (started {} after the listener closed)", ms(spawned_at.saturating_sub(closed_at))),
        serving.is_ok_and(|d| d <= Duration::from_secs(5)),
    );
    report_panics(&api, S, report);
    Ok(new_api)
}

/// `/ready` on a new connection every 25 ms for `duration` from `t0`: when, and what it answered.
async fn probe_ready(ops: String, t0: Instant, duration: Duration) -> Option<Vec<(Duration, String)>> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).pool_max_idle_per_host(0).build().ok()?;
    let mut seen = Vec::new();
    while t0.elapsed() < duration {
        let at = t0.elapsed();
        let got = match client.get(format!("{ops}/ready")).send().await {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) if e.is_connect() => "refused".to_owned(),
            Err(e) => format!("error {e}"),
        };
        seen.push((at, got));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Some(seen)
}

/// Every request either process read got a complete response, and a request neither read (closed
/// as it arrived) was not stored. A refused connection sent nothing: it is counted apart, allowed
/// (the port changes hands), and never in the table.
async fn accepted_requests(
    bed: &Testbed,
    [api, new_api]: [&Api; 2],
    samples: &[Sample],
    term_at: Duration,
    report: &mut Report,
) -> anyhow::Result<()> {
    let all = tally(samples);
    // A failed request was accepted if a process read it: its log has the event the accept loop
    // logs as hyper hands a request to the app (at debug, enabled for both processes; either may
    // have read a request sent around the handover). One never read was not accepted: the HTTP/1.1
    // race where the server closes an idle kept-alive connection as the client sends on it
    // (RFC 9112, section 9.3.1). Such a POST must not be in the table.
    let mut read = read_request_ids(&api.log);
    read.extend(read_request_ids(&new_api.log));
    let before_term: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at < term_at && matches!(s.outcome, Outcome::Answered { status: 200..=299, .. }))
        .collect();
    let unlogged = before_term.iter().filter(|s| !read.contains(&request_id("sigterm", s.i))).count();
    report.check(
        S,
        "the old process logs every request it reads (this check's instrument)",
        "every 2xx sent before SIGTERM is in the log",
        format!("{} of {} found", before_term.len() - unlogged, before_term.len()),
        !before_term.is_empty() && unlogged == 0,
    );
    let failed: Vec<(&Sample, &str)> = samples
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Unanswered { kind, detail } if kind != REFUSED_AT_CONNECT => Some((s, detail.as_str())),
            _ => None,
        })
        .collect();
    let (accepted, unread): (Vec<&Sample>, Vec<&Sample>) =
        failed.iter().map(|(s, _)| *s).partition(|s| read.contains(&request_id("sigterm", s.i)));
    let unread_posts: Vec<String> = unread.iter().filter(|s| posts(s.i)).map(|s| request_id("sigterm", s.i)).collect();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&bed.db_url).await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE body = ANY($1)")
        .bind(&unread_posts)
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    let when: Vec<String> = failed
        .iter()
        .map(|(s, detail)| {
            let sent = s.at.as_secs_f64() - term_at.as_secs_f64();
            let what: String = detail.chars().take(160).collect();
            format!("{} sent at {sent:+.3} s from SIGTERM: {what}", request_id("sigterm", s.i))
        })
        .collect();
    if !when.is_empty() {
        report.note(format!("sigterm failures: {}", when.join("; ")));
    }
    report.check(
        S,
        "every accepted request gets a complete response",
        "0 resets or truncated responses to a request the server read; 0 5xx; refusals and refused connections allowed",
        format!(
            "{} failed: {} read by the server, {} never read (closed as it arrived; {} of them POSTs, {stored} of \
             those stored); {} refused at connect, {} server errors, {} 503s outside the typed set",
            failed.len(),
            accepted.len(),
            unread.len(),
            unread_posts.len(),
            all.failed_with(REFUSED_AT_CONNECT),
            all.server_errors(),
            all.other_503()
        ),
        accepted.is_empty() && stored == 0 && all.server_errors() == 0 && all.other_503() == 0,
    );
    Ok(())
}

/// The API's log filter when the requests it reads are accounted for (see `read_request_ids`).
pub(super) const READ_LOG: &str = "info,breakwater_api::request_read=debug";

/// The `x-request-id`s of the requests an API process read, from its log (JSON lines; the
/// `breakwater_api::request_read` debug events).
pub(super) fn read_request_ids(log: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("breakwater_api::request_read"))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["fields"]["request_id"].as_str().map(str::to_owned))
        .collect()
}
