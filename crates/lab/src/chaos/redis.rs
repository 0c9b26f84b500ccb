//! `redis`: Redis killed and restarted under load; the throttles degrade to in-process and come
//! back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use super::load::{REFUSED_AT_CONNECT, describe, ms, open_loop, tally};
use super::testbed::{Api, Testbed};
use super::verdict::Report;

pub(super) async fn throttle_state(client: &reqwest::Client, ops: &str) -> Option<String> {
    let r = client.get(format!("{ops}/v1/ops/status")).send().await.ok()?;
    let v: Value = r.json().await.ok()?;
    v["layers"]["throttles"]["state"].as_str().map(str::to_owned)
}

pub(super) async fn run(bed: &mut Testbed, api: &Api, rate: f64, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "redis";
    let duration = Duration::from_secs(if bed.quick { 15 } else { 24 });
    let t0 = Instant::now();
    let load = open_loop("redis", api.base(), bed.tenants.clone(), rate, duration, t0);
    let poller = {
        let ops = api.ops_base();
        tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
            let mut states = Vec::new();
            while t0.elapsed() < duration {
                states.push((t0.elapsed(), throttle_state(&client, &ops).await));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(states)
        })
    };
    tokio::time::sleep(duration / 4).await;
    // The fault goes into a known state: under load on a slow machine one Redis call over its
    // budget opens the breaker for a moment by itself (the polls before the kill count those).
    // Wait up to 2 s for the throttles to read `ok`, then kill at once.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let ok_by = Instant::now() + Duration::from_secs(2);
    let mut before_ok = throttle_state(&client, &api.ops_base()).await.as_deref() == Some("ok");
    while !before_ok && Instant::now() < ok_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
        before_ok = throttle_state(&client, &api.ops_base()).await.as_deref() == Some("ok");
    }
    let killed_at = t0.elapsed();
    bed.kill_redis();
    tokio::time::sleep(duration * 3 / 10).await;
    let restarted_at = t0.elapsed();
    bed.start_redis()?;
    let samples = load.await?;
    let states = poller.await?.context("status poller")?;
    let all = tally(&samples);
    report.note(format!("redis run: {} requests at {rate:.0} req/s: {}", samples.len(), describe(&all)));
    report.check(
        S,
        "no 5xx, no transport failures (admission's shed 503s are refusals, counted apart)",
        "0",
        format!(
            "{} server errors, {} typed database 503s, {} 503s outside the typed set, {} failed ({} of them \
             refused connections); {} shed by admission",
            all.server_errors(),
            all.typed_503(),
            all.other_503(),
            all.failed(),
            all.failed_with(REFUSED_AT_CONNECT),
            all.shed()
        ),
        all.server_errors() == 0 && all.typed_503() == 0 && all.other_503() == 0 && all.failed() == 0,
    );
    let mut seen_before: BTreeMap<String, usize> = BTreeMap::new();
    for (_, st) in states.iter().filter(|(t, _)| *t < killed_at) {
        *seen_before.entry(st.clone().unwrap_or_else(|| "no answer".into())).or_default() += 1;
    }
    let degraded = states
        .iter()
        .find(|(t, s)| *t >= killed_at && *t < restarted_at && s.as_deref() == Some("degraded"))
        .map(|(t, _)| t.saturating_sub(killed_at));
    report.check(
        S,
        "throttles degrade to in-process (ops/status layers.throttles.state)",
        "ok when killed, degraded within 3 s of the kill",
        format!(
            "polls before the kill {seen_before:?}; ok when killed: {before_ok}; degraded after {}",
            degraded.map_or("never".into(), ms)
        ),
        before_ok && degraded.is_some_and(|d| d <= Duration::from_secs(3)),
    );
    let recovered = states
        .iter()
        .find(|(t, s)| *t >= restarted_at && s.as_deref() == Some("ok"))
        .map(|(t, _)| t.saturating_sub(restarted_at));
    report.check(
        S,
        "throttles come back to Redis",
        "ok within 5 s of the restart",
        format!("ok after {}", recovered.map_or("never".into(), ms)),
        recovered.is_some_and(|d| d <= Duration::from_secs(5)),
    );
    Ok(())
}
