//! `postgres`: the cluster stopped and started under load at half of measured capacity.

use std::collections::BTreeMap;
use std::time::Duration;
use std::time::Instant;

use serde_json::Value;
use uuid::Uuid;

use super::load::{
    Outcome, REFUSED_AT_CONNECT, SHED_503, Sample, TYPED_503, describe, ms, open_loop, percentile, share, tally,
};
use super::testbed::{Api, Testbed};
use super::verdict::Report;

const S: &str = "postgres";

pub(super) async fn run(bed: &mut Testbed, api: &Api, rate: f64, report: &mut Report) -> anyhow::Result<()> {
    let duration = Duration::from_secs(if bed.quick { 20 } else { 30 });
    let t0 = Instant::now();
    let load = open_loop("postgres", api.base(), bed.tenants.clone(), rate, duration, t0);
    tokio::time::sleep(duration / 4).await;
    let down_from = t0.elapsed();
    bed.pg.stop()?;
    let stopped_at = t0.elapsed();
    tokio::time::sleep(duration * 3 / 10).await;
    let restart_at = t0.elapsed();
    bed.pg.start()?;
    let up_at = t0.elapsed();
    println!(
        "  stop issued at {:.1} s (stopped at {:.1} s), start issued at {:.1} s, accepting at {:.1} s",
        down_from.as_secs_f64(),
        stopped_at.as_secs_f64(),
        restart_at.as_secs_f64(),
        up_at.as_secs_f64()
    );
    let samples = load.await?;
    let all = tally(&samples);
    report.note(format!(
        "postgres run: {} requests at {rate:.0} req/s over {} s: {}",
        samples.len(),
        duration.as_secs(),
        describe(&all)
    ));
    report.check(
        S,
        "5xx other than a typed 503, and transport failures",
        "0",
        format!(
            "{} server errors, {} 503s outside the typed set, {} failed ({} of them refused connections)",
            all.server_errors(),
            all.other_503(),
            all.failed(),
            all.failed_with(REFUSED_AT_CONNECT)
        ),
        all.server_errors() == 0 && all.other_503() == 0 && all.failed() == 0,
    );

    let times = Times { down_from, stopped_at, restart_at, up_at };
    while_down(&samples, api, &times, report).await;
    after_return(&samples, &times, report);
    nothing_lost(bed, &samples, report).await
}

/// When the fault began and ended, since the run began.
struct Times {
    /// The stop issued.
    down_from: Duration,
    /// The cluster stopped.
    stopped_at: Duration,
    /// The start issued.
    restart_at: Duration,
    /// The cluster accepting again.
    up_at: Duration,
}

/// While the database was down: every non-2xx a typed 503, each answered quickly.
async fn while_down(samples: &[Sample], api: &Api, times: &Times, report: &mut Report) {
    let Times { stopped_at, restart_at, up_at, .. } = *times;
    let down: Vec<&Sample> = samples.iter().filter(|s| s.at >= stopped_at && s.at < restart_at).collect();
    let down_tally = tally(down.iter().copied());
    // Admission's refusals to a caller that came back before its `Retry-After` are held until
    // then by design (the caller pays in its own time, docs/ADMISSION.md), for at most the
    // pacer's cap: they are bounded by the cap past the same 2 s, everything else by 2 s.
    let longest = |shed: bool| {
        down.iter().filter(|s| s.outcome.refused_503(SHED_503) == shed).map(|s| s.took).max().unwrap_or_default()
    };
    let (down_max, shed_max) = (longest(false), longest(true));
    let down_p99 = percentile(down.iter().map(|s| s.took).collect(), 99);
    let pacing = pacing_status(api).await;
    let max_hold = Duration::from_secs_f64(pacing.map_or(0.0, |p| p.0) / 1000.0);
    // A 2xx "while down" can only be a request that waited for the database to come back (the
    // pool keeps trying to connect until its acquire timeout): when were they sent, and answered?
    let ok_down: Vec<String> = down
        .iter()
        .filter(|s| s.outcome.is_ok())
        .map(|s| {
            format!(
                "sent {:+.0} ms, answered {:+.0} ms",
                (s.at.as_secs_f64() - restart_at.as_secs_f64()) * 1000.0,
                ((s.at + s.took).as_secs_f64() - up_at.as_secs_f64()) * 1000.0
            )
        })
        .collect();
    if !ok_down.is_empty() {
        report.note(format!(
            "postgres: 2xx to requests sent while it was down (relative to the start issued, and to it accepting): {}",
            ok_down.join("; ")
        ));
    }
    report.check(
        S,
        "while down: typed 503s",
        "every non-2xx a typed 503 (db_* or admission's load_shed/queue_timeout)",
        format!("{} requests: {}", down.len(), describe(&down_tally)),
        down_tally.typed_503() + down_tally.shed() > 0
            && down_tally.ok + down_tally.typed_503() + down_tally.shed() == down.len(),
    );
    report.check(
        S,
        "while down: answered quickly",
        &format!(
            "max < 2000 ms (no 15 s hangs); admission's refusals held for early callers < 2000 ms + the pacer's cap ({})",
            ms(max_hold)
        ),
        format!(
            "p99 {}; max {} (admission's refusals: {}; {} refusals held since start)",
            ms(down_p99),
            ms(down_max),
            ms(shed_max),
            pacing.map_or_else(|| "-".to_owned(), |p| p.1.to_string())
        ),
        pacing.is_some() && down_max < Duration::from_secs(2) && shed_max < Duration::from_secs(2) + max_hold,
    );
}

