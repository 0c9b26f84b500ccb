//! What a request costs the shared components, measured over a fleet run: the figures the
//! capacity model in docs/DEPLOY.md scales from this machine's tasks to a hundred.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counters read before and after the load.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reading {
    /// Redis commands by name (`INFO commandstats`).
    redis_calls: BTreeMap<String, u64>,
    /// CPU seconds of every PostgreSQL process, by pid.
    postgres_cpu: BTreeMap<u32, f64>,
    /// Bytes into and out of the balancer's frontend.
    bytes_in: u64,
    bytes_out: u64,
}

/// Per request, over the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Costs {
    /// Requests answered (2xx, refused or failed), both populations.
    pub(crate) requests: u64,
    pub(crate) redis_commands_per_request: f64,
    /// The commands, by name, over the whole run.
    pub(crate) redis_commands: BTreeMap<String, u64>,
    pub(crate) postgres_cpu_us_per_request: f64,
    /// The most connections to the run's database at once, by application (the API tasks'
    /// pools, the worker's), sampled every second.
    pub(crate) postgres_connections_peak: BTreeMap<String, u64>,
    pub(crate) bytes_in_per_request: f64,
    pub(crate) bytes_out_per_request: f64,
}

pub(crate) async fn read(redis: &str, balancer: &super::processes::Balancer) -> Reading {
    Reading {
        redis_calls: redis_commandstats(redis).await.unwrap_or_default(),
        postgres_cpu: crate::lab::probes::postgres_cpu_seconds().unwrap_or_default(),
        bytes_in: balancer.frontend_bytes().await.map_or(0, |b| b.0),
        bytes_out: balancer.frontend_bytes().await.map_or(0, |b| b.1),
    }
}

pub(crate) fn between(a: &Reading, b: &Reading, requests: u64, connections: BTreeMap<String, u64>) -> Costs {
    let per = |x: f64| if requests == 0 { 0.0 } else { x / requests as f64 };
    let commands: BTreeMap<String, u64> = b
        .redis_calls
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(a.redis_calls.get(k).copied().unwrap_or(0))))
        .filter(|(k, v)| *v > 0 && k != "info")
        .collect();
    // A process in both readings counts its growth; one that started in between, all of it.
    let pg: f64 =
        b.postgres_cpu.iter().map(|(pid, s)| (s - a.postgres_cpu.get(pid).copied().unwrap_or(0.0)).max(0.0)).sum();
    Costs {
        requests,
        redis_commands_per_request: per(commands.values().sum::<u64>() as f64),
        redis_commands: commands,
        postgres_cpu_us_per_request: per(pg * 1e6),
        postgres_connections_peak: connections,
        bytes_in_per_request: per(b.bytes_in.saturating_sub(a.bytes_in) as f64),
        bytes_out_per_request: per(b.bytes_out.saturating_sub(a.bytes_out) as f64),
    }
}

/// Connections to `database` now, by application name.
pub(crate) async fn connections(pool: &sqlx::PgPool, database: &str) -> BTreeMap<String, u64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT coalesce(nullif(application_name, ''), 'unnamed'), count(*) FROM pg_stat_activity WHERE datname = $1 GROUP BY 1",
    )
    .bind(database)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    rows.into_iter().map(|(k, n)| (k, u64::try_from(n).unwrap_or(0))).collect()
}

/// `INFO commandstats` over a plain connection: calls per command.
async fn redis_commandstats(url: &str) -> Result<BTreeMap<String, u64>> {
    let hostport = url.trim_start_matches("redis://").split('/').next().unwrap_or("127.0.0.1:6379").to_owned();
    let mut s = tokio::net::TcpStream::connect(&hostport)
        .await
        .with_context(|| format!("connecting to Redis at {hostport}"))?;
    s.write_all(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n").await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    // A bulk string: `$<len>\r\n<body>\r\n`.
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(2), s.read(&mut chunk)).await??;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, _)) = text.split_once("\r\n")
            && let Ok(len) = head.trim_start_matches('$').parse::<usize>()
            && buf.len() >= head.len() + 2 + len
        {
            break;
        }
    }
    Ok(parse_commandstats(&String::from_utf8_lossy(&buf)))
}

fn parse_commandstats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_and_the_differences_per_request() {
        let text = "$120\r\n# Commandstats\r\ncmdstat_evalsha:calls=30,usec=90,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=2,usec=1\r\n";
        let calls = parse_commandstats(text);
        assert_eq!(calls.get("evalsha"), Some(&30));
        let a = Reading { redis_calls: [("evalsha".to_owned(), 10)].into(), bytes_in: 100, ..Reading::default() };
        let b = Reading { redis_calls: calls, postgres_cpu: [(7, 0.002)].into(), bytes_in: 1_100, bytes_out: 5_000 };
        let c = between(&a, &b, 10, BTreeMap::new());
        assert_eq!(c.redis_commands.get("evalsha"), Some(&20));
        assert!(!c.redis_commands.contains_key("info"), "the reading's own INFO is left out");
        assert!((c.redis_commands_per_request - 2.0).abs() < 1e-9);
        assert!((c.postgres_cpu_us_per_request - 200.0).abs() < 1e-6);
        assert!((c.bytes_in_per_request - 100.0).abs() < 1e-9 && (c.bytes_out_per_request - 500.0).abs() < 1e-9);
    }
}
