//! The throttles' cost per request: one pipelined round trip to Redis on loopback (the tenant +
//! user script and the IP script), alone and 64 at once, against the in-process fallback; and
//! the mirror's look before admission (`refused_ahead`) for a request whose buckets have no door
//! (the common case) and for one that passes a door (a tenant that was refused and has room
//! again: the one lock, three lookups and a charge).
//!
//! `cargo bench -p breakwater-api --bench throttles` (needs Redis at `REDIS_URL`, default
//! `redis://127.0.0.1:6379`; the Redis case is skipped when none answers).

use std::net::IpAddr;
use std::time::Duration;

use breakwater_api::throttle::{Limit, Limits, ThrottleSettings, Throttles};
use breakwater_domain::{TenantId, UserId};
use criterion::{Criterion, criterion_group, criterion_main};
use uuid::Uuid;

fn settings(prefix: &str) -> ThrottleSettings {
    // Limits far above the benchmark's rate: every check is admitted, as in normal traffic.
    let big = Limit { rate_per_sec: 1e9, burst: 1_000_000 };
    ThrottleSettings {
        enabled: true,
        limits: Limits { tenant: big, user: big, ip: big },
        api_tasks: 1,
        redis_budget: Duration::from_millis(50),
        key_prefix: prefix.to_owned(),
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let tenant = TenantId(Uuid::now_v7());
    let user = UserId(Uuid::now_v7());
    let ip: IpAddr = [127, 0, 0, 1].into();
    let mut group = c.benchmark_group("throttle_check");

    let redis = breakwater_api::redis::pool(&url, false).expect("redis url");
    let live = Throttles::new(settings(&format!("bench-{}", Uuid::now_v7())), redis.clone());
    if rt.block_on(breakwater_api::redis::ping(&redis, Duration::from_millis(500))) {
        group.bench_function("redis_loopback", |b| b.iter(|| rt.block_on(live.check(tenant, user, ip))));
        // 64 requests checking at once, as on a busy task: what the connections to Redis cost
        // when calls overlap (one time per batch of 64).
        let users: Vec<UserId> = (0..64).map(|_| UserId(Uuid::now_v7())).collect();
        group.bench_function("redis_loopback_64_at_once", |b| {
            b.iter(|| rt.block_on(futures_util::future::join_all(users.iter().map(|u| live.check(tenant, *u, ip)))));
        });
        assert!(!live.is_degraded(), "Redis fell back during the benchmark");
    } else {
        eprintln!("no Redis at {url}: skipping the Redis case");
    }

    // Nothing listens on port 1: the breaker opens after three failures, then every check is local.
    let down =
        Throttles::new(settings("bench-down"), breakwater_api::redis::pool("redis://127.0.0.1:1", false).expect("url"));
    for _ in 0..5 {
        rt.block_on(down.check(tenant, user, ip));
    }
    assert!(down.is_degraded());
    group.bench_function("in_process_fallback", |b| b.iter(|| rt.block_on(down.check(tenant, user, ip))));
    group.finish();

    let mut group = c.benchmark_group("throttle_refused_ahead");
    group.bench_function("no_door", |b| b.iter(|| down.refused_ahead(tenant, user, ip)));
    // A tenant refused under a plan of one request a second gets a door; its plan then grows
    // past anything the benchmark can send, and the bucket's next answer gives the door that
    // room: every look passes the door and charges it.
    let door =
        Throttles::new(settings("bench-door"), breakwater_api::redis::pool("redis://127.0.0.1:1", false).expect("url"));
    let refused = TenantId(Uuid::now_v7());
    door.set_overrides([(refused, Limit { rate_per_sec: 1.0, burst: 1 })]);
    for _ in 0..5 {
        rt.block_on(door.check(refused, user, ip));
    }
    assert!(door.refused_ahead(refused, user, ip).is_some(), "the tenant has a door that refuses");
    door.set_overrides([(refused, Limit { rate_per_sec: 1e6, burst: u32::MAX })]);
    std::thread::sleep(Duration::from_millis(1100));
    rt.block_on(door.check(refused, user, ip));
    assert!(door.refused_ahead(refused, user, ip).is_none(), "the door lets the tenant through");
    group.bench_function("through_a_door", |b| b.iter(|| door.refused_ahead(refused, user, ip)));
    assert!(door.refused_ahead(refused, user, ip).is_none(), "the door never refused during the benchmark");
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
