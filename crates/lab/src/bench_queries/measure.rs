//! What a case measures: its latencies, its rows and its plans (from auto_explain, on the
//! statements timed), and whether a plan scans a big table sequentially.

use std::fmt::Write as _;
use std::time::Duration;

use sqlx::Executor as _;

use super::notices::Notices;
use breakwater_domain::Pool;

#[derive(Debug, Clone, Default)]
pub(super) struct Timing {
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) rows: usize,
    pub(super) seq_scan: bool,
    pub(super) explain: String,
}

pub(super) fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

pub(super) fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1_000.0)
}

/// Runs `work` with auto_explain on and returns the plans it logged.
pub(super) async fn explained<T>(
    pool: &Pool,
    notices: &Notices,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Vec<String>> {
    pool.execute("SET auto_explain.log_min_duration = 0").await?;
    notices.take();
    let outcome = work.await;
    let plans = notices.take();
    pool.execute("SET auto_explain.log_min_duration = -1").await?;
    outcome?;
    Ok(plans)
}

/// Whether a plan reads one of the big tables sequentially.
pub(super) fn seq_scan(plans: &str) -> bool {
    plans.lines().any(|l| {
        ["conversations", "messages", "contacts"]
            .iter()
            .any(|t| l.split("Seq Scan on ").skip(1).any(|rest| rest.split_whitespace().next() == Some(t)))
    })
}

/// A plan with its numbers and quoted literals blanked out.
pub(super) fn shape_of(plan: &str) -> String {
    let mut out = String::with_capacity(plan.len());
    let mut quoted = false;
    for c in plan.chars() {
        if c == '\'' {
            quoted = !quoted;
            out.push(c);
        } else if !quoted && !c.is_ascii_digit() {
            out.push(c);
        }
    }
    out
}

/// Collapses plans that differ only in their numbers (a foreign-key trigger's query runs once
/// per deleted row), keeping the first and counting the rest.
pub(super) fn dedupe(plans: &[String]) -> String {
    let mut seen: Vec<(String, &String, usize)> = Vec::new();
    for p in plans {
        let shape = shape_of(p);
        match seen.iter_mut().find(|(s, _, _)| *s == shape) {
            Some((_, _, n)) => *n += 1,
            None => seen.push((shape, p, 1)),
        }
    }
    let mut out = String::new();
    for (_, plan, n) in seen {
        if n > 1 {
            let _ = writeln!(out, "-- the plan below ran {n} times (the first one shown)");
        }
        let _ = writeln!(out, "{}\n", plan.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_scans_of_the_big_tables_are_found() {
        assert!(seq_scan("  ->  Seq Scan on messages m  (cost=0.00..1.00 rows=1 width=8)"));
        assert!(seq_scan("Parallel Seq Scan on conversations  (cost=..."));
        assert!(!seq_scan("  ->  Seq Scan on idempotency_keys  (cost=..."));
        assert!(!seq_scan("  ->  Index Scan using messages_pkey on messages m"));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99), Duration::from_millis(99));
        assert_eq!(percentile(&v[..1], 99), Duration::from_millis(1));
    }
}