/// "Serves normally" is judged against the same run before the fault: the same load, the same
/// process.
fn after_return(samples: &[Sample], times: &Times, report: &mut Report) {
    let Times { down_from, up_at, .. } = *times;
    // "Serves normally" is judged against the same run before the fault: the same load, the same
    // process. From 5 s after the return: no database error at all, no 5xx or transport failure
    // (the first check), and admission refusing no larger a share than before the stop (at least
    // 1% is allowed, the lab's bound for a step within capacity: an adaptive limit refuses the odd
    // request in a latency spike at any load, fault or not).
    let before_stop: Vec<&Sample> = samples.iter().filter(|s| s.at < down_from).collect();
    let before_n = before_stop.len();
    let before = tally(before_stop.iter().copied());
    let before_refused = share(before.refusals(), before_n);
    let after: Vec<&Sample> = samples.iter().filter(|s| s.at >= up_at).collect();
    // What the tail after the return is made of, second by second, so a slow recovery can be
    // told apart: admission's limit climbing back (shed), the pool reconnecting (db_*), or both.
    let mut by_second: BTreeMap<u64, Vec<&Sample>> = BTreeMap::new();
    for s in &after {
        by_second.entry(s.at.saturating_sub(up_at).as_secs()).or_default().push(s);
    }
    let timeline: Vec<String> = by_second
        .iter()
        .filter(|(second, s)| **second < 6 || s.iter().any(|s| !s.outcome.is_ok()))
        .map(|(second, s)| {
            let t = tally(s.iter().copied());
            format!("+{second} s: {} of {} ok {:?}", t.ok, s.len(), t.not_ok())
        })
        .collect();
    report.note(format!(
        "postgres before the stop: {before_n} requests, {}; after its return: {}",
        describe(&before),
        timeline.join("; ")
    ));
    let last_db_error =
        after.iter().filter(|s| s.outcome.refused_503(TYPED_503)).map(|s| s.at.saturating_sub(up_at)).max();
    report.check(
        S,
        "the database serves again within 5 s of its return, no API restart",
        "no typed database 503 (db_*, request_timeout) sent 5 s or more after",
        last_db_error.map_or("none after the return".into(), |t| format!("last one sent {} after", ms(t))),
        last_db_error.is_none_or(|t| t < Duration::from_secs(5)),
    );
    let settled: Vec<&Sample> = after.iter().copied().filter(|s| s.at >= up_at + Duration::from_secs(5)).collect();
    let settled_tally = tally(settled.iter().copied());
    let settled_refused = share(settled_tally.refusals(), settled.len());
    let allowed = before_refused.max(0.01);
    let last_bad = after.iter().filter(|s| !s.outcome.is_ok()).map(|s| s.at.saturating_sub(up_at)).max();
    report.check(
        S,
        "from 5 s after the return, refusals no more than before the stop",
        "refused share <= the share before the stop, or 1% if that was lower; nothing else but 2xx",
        format!(
            "{} requests: {:.2}% refused (before the stop: {:.2}%), {} not ok in all{}",
            settled.len(),
            settled_refused * 100.0,
            before_refused * 100.0,
            settled.len() - settled_tally.ok,
            last_bad.map_or(String::new(), |t| format!("; the last one not ok after the return sent {} after", ms(t)))
        ),
        !settled.is_empty()
            && settled_refused <= allowed
            && settled_tally.ok + settled_tally.shed() + settled_tally.throttled() == settled.len(),
    );
}

/// Every 201's message is in the table.
async fn nothing_lost(bed: &Testbed, samples: &[Sample], report: &mut Report) -> anyhow::Result<()> {
    let created: Vec<Uuid> = samples
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Answered { created: Some(id), .. } => Some(*id),
            _ => None,
        })
        .collect();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&bed.db_url).await?;
    let found: i64 =
        sqlx::query_scalar("SELECT count(*) FROM messages WHERE id = ANY($1)").bind(&created).fetch_one(&pool).await?;
    pool.close().await;
    report.check(
        S,
        "no accepted message lost",
        "every 201's message in the table",
        format!("{found} of {} found", created.len()),
        usize::try_from(found).ok() == Some(created.len()) && !created.is_empty(),
    );
    Ok(())
}

/// The pacer's cap on a hold (ms) and its held refusals since start, from `/v1/ops/status`.
pub(super) async fn pacing_status(api: &Api) -> Option<(f64, u64)> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
    let r = client.get(format!("{}/v1/ops/status", api.ops_base())).send().await.ok()?;
    let v: Value = r.json().await.ok()?;
    let p = &v["layers"]["retry_pacing"];
    Some((p["max_hold_ms"].as_f64()?, p["held_total"].as_u64()?))
}
