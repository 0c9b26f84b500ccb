//! The shared buckets: the GCRA script in Redis. The tenant and user buckets are one call, the
//! IP bucket a second, sent in one pipeline (on a cluster, at the same time); the script is
//! called by its hash and loaded on `NOSCRIPT`.

use super::{Decision, KeyKind, Limit, Throttles, combine};
use crate::redis::RedisConnection;

pub(super) const SCRIPT: &str = include_str!("gcra.lua");

/// One `EVALSHA` of the script, loading it first when this Redis (or shard) has not seen it.
async fn evalsha<C: redis::aio::ConnectionLike + Send>(conn: &mut C, cmd: &redis::Cmd) -> redis::RedisResult<Vec<i64>> {
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::NoScriptError => {
            load_script(conn).await?;
            cmd.query_async(conn).await
        }
        result => result,
    }
}

/// `SCRIPT LOAD` (on a cluster, the client sends it to every node, and needs every one to answer).
async fn load_script<C: redis::aio::ConnectionLike + Send>(conn: &mut C) -> redis::RedisResult<()> {
    redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query_async::<redis::Value>(conn).await.map(drop)
}

impl Throttles {
    pub(super) async fn check_redis(
        &self,
        keys: &[String; 2],
        limits: &[(KeyKind, Limit); 2],
        ip_key: &str,
        ip_limit: (KeyKind, Limit),
    ) -> redis::RedisResult<Decision> {
        let mut conn = self.redis.get().await?;
        let hash = self.script.get_hash();
        let mut tenant = redis::cmd("EVALSHA");
        tenant.arg(hash).arg(2).arg(&keys[0]).arg(&keys[1]);
        for (_, l) in limits {
            tenant.arg(l.interval_us()).arg(l.tolerance_us());
        }
        let mut ip = redis::cmd("EVALSHA");
        ip.arg(hash).arg(1).arg(ip_key).arg(ip_limit.1.interval_us()).arg(ip_limit.1.tolerance_us());
        let replies: Vec<Vec<i64>> = match &mut conn {
            RedisConnection::Cluster(c) => {
                // Two slots, perhaps two shards: a cluster refuses a pipeline across slots, so
                // the two calls go out at once on the multiplexed connection instead.
                let mut other = c.clone();
                let (a, b) = tokio::join!(evalsha(c, &tenant), evalsha(&mut other, &ip));
                vec![a?, b?]
            }
            RedisConnection::Single(c) => {
                let mut pipe = redis::pipe();
                pipe.add_command(tenant).add_command(ip);
                match pipe.query_async(c).await {
                    Ok(r) => r,
                    Err(err) if err.kind() == redis::ErrorKind::NoScriptError => {
                        // First call on this Redis (or after a restart/flush): load, retry.
                        load_script(c).await?;
                        pipe.query_async(c).await?
                    }
                    Err(err) => return Err(err),
                }
            }
        };
        let kinds = [limits[0], limits[1]];
        let [first, second] = replies.as_slice() else {
            return Err(redis::RedisError::from((redis::ErrorKind::TypeError, "unexpected script reply")));
        };
        Ok(combine(reply(first, &kinds), reply(second, &[ip_limit])))
    }
}

/// Reads one script reply: `{1, tightest, remaining, reset}` or `{0, refusing, retry_after, 0}`.
fn reply(r: &[i64], kinds: &[(KeyKind, Limit)]) -> Decision {
    let pick = |i: i64| kinds.get(usize::try_from(i - 1).unwrap_or(0)).copied().unwrap_or(kinds[0]);
    match r {
        [1, i, remaining, reset] => {
            let (kind, limit) = pick(*i);
            Decision::Admitted { kind, limit, remaining: u64::try_from(*remaining).unwrap_or(0), reset_us: *reset }
        }
        [0, i, retry, _] => {
            let (kind, limit) = pick(*i);
            Decision::Refused { kind, limit, retry_after_us: *retry }
        }
        _ => Decision::Off,
    }
}
