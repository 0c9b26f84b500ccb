//! The load lab against an in-process server of known behaviour.

mod common;

use std::time::Duration;

use breakwater_loadlab::analysis::AnalysisConfig;
use breakwater_loadlab::profiles::ProfilesFile;
use breakwater_loadlab::report::Report;
use breakwater_loadlab::retry::RetryPolicy;
use breakwater_loadlab::runs::{self, ProfileConfig, RampConfig, RunError, Sampling, SweepConfig, UrlSteps};
use breakwater_loadlab::tokens::{DEV_SECRET, TokenLine, Tokens};
use breakwater_loadlab::{EngineConfig, compare, html};

/// Timing tests run one at a time: on a small machine, parallel tests steal each other's CPU
/// and the generator's own audit (rightly) marks steps invalid.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SERVICE: Duration = Duration::from_millis(4); // a single worker: 250 req/s

fn ramp_cfg(urls: Vec<String>, rates: Vec<f64>, step: Duration) -> RampConfig {
    RampConfig {
        run: UrlSteps {
            urls,
            body: None,
            step,
            pause: Duration::from_millis(300),
            // Tests share a small machine with each other and with builds: a generous send-lag
            // bound keeps the audit from flagging scheduler noise. The accuracy figures measured
            // on a quiet machine are in docs/PERFORMANCE.md.
            engine: EngineConfig { max_send_lag_ms: 50.0, ..EngineConfig::default() },
            sampling: Sampling::default(),
        },
        rates,
        analysis: AnalysisConfig {
            slo_p99_ms: 50.0,
            // The knee here is a jump from ~5 ms to ~200 ms; a 25 ms floor keeps scheduler
            // noise on a shared machine from passing for one.
            knee_min_rise_ms: 25.0,
            ..AnalysisConfig::default()
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ramp_finds_saturation_within_5_percent_and_the_knee_at_the_right_step() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let mut cfg = ramp_cfg(vec![srv.url("/queue")], vec![100.0, 150.0, 200.0, 300.0, 400.0], Duration::from_secs(1));
    cfg.run.sampling =
        Sampling { ops_url: Some(srv.url("/v1/ops/status")), pid: None, interval: Duration::from_millis(200) };
    // What this test checks is the analysis of a valid measurement. A step the generator's own
    // audit marks invalid (it fell behind its schedule: a busy CI machine) is left out of the
    // analysis, which moves the knee; such a run measured nothing, so it is run again, at most
    // three times, and a machine that never gives a valid run fails the audit assertion below.
    let mut report = runs::ramp(&cfg, Tokens::none(), None).await;
    eprintln!("{}", report.table());
    for _ in 1..3 {
        if report.steps.iter().all(|s| s.audit.valid) {
            break;
        }
        eprintln!("the generator's audit marked a step invalid: measuring again");
        report = runs::ramp(&cfg, Tokens::none(), None).await;
        eprintln!("{}", report.table());
    }
    assert!(report.steps.iter().all(|s| s.audit.valid), "the generator was never the limit");
    let a = report.analysis.as_ref().expect("analysis");

    let sat = a.saturation.as_ref().expect("saturation found");
    let truth = 1.0 / SERVICE.as_secs_f64();
    assert!((sat.throughput_rps - truth).abs() / truth < 0.05, "saturation {} vs {truth}", sat.throughput_rps);
    assert_eq!(sat.offered_rps, 300.0, "achieved stops tracking offered at the first step past capacity");

    let knee = a.knee.as_ref().expect("knee found");
    assert_eq!(knee.offered_rps, 300.0, "the p99 rises at the first step past capacity");
    assert_eq!(knee.last_flat_rps, Some(200.0));

    let cap = a.capacity.as_ref().expect("capacity found");
    assert_eq!(cap.max_ok_rps, 200.0);
    assert!((cap.capacity_rps - 140.0).abs() < 1e-9);

    // At low rates achieved equals offered and latency is the service time.
    let first = &report.steps[0];
    assert!((first.goodput_rps - 100.0).abs() < 3.0, "{}", first.goodput_rps);
    assert!(first.ok.corrected.p50_ms >= 4.0 && first.ok.corrected.p50_ms < 8.0, "{}", first.ok.corrected.p50_ms);
    // Server-side samples were taken per step, and the evidence names the full admission limit.
    assert!(!report.samples.is_empty());
    assert!(report.steps[4].server.contains_key("capacity.queue_depth"));
    assert!(a.what_saturated.iter().any(|e| e.contains("capacity.in_flight")), "{:?}", a.what_saturated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrected_latencies_reflect_a_1s_stall_and_uncorrected_ones_do_not() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    // One connection's worth of in-flight, as wrk's closed connections: during the stall the
    // schedule keeps running but nothing can be sent.
    let mut cfg = ramp_cfg(vec![srv.url("/stall")], vec![100.0], Duration::from_secs(2));
    cfg.run.engine.max_in_flight = Some(1);
    let report = runs::ramp(&cfg, Tokens::none(), None).await;
    let s = &report.steps[0];
    eprintln!("{}", report.table());
    assert_eq!(s.ok.count, 200);
    assert!(s.ok.corrected.p99_ms > 500.0, "corrected p99 {}", s.ok.corrected.p99_ms);
    assert!(s.ok.corrected.p95_ms > 200.0, "corrected p95 {}", s.ok.corrected.p95_ms);
    assert!(s.ok.uncorrected.p99_ms < 100.0, "uncorrected p99 {}", s.ok.uncorrected.p99_ms);
    assert!(s.ok.uncorrected.max_ms >= 990.0, "the stalled request itself");
    // The self-audit says the generator's cap, not the server, shaped this step.
    assert!(!s.audit.valid);
    assert!(s.audit.reasons.iter().any(|r| r.contains("in-flight cap 1")), "{:?}", s.audit.reasons);
    assert!(s.audit.littles_law.hidden_queueing.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_errors_are_counted_apart() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let report =
        runs::ramp(&ramp_cfg(vec![srv.url("/mixed")], vec![200.0], Duration::from_millis(500)), Tokens::none(), None)
            .await;
    let s = &report.steps[0];
    assert_eq!(s.sent, 100);
    assert_eq!(s.ok.count, 20);
    assert_eq!(s.refused.stats.count, 40);
    assert_eq!(s.refused.by_code.get("load_shed"), Some(&20));
    assert_eq!(s.refused.by_code.get("rate_limited"), Some(&20));
    assert_eq!(s.refused.retry_after_seen, 40);
    assert_eq!(s.errors.stats.count, 40);
    assert_eq!(s.errors.by_kind.get("status_500"), Some(&20));
    assert_eq!(s.errors.by_kind.get("unparseable_body"), Some(&20));
    assert!((s.refused_share - 0.4).abs() < 1e-9 && (s.error_share - 0.4).abs() < 1e-9);

    // A timeout is an error, never a refusal.
    let mut cfg = ramp_cfg(vec![srv.url("/slow")], vec![20.0], Duration::from_millis(500));
    cfg.run.engine.timeout = Duration::from_millis(200);
    let report = runs::ramp(&cfg, Tokens::none(), None).await;
    let s = &report.steps[0];
    assert_eq!(s.errors.by_kind.get("timeout"), Some(&10));
    assert_eq!(s.refused.stats.count, 0);

    // Several URLs go round-robin: half of these hit /fast, half /mixed.
    let report = runs::ramp(
        &ramp_cfg(vec![srv.url("/fast"), srv.url("/mixed")], vec![200.0], Duration::from_millis(500)),
        Tokens::none(),
        None,
    )
    .await;
    let s = &report.steps[0];
    assert_eq!((s.ok.count, s.refused.stats.count, s.errors.stats.count), (60, 20, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closed_loop_sweep_shows_queueing_behind_a_single_worker() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let cfg = SweepConfig {
        run: UrlSteps {
            urls: vec![srv.url("/queue")],
            body: None,
            step: Duration::from_millis(600),
            pause: Duration::from_millis(100),
            engine: EngineConfig::default(),
            sampling: Sampling::default(),
        },
        concurrency: vec![1, 4],
    };
    let report = runs::sweep(&cfg, Tokens::none(), None).await;
    let (one, four) = (&report.steps[0], &report.steps[1]);
    // Single worker: more callers add no throughput, only waiting.
    assert!(four.goodput_rps > 200.0 && four.goodput_rps < 260.0, "{}", four.goodput_rps);
    assert!(
        four.ok.corrected.p50_ms > 2.0 * one.ok.corrected.p50_ms,
        "{} vs {}",
        four.ok.corrected.p50_ms,
        one.ok.corrected.p50_ms
    );
    assert_eq!(four.concurrency, Some(4));
}

/// An honouring caller told to wait longer than the step lasts is cut off at the step's end and
/// counted apart: the step ends on time instead of waiting out the longest `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_that_outlasts_the_step_cuts_the_request_off_at_its_end() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let cfg = SweepConfig {
        run: UrlSteps {
            urls: vec![srv.url("/shed_long")],
            body: None,
            step: Duration::from_millis(500),
            pause: Duration::from_millis(0),
            engine: EngineConfig { honour: Some(RetryPolicy::default()), ..EngineConfig::default() },
            sampling: Sampling::default(),
        },
        concurrency: vec![4],
    };
    let started = std::time::Instant::now();
    let report = runs::sweep(&cfg, Tokens::none(), None).await;
    let s = &report.steps[0];
    let logical = s.logical.as_ref().expect("an honouring population reports its logical requests");
    assert!(started.elapsed() < Duration::from_secs(5), "the step waited out Retry-After: {:?}", started.elapsed());
    assert_eq!(s.refused.stats.count, 4, "each caller's first attempt is refused");
    assert_eq!((logical.cut_off, logical.requests, logical.succeeded), (4, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_closed_loop_caller_is_one_client_with_its_own_connection_and_token() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let lines = (0..20)
        .map(|i| TokenLine {
            tenant_id: format!("00000000-0000-0000-0000-0000000000{i:02}"),
            user_id: format!("10000000-0000-0000-0000-0000000000{i:02}"),
            token: None,
            weight: 1.0,
        })
        .collect();
    let tokens = Tokens::from_lines(lines, "secret").expect("tokens");
    let cfg = SweepConfig {
        run: UrlSteps {
            urls: vec![srv.url("/whoami")],
            body: None,
            step: Duration::from_millis(300),
            pause: Duration::from_millis(0),
            engine: EngineConfig::default(),
            sampling: Sampling::default(),
        },
        concurrency: vec![8],
    };
    let report = runs::sweep(&cfg, tokens, None).await;
    assert!(report.steps[0].ok.count > 80, "{}", report.steps[0].ok.count);
    let seen = srv.state.seen.lock().expect("lock");
    // A caller's requests all travel on its own connection, with its own token: eight
    // connections, one token each (with a shared pool and a token per request, each connection
    // carried many of the twenty tokens).
    assert_eq!(seen.len(), 8, "{seen:?}");
    assert!(seen.values().all(|t| t.len() == 1), "{seen:?}");
    assert_eq!(report.steps[0].audit.connections_opened, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_with_a_body_posts_it_as_json_to_every_url() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let cfg = SweepConfig {
        run: UrlSteps {
            // `/echo` takes only a POST whose JSON has a `body`: a GET is 405, anything else 4xx.
            urls: vec![srv.url("/echo")],
            body: Some(r#"{"body":"hello"}"#.into()),
            step: Duration::from_millis(300),
            pause: Duration::from_millis(0),
            engine: EngineConfig::default(),
            sampling: Sampling::default(),
        },
        concurrency: vec![2],
    };
    let report = runs::sweep(&cfg, Tokens::none(), None).await;
    let s = &report.steps[0];
    assert!(s.ok.count > 10, "{}", s.ok.count);
    assert_eq!(s.errors.stats.count, 0, "{:?}", s.errors);
    assert_eq!(report.config["body"], r#"{"body":"hello"}"#, "the report names what was sent");
}

fn profile_cfg(base: &str, profiles: &str) -> ProfileConfig {
    ProfileConfig {
        ops_base: Some(base.to_owned()),
        base: base.to_owned(),
        profile: "quick".into(),
        profiles: ProfilesFile::parse(profiles).expect("profiles"),
        capacity_rps: Some(100.0),
        time_scale: 1.0,
        engine: EngineConfig::default(),
        analysis: AnalysisConfig::default(),
        sampling: Sampling {
            ops_url: Some(format!("{base}/v1/ops/status")),
            pid: Some(std::process::id()),
            interval: Duration::from_millis(200),
        },
        smoke: true,
    }
}

const QUICK: &str = r#"
[defaults]
think_time = "20ms"
pause = "100ms"
arrivals = "constant"
[profiles.quick]
stages = [{ name = "a", duration = "800ms", rps = 40 }, { name = "b", duration = "800ms", capacity = 0.6 }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_runs_journeys_and_readers_for_many_tenants_after_a_smoke_stage() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let tokens = Tokens::synthetic(5, DEV_SECRET, 3).expect("tokens");
    let report = runs::profile(&profile_cfg(&srv.base(), QUICK), tokens, None).await.expect("profile runs");
    eprintln!("{}", report.table());
    assert!(report.smoke.as_ref().is_some_and(|s| s.passed));
    assert_eq!(report.steps.len(), 2);
    assert_eq!(report.steps[1].offered_rps, Some(60.0), "0.6 x capacity 100");
    let eps = &report.steps[0].endpoints;
    for e in ["inbox", "conversation", "messages", "reply", "status"] {
        assert!(eps.get(e).is_some_and(|s| s.ok > 0), "journey step {e} ran: {eps:?}");
    }
    assert!(report.steps.iter().all(|s| s.errors.stats.count == 0 && s.refused.stats.count == 0));
    assert_eq!(report.tenants.len(), 5);
    assert!(report.tenants[0].share > 0.35, "the heaviest tenant carries the skew: {}", report.tenants[0].share);
    assert!(report.fairness.is_some_and(|f| f > 0.99));
    assert!(
        report.samples.iter().any(|s| s.values.contains_key("pool.size") && s.values.contains_key("proc.rss_bytes"))
    );

    let page = html::render(&report);
    assert!(page.contains("<svg") && page.contains("Achieved vs offered") && page.contains("Smoke stage"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smoke_stage_honours_a_refusals_retry_after_and_gives_up_after_three() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    let tokens = Tokens::synthetic(1, DEV_SECRET, 3).expect("tokens");
    srv.state.refuse_lists.store(2, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    let ok = runs::smoke_only(&srv.base(), Some(&srv.base()), &tokens, Duration::from_secs(2)).await.expect("passes");
    assert!(ok.passed);
    assert!(started.elapsed() >= Duration::from_secs(2), "two refusals, each waited out: {:?}", started.elapsed());

    srv.state.refuse_lists.store(4, std::sync::atomic::Ordering::Relaxed);
    let err =
        runs::smoke_only(&srv.base(), Some(&srv.base()), &tokens, Duration::from_secs(2)).await.expect_err("refused");
    assert_eq!(err.step, "list inbox");
    assert!(err.reason.contains("status 503"), "{}", err.reason);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smoke_failure_stops_the_run_with_the_failing_step_named() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(SERVICE).await;
    srv.state.break_messages.store(true, std::sync::atomic::Ordering::Relaxed);
    let tokens = Tokens::synthetic(2, DEV_SECRET, 3).expect("tokens");
    let err = runs::profile(&profile_cfg(&srv.base(), QUICK), tokens, None).await.expect_err("smoke must fail");
    let RunError::Smoke(f) = err else { panic!("expected a smoke failure, got {err}") };
    assert_eq!(f.step, "read messages");
    assert!(f.reason.contains("status 500"), "{}", f.reason);
    assert!(f.to_string().contains("smoke failed at step 'read messages'"));
    // The steps before it passed and are in the report.
    assert!(f.report.steps.iter().any(|s| s.name == "open conversation" && s.ok));

    // Without tokens the API answers 401, and the smoke stage says where.
    srv.state.break_messages.store(false, std::sync::atomic::Ordering::Relaxed);
    let err = runs::smoke_only(&srv.base(), Some(&srv.base()), &Tokens::none(), Duration::from_secs(2))
        .await
        .expect_err("401");
    assert_eq!(err.step, "list inbox");
    assert!(err.reason.contains("status 401"));
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("loadlab-test-{}-{name}", std::process::id()))
}

fn scaled(r: &Report, latency: f64, throughput: f64) -> Report {
    let mut r = r.clone();
    for s in &mut r.steps {
        s.ok.corrected.p95_ms *= latency;
        s.ok.corrected.p99_ms *= latency;
        s.goodput_rps *= throughput;
    }
    if let Some(a) = r.analysis.as_mut() {
        if let Some(c) = a.capacity.as_mut() {
            c.capacity_rps *= throughput;
        }
        if let Some(s) = a.saturation.as_mut() {
            s.throughput_rps *= throughput;
        }
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compare_gate_fails_on_a_real_regression_and_passes_on_noise() {
    let _serial = SERIAL.lock().await;
    let srv = common::start(Duration::from_millis(10)).await;
    let mut cfg = ramp_cfg(vec![srv.url("/queue")], vec![50.0, 80.0, 120.0], Duration::from_millis(600));
    cfg.run.pause = Duration::from_millis(100);
    let base = runs::ramp(&cfg, Tokens::none(), None).await;
    assert!(base.analysis.as_ref().is_some_and(|a| a.capacity.is_some()), "{}", base.table());

    let t = compare::Thresholds::default();
    let noise = scaled(&base, 1.4, 0.85);
    assert!(compare::compare(&base, &noise, &t).passed(), "{}", compare::compare(&base, &noise, &t).table());
    let slower = scaled(&base, 2.5, 1.0);
    assert!(!compare::compare(&base, &slower, &t).passed());
    let smaller = scaled(&base, 1.0, 0.6);
    let c = compare::compare(&base, &smaller, &t);
    assert!(
        c.checks.iter().any(|c| c.what.starts_with("capacity") && c.verdict == compare::Verdict::Regression),
        "{}",
        c.table()
    );

    // The binary's exit code is the gate.
    let (b, n, s) = (temp("base.json"), temp("noise.json"), temp("slow.json"));
    base.write_json(&b).expect("write");
    noise.write_json(&n).expect("write");
    slower.write_json(&s).expect("write");
    let run = |cur: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_loadlab"))
            .arg("compare")
            .arg(&b)
            .arg(cur)
            .output()
            .expect("run loadlab")
    };
    let ok = run(&n);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    let bad = run(&s);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stdout).contains("REGRESSION"));
    for p in [b, n, s] {
        let _ = std::fs::remove_file(p);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_loop_keeps_its_rate_against_a_fast_server() {
    let _serial = SERIAL.lock().await;
    // A generous functional bound; the accuracy figures are in docs/PERFORMANCE.md.
    let srv = common::start(SERVICE).await;
    let report =
        runs::ramp(&ramp_cfg(vec![srv.url("/fast")], vec![500.0], Duration::from_secs(1)), Tokens::none(), None).await;
    let s = &report.steps[0];
    assert_eq!(s.sent, 500);
    assert!(s.achieved_rps > 350.0, "{}", s.achieved_rps);
    assert!(s.send_lag.p99_ms < 50.0, "{}", s.send_lag.p99_ms);
    assert!(s.audit.cpu_us_per_request.is_some_and(|c| c > 0.0));
    assert!(s.audit.connections_opened >= 1);
}
