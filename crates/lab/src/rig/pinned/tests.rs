//! Parsing the limits, and live runs in a scratch group (skipped without root and cgroups).

use std::process::ExitStatus;

use super::*;

#[test]
fn cpus_parse_exactly() {
    assert_eq!(parse_cpus("0.25"), Ok(Millicores(250)));
    assert_eq!(parse_cpus("1"), Ok(Millicores(1000)));
    assert_eq!(parse_cpus("1.5"), Ok(Millicores(1500)));
    assert_eq!(parse_cpus(".5"), Ok(Millicores(500)));
    assert_eq!(parse_cpus("0.125"), Ok(Millicores(125)));
    for bad in ["", ".", "0", "0.0", "-1", "0.1255", "a", "1e3", "0.2x"] {
        assert!(parse_cpus(bad).is_err(), "{bad} should not parse");
    }
    assert_eq!(Millicores(250).to_string(), "0.25");
    assert_eq!(Millicores(2000).to_string(), "2");
}

#[test]
fn sizes_parse_in_binary_units() {
    assert_eq!(parse_bytes("512M"), Ok(512 << 20));
    assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
    assert_eq!(parse_bytes("1g"), Ok(1 << 30));
    assert_eq!(parse_bytes("2048k"), Ok(2 << 20));
    assert_eq!(parse_bytes("536870912"), Ok(536_870_912));
    for bad in ["", "M", "12", "1T", "-5M", "1.5G", "99999999999999999999G"] {
        assert!(parse_bytes(bad).is_err(), "{bad} should not parse");
    }
}

#[test]
fn the_quota_is_the_period_times_the_cores() {
    let l = Limits::new(Millicores(250), 100_000, 512 << 20).expect("valid");
    assert_eq!((l.quota_us, l.period_us, l.memory_bytes), (25_000, 100_000, 512 << 20));
    let l = Limits::new(Millicores(1500), 50_000, (1 << 20) + 100).expect("valid");
    assert_eq!((l.quota_us, l.memory_bytes), (75_000, 1 << 20), "whole pages");
    assert!(Limits::new(Millicores(5), 100_000, 1 << 20).is_err(), "0.5 ms is below the kernel minimum");
    assert!(Limits::new(Millicores(250), 500, 1 << 20).is_err(), "period too short");
}

/// Needs root and a cgroup filesystem; says why and passes otherwise.
fn live() -> Option<()> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: the pinned integration check needs root");
        return None;
    }
    let mounts = parse_mounts(&std::fs::read_to_string("/proc/self/mounts").unwrap_or_default());
    if mounts.unified.is_none() && (mounts.cpu.is_none() || mounts.memory.is_none()) {
        eprintln!("skipped: no cgroup filesystem with cpu and memory controllers");
        return None;
    }
    Some(())
}

fn run_pinned(limits: Limits, script: &str) -> (ExitStatus, Stats, Duration) {
    let pinned = match Pinned::create(limits) {
        Ok(p) => p,
        Err(e) => panic!("creating the cgroup: {e:#}"),
    };
    let dir = pinned.cpu.clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let argv: Vec<OsString> = ["sh", "-c", script].into_iter().map(OsString::from).collect();
    let started = Instant::now();
    let status = rt.block_on(async { pinned.command(&argv).expect("command").status().await }).expect("runs");
    let stats = pinned.stats();
    drop(pinned);
    assert!(!dir.exists(), "the cgroup is removed at the end");
    (status, stats, started.elapsed())
}

#[test]
fn a_busy_loop_is_held_to_its_quota() {
    if live().is_none() {
        return;
    }
    let limits = Limits::new(Millicores(250), 100_000, 64 << 20).expect("valid");
    let (status, stats, elapsed) = run_pinned(limits, "timeout 1 sh -c 'while :; do :; done'; true");
    assert!(status.success(), "{status}");
    assert!(stats.nr_periods >= 5, "{stats:?}");
    assert!(stats.throttled_ratio() > 0.5, "a busy loop at 0.25 core is throttled most periods: {stats:?}");
    if let Some(usage) = stats.usage_us {
        let cores = usage as f64 / elapsed.as_micros() as f64;
        assert!(cores < 0.4, "used {cores:.2} cores under a 0.25 quota");
    }
}

#[test]
fn a_memory_hog_is_stopped_at_the_limit() {
    if live().is_none() {
        return;
    }
    let limits = Limits::new(Millicores(1000), 100_000, 32 << 20).expect("valid");
    // `tail` keeps a line in memory until its end: 128 MiB without a newline.
    let (status, stats, _) = run_pinned(limits, "head -c 134217728 /dev/zero | tail -n 1 > /dev/null");
    assert!(!status.success(), "the hog must not complete under 32 MiB: {status}, {stats:?}");
    assert!(stats.peak_bytes.is_none_or(|p| p <= 32 << 20), "{stats:?}");
    let stopped = stats.oom_kills.unwrap_or(1) > 0 || stats.limit_hits.unwrap_or(1) > 0;
    assert!(stopped, "the kernel reports the limit at work: {stats:?}");
}
