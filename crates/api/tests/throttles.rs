//! Throttles shared through Redis, their fallback, and the database bulkhead.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use breakwater_domain::tenants;
use common::{lock_contacts, spawn_with, tenant};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

/// The Load Lab report's arithmetic: a client with rate r and burst b hammering for t seconds is
/// admitted exactly b + floor(r * t) times, here across two API processes sharing one Redis.
/// The app, with refusal pacing off: these tests count what the buckets admit to a caller that
/// spins on its refusals, and the pacer (`breakwater_admission::RetryPacing`, tested in
/// `hostile_clients.rs`) would hold that caller's refusals until their `Retry-After`.
async fn spawn_unheld(pool: PgPool, extra: &[&str]) -> common::TestApp {
    let mut args = extra.to_vec();
    args.extend(["--retry-hold-max-ms", "0"]);
    spawn_with(pool, &args).await
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn two_processes_share_one_bucket_exactly(pool: PgPool) {
    let prefix = format!("test-{}", uuid::Uuid::now_v7());
    let args = ["--throttle-tenant-rate", "5", "--throttle-tenant-burst", "3", "--throttle-key-prefix", &prefix];
    let a = spawn_unheld(pool.clone(), &args).await;
    let b = spawn_unheld(pool.clone(), &args).await;
    let t = tenant(&pool, "Hammer").await;

    let started = Instant::now();
    let duration = Duration::from_millis(2_000);
    let (mut admitted, mut refused) = (0u64, 0u64);
    let mut last_retry_after = None;
    let mut i = 0u64;
    while started.elapsed() < duration {
        let app = if i.is_multiple_of(2) { &a } else { &b };
        i += 1;
        let r = app.get("/v1/contacts?limit=1", &t.token).await;
        match r.status {
            StatusCode::OK => {
                admitted += 1;
                assert!(r.headers.contains_key("ratelimit-policy") && r.headers.contains_key("ratelimit"));
            }
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert_eq!(r.code(), "rate_limited");
                assert_eq!(r.body["error"]["recovery"]["retryable"], true);
                let retry: u64 = r.headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
                assert!(retry >= 1);
                assert_eq!(r.body["error"]["recovery"]["retry_after_seconds"], retry);
                assert!(r.headers["ratelimit"].to_str().expect("ascii").contains("\"tenant\";r=0"));
                last_retry_after = Some(retry);
            }
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let expected = 3 + u64::try_from(started.elapsed().as_millis() * 5 / 1000).expect("small");
    assert!(refused > 0, "the hammer was never refused");
    assert!(admitted.abs_diff(expected) <= 1, "admitted {admitted} in {elapsed:.2}s, expected {expected} (±1)");

    // A retry after Retry-After seconds is admitted.
    tokio::time::sleep(Duration::from_secs(last_retry_after.expect("refused at least once"))).await;
    assert_eq!(a.get("/v1/contacts?limit=1", &t.token).await.status, StatusCode::OK);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn one_tenant_exhausting_its_bucket_leaves_another_alone(pool: PgPool) {
    let app = spawn_unheld(pool.clone(), &[]).await;
    let noisy = tenant(&pool, "Noisy").await;
    let quiet = tenant(&pool, "Quiet").await;
    // The noisy tenant's plan: 1 request per second, 2 at once.
    tenants::set_throttle_override(&pool, noisy.id, Some((1.0, 2))).await.expect("override");
    app.running.state.throttles.refresh_overrides(&pool).await.expect("refresh");

    let statuses: Vec<StatusCode> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(app.get("/v1/contacts", &noisy.token).await.status);
        }
        v
    };
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(), 3, "{statuses:?}");
    for _ in 0..5 {
        assert_eq!(app.get("/v1/contacts", &quiet.token).await.status, StatusCode::OK);
    }
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["throttles"]["refused"]["tenant"], 3);
    assert_eq!(status.body["layers"]["throttles"]["tenant_overrides"], 1);

    // The same figures on /metrics; a deliberate 429 counts as refused, not as an error. The
    // first 429 came from Redis inside the routed request; the bucket's door refused the
    // next two, which were answered before admission and routing (counted by the throttles only).
    let metrics = app.send(app.http.get(app.ops_url("/metrics"))).await.text;
    for line in [
        r#"breakwater_http_requests_total{route="/v1/contacts",method="GET",outcome="refused"} 1"#,
        r#"breakwater_http_requests_total{route="/v1/contacts",method="GET",outcome="ok"} 7"#,
        r#"breakwater_throttle_refused_total{kind="tenant"} 3"#,
        "breakwater_throttle_refused_ahead_total 2",
        "breakwater_bulkhead_slots 10",
        "breakwater_throttle_degraded 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in:\n{metrics}");
    }
    assert!(!metrics.contains(r#"outcome="error""#), "{metrics}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_forged_forwarded_for_does_not_choose_the_ip_bucket(pool: PgPool) {
    let limits = ["--throttle-ip-rate", "0.5", "--throttle-ip-burst", "2"];
    let app = spawn_unheld(pool.clone(), &limits).await;
    let t = tenant(&pool, "Acme").await;
    let mut statuses = Vec::new();
    for i in 0..4 {
        let req = app
            .http
            .get(app.url("/v1/contacts"))
            .bearer_auth(&t.token)
            .header("x-forwarded-for", format!("203.0.113.{i}"));
        statuses.push(app.send(req).await.status);
    }
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS]
    );

    // Behind one trusted proxy, the address it saw is the bucket.
    let mut args = limits.to_vec();
    args.extend(["--trusted-proxies", "1"]);
    let behind = spawn_unheld(pool.clone(), &args).await;
    for i in 0..4 {
        let req = behind
            .http
            .get(behind.url("/v1/contacts"))
            .bearer_auth(&t.token)
            .header("x-forwarded-for", format!("6.6.6.6, 198.51.100.{}", 10 + i));
        assert_eq!(behind.send(req).await.status, StatusCode::OK);
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn an_ipv6_network_is_one_bucket_however_many_addresses_it_uses(pool: PgPool) {
    let args = ["--throttle-ip-rate", "0.5", "--throttle-ip-burst", "2", "--trusted-proxies", "1"];
    let app = spawn_unheld(pool.clone(), &args).await;
    let t = tenant(&pool, "Acme").await;
    let from =
        |client: String| app.http.get(app.url("/v1/contacts")).bearer_auth(&t.token).header("x-forwarded-for", client);
    // Four addresses of one /64: one bucket of two.
    let mut statuses = Vec::new();
    for host in [":1", ":2", "dead:beef:0:1", "ffff:ffff:ffff:ffff"] {
        statuses.push(app.send(from(format!("2001:db8:1:2:{host}"))).await.status);
    }
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS],
        "the addresses of one /64 share a bucket"
    );
    // The next /64 is another network.
    assert_eq!(app.send(from("2001:db8:1:3::1".to_owned())).await.status, StatusCode::OK);
    // An IPv4-mapped address is its IPv4 address's bucket.
    assert_eq!(app.send(from("192.0.2.7".to_owned())).await.status, StatusCode::OK);
    assert_eq!(app.send(from("::ffff:192.0.2.7".to_owned())).await.status, StatusCode::OK);
    assert_eq!(app.send(from("192.0.2.7".to_owned())).await.status, StatusCode::TOO_MANY_REQUESTS);
}

/// A private Redis on its own port, so the test can stop and restart it.
struct PrivateRedis {
    port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { port, child: Some(child) }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn redis_stopping_degrades_to_in_process_limits_and_recovers(pool: PgPool) {
    let mut redis = PrivateRedis::start(free_port());
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let app = spawn_unheld(
        pool.clone(),
        &["--redis-url", &url, "--throttle-tenant-rate", "1000", "--throttle-api-tasks", "2"],
    )
    .await;
    let t = tenant(&pool, "Acme").await;
    let status = || async { app.ops("/v1/ops/status").await.body["layers"]["throttles"].clone() };

    for _ in 0..5 {
        assert_eq!(app.get("/v1/contacts", &t.token).await.status, StatusCode::OK);
    }
    assert_eq!(status().await["state"], "ok");

    redis.kill();
    let started = Instant::now();
    for _ in 0..30 {
        let r = app.get("/v1/contacts", &t.token).await;
        assert_eq!(r.status, StatusCode::OK, "Redis down must not fail requests: {}", r.text);
    }
    assert!(started.elapsed() < Duration::from_secs(5), "requests slowed down: {:?}", started.elapsed());
    let s = status().await;
    assert_eq!(s["state"], "degraded");
    assert!(s["fallback_checks"].as_u64().expect("count") > 0);
    assert_eq!(s["breaker_opens"], 1);
    let r = app.ops("/ready").await;
    assert_eq!(
        (r.status, r.body["redis"].as_str()),
        (StatusCode::OK, Some("unreachable")),
        "readiness does not need Redis"
    );

    let _redis = PrivateRedis::start(redis.port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(app.get("/v1/contacts", &t.token).await.status, StatusCode::OK);
        if status().await["state"] == "ok" {
            break;
        }
        assert!(Instant::now() < deadline, "throttles did not recover after Redis returned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Redis that stops answering (its process stopped: connections stay open, nothing comes
/// back) costs no request more than the throttles' budget, and once it answers again the
/// throttles return to it: the breaker leaves the silent connection behind and its probe
/// connects afresh.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_redis_that_stops_answering_is_left_behind_and_found_again(pool: PgPool) {
    let redis = PrivateRedis::start(free_port());
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let app = spawn_unheld(pool.clone(), &["--redis-url", &url, "--throttle-tenant-rate", "1000"]).await;
    let t = tenant(&pool, "Acme").await;
    let status = || async { app.ops("/v1/ops/status").await.body["layers"]["throttles"].clone() };
    assert_eq!(app.get("/v1/contacts", &t.token).await.status, StatusCode::OK);
    assert_eq!(status().await["state"], "ok");
    let pid = redis.child.as_ref().expect("running").id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().expect("kill").success();
        assert!(ok, "kill {sig} {pid}");
    };

    signal("-STOP");
    let started = Instant::now();
    for _ in 0..30 {
        let r = app.get("/v1/contacts", &t.token).await;
        assert_eq!(r.status, StatusCode::OK, "a silent Redis must not fail requests: {}", r.text);
    }
    assert!(started.elapsed() < Duration::from_secs(5), "requests waited on the silent Redis: {:?}", started.elapsed());
    assert_eq!(status().await["state"], "degraded");

    signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(app.get("/v1/contacts", &t.token).await.status, StatusCode::OK);
        if status().await["state"] == "ok" {
            break;
        }
        assert!(Instant::now() < deadline, "throttles did not return to Redis once it answered again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A private three-shard Redis Cluster (no replicas), torn down when dropped.
struct PrivateCluster {
    ports: Vec<u16>,
    nodes: Vec<Child>,
    dir: std::path::PathBuf,
}

impl PrivateCluster {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("breakwater-cluster-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut nodes = Vec::new();
        for p in &ports {
            let conf = dir.join(format!("nodes-{p}.conf"));
            nodes.push(
                Command::new("redis-server")
                    .args(["--port", &p.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                    .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                    .arg(&conf)
                    .arg("--dir")
                    .arg(&dir)
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("redis-server is installed"),
            );
        }
        let cluster = Self { ports, nodes, dir };
        let deadline = Instant::now() + Duration::from_secs(5);
        for p in &cluster.ports {
            while std::net::TcpStream::connect(("127.0.0.1", *p)).is_err() {
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let addrs: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        for p in &cluster.ports {
            loop {
                let info = Command::new("redis-cli").args(["-p", &p.to_string(), "cluster", "info"]).output();
                if info.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok")) {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster did not become ok");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        cluster
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// With `REDIS_CLUSTER=true` the throttles run on a Redis Cluster: a tenant's buckets in one
/// slot, its client's IP bucket in another (a pipeline across slots is refused by a cluster),
/// and two processes still share the bucket exactly.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_redis_cluster_holds_the_shared_bucket_exactly(pool: PgPool) {
    let cluster = PrivateCluster::start();
    let seeds = cluster.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let prefix = format!("test-{}", uuid::Uuid::now_v7());
    let args = [
        "--redis-url",
        &seeds,
        "--redis-cluster",
        "true",
        "--throttle-tenant-rate",
        "5",
        "--throttle-tenant-burst",
        "3",
        "--throttle-key-prefix",
        &prefix,
    ];
    let a = spawn_unheld(pool.clone(), &args).await;
    let b = spawn_unheld(pool.clone(), &args).await;
    let hammer = tenant(&pool, "Cluster Hammer").await;
    let mut others = Vec::new();
    for i in 0..6 {
        others.push(tenant(&pool, &format!("Cluster {i}")).await);
    }

    let started = Instant::now();
    let (mut admitted, mut refused) = (0u64, 0u64);
    let mut i = 0u64;
    while started.elapsed() < Duration::from_millis(2_000) {
        let app = if i.is_multiple_of(2) { &a } else { &b };
        i += 1;
        match app.get("/v1/contacts?limit=1", &hammer.token).await.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let expected = 3 + u64::try_from(started.elapsed().as_millis() * 5 / 1000).expect("small");
    assert!(refused > 0, "the hammer was never refused");
    assert!(admitted.abs_diff(expected) <= 1, "admitted {admitted}, expected {expected} (±1)");
    // Tenants hashed over the shards are each served from their own buckets.
    for t in &others {
        assert_eq!(a.get("/v1/contacts?limit=1", &t.token).await.status, StatusCode::OK);
    }
    for app in [&a, &b] {
        let s = app.ops("/v1/ops/status").await.body["layers"]["throttles"].clone();
        assert_eq!(s["state"], "ok", "{s}");
        assert_eq!((s["fallback_checks"].as_u64(), s["redis_errors"].as_u64()), (Some(0), Some(0)), "{s}");
    }
    let keys = cluster
        .ports
        .iter()
        .filter(|p| {
            let out = Command::new("redis-cli").args(["-p", &p.to_string(), "dbsize"]).output().expect("redis-cli");
            String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap_or(0) > 0
        })
        .count();
    assert!(keys >= 2, "the buckets should spread over the shards; {keys} of 3 hold keys");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_fallback_divides_the_limit_by_the_task_count(pool: PgPool) {
    // No Redis at all: the in-process bucket holds burst 6 / 3 tasks = 2.
    let app = spawn_unheld(
        pool.clone(),
        &[
            "--redis-url",
            "redis://127.0.0.1:1",
            "--throttle-tenant-rate",
            "0.1",
            "--throttle-tenant-burst",
            "6",
            "--throttle-api-tasks",
            "3",
        ],
    )
    .await;
    let t = tenant(&pool, "Acme").await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(app.get("/v1/contacts", &t.token).await.status);
    }
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS]
    );
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn pool_exhaustion_is_a_fast_503_not_a_timeout(pool: PgPool) {
    let app = spawn_unheld(pool.clone(), &["--db-pool-size", "2", "--db-acquire-timeout-ms", "100"]).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let bob = t.contact(&app, "Bob", "bob@example.com").await;

    // Two slow requests: each waits on a row lock, holding its slot and connection.
    let blocker = lock_contacts(&pool, &[ann, bob]).await;
    let slow: Vec<_> = [ann, bob].into_iter().map(|id| common::erase_in_background(&app, &t.token, id)).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let r = app.get("/v1/contacts", &t.token).await;
    let took = started.elapsed();
    assert_eq!((r.status, r.code()), (StatusCode::SERVICE_UNAVAILABLE, "db_saturated"), "{}", r.text);
    assert!(r.headers.contains_key("retry-after"));
    assert!(took < Duration::from_millis(1000), "refusal took {took:?}");
    let status = app.ops("/v1/ops/status").await;
    let bulkhead = &status.body["layers"]["bulkhead"];
    assert_eq!((bulkhead["size"].as_u64(), bulkhead["in_use"].as_u64()), (Some(2), Some(2)), "{bulkhead}");
    assert!(bulkhead["acquire_timeouts"].as_u64().expect("count") >= 1);
    // Health and ops never wait for the database's slots.
    assert_eq!(app.call(reqwest::Method::GET, "/health", None, None).await.status, StatusCode::OK);

    blocker.rollback().await.expect("release");
    for task in slow {
        assert_eq!(task.await.expect("task").expect("response"), StatusCode::ACCEPTED);
    }
    assert_eq!(app.post("/v1/contacts", &t.token, json!({"name": "after"})).await.status, StatusCode::CREATED);
}

/// Who is refused first: a tenant over its own limit hears 429 `rate_limited`, not the 503 of a
/// full service, even while admission has no room; and another tenant is served once there is.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_tenant_over_its_throttle_hears_429_before_admission_and_another_tenant_is_served(pool: PgPool) {
    // One admission slot per class and no queue; the flooding tenant's bucket admits one request
    // and then one every ten seconds.
    let app = spawn_unheld(
        pool.clone(),
        &["--admission", "static", "--admission-static-limit", "1", "--admission-queue", "0"],
    )
    .await;
    let flooder = tenant(&pool, "Flood").await;
    let quiet = tenant(&pool, "Quiet").await;
    let third = tenant(&pool, "Third").await;
    tenants::set_throttle_override(&pool, flooder.id, Some((0.1, 1))).await.expect("override");
    app.running.state.throttles.refresh_overrides(&pool).await.expect("refresh");
    let ann = quiet.contact(&app, "Ann", "ann@example.com").await;
    let path = "/v1/conversations?status=open";
    assert_eq!(app.get(path, &flooder.token).await.status, StatusCode::OK, "the burst");
    let over = app.get(path, &flooder.token).await;
    assert_eq!((over.status, over.code()), (StatusCode::TOO_MANY_REQUESTS, "rate_limited"), "{}", over.text);

    // Another tenant's slow request takes the default class's only slot.
    let blocker = common::lock_contacts(&pool, &[ann]).await;
    let slow = common::erase_in_background(&app, &quiet.token, ann);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let full = app.get(&format!("/v1/contacts/{ann}"), &third.token).await;
    assert_eq!((full.status, full.code()), (StatusCode::SERVICE_UNAVAILABLE, "load_shed"), "the class is full");

    // The flooder, on the same full class, is told it is over its limit: answered before
    // admission, with the RateLimit headers and a Retry-After within its bucket's ten seconds.
    for _ in 0..20 {
        let r = app.get(&format!("/v1/contacts/{ann}"), &flooder.token).await;
        assert_eq!((r.status, r.code()), (StatusCode::TOO_MANY_REQUESTS, "rate_limited"), "{}", r.text);
        let retry: u64 = r.headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
        assert!((1..=10).contains(&retry), "Retry-After {retry}");
        assert!(r.headers["ratelimit"].to_str().expect("ascii").contains("\"tenant\";r=0"));
    }
    drop(blocker);
    assert_eq!(slow.await.expect("joined").expect("sent"), StatusCode::ACCEPTED);
    assert_eq!(app.get(path, &third.token).await.status, StatusCode::OK, "the other tenant is served");

    let status = app.ops("/v1/ops/status").await;
    let throttles = &status.body["layers"]["throttles"];
    assert_eq!(throttles["refused"]["tenant"], 21, "{}", status.text);
    assert_eq!(throttles["refused_ahead"], 20, "every refusal after the first is answered ahead: {}", status.text);
    let shed = &status.body["layers"]["capacity"]["shed"];
    assert_eq!(shed["queue_full"], 1, "admission refused only the third tenant: {}", status.text);
}
