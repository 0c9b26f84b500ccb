//! `cargo xtask pinned -- <command...>`: the command run in a fresh group at the given shape,
//! Ctrl-C, SIGTERM and SIGHUP forwarded to its process group, and the group's counters printed
//! at the end.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{Limits, Millicores, Pinned, Stats, mib, parse_bytes, parse_cpus};

/// Options of `cargo xtask pinned`.
#[derive(Debug, clap::Args)]
pub struct PinnedArgs {
    /// CPU quota in cores (decimal, up to three places): 0.25 is a Fargate task of 256 CPU units.
    #[arg(long, default_value = "0.25", value_parser = parse_cpus)]
    cpus: Millicores,
    /// Memory limit: bytes, or with a K, M or G suffix (binary units: 512M is 512 MiB). Swap is
    /// limited to nothing, as on Fargate.
    #[arg(long, default_value = "512M", value_parser = parse_bytes)]
    memory: u64,
    /// The CFS period in microseconds (the quota is this times `--cpus`).
    #[arg(long, default_value_t = 100_000)]
    period_us: u64,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Runs the command pinned, forwards signals, reports, cleans up, and exits with its status.
pub async fn run(args: PinnedArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let limits = Limits::new(args.cpus, args.period_us, args.memory)?;
    // Registered before anything exists, so that Ctrl-C from now on cleans up instead of killing.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let pinned = Pinned::create(limits)?;
    eprintln!("pinned: {}", pinned.describe());
    eprintln!("pinned: running {}", shell_words(&args.command));

    let started = Instant::now();
    let mut child = pinned.command(&args.command)?.spawn().context("starting the command")?;
    let group = child.id().and_then(|id| i32::try_from(id).ok()).and_then(rustix::process::Pid::from_raw);
    let forward = |sig: rustix::process::Signal, name: &str| {
        eprintln!("pinned: {name} received, forwarding it to the command");
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, sig);
        }
    };
    let status: ExitStatus = loop {
        tokio::select! {
            status = child.wait() => break status?,
            _ = sigint.recv() => forward(rustix::process::Signal::INT, "SIGINT"),
            _ = sigterm.recv() => forward(rustix::process::Signal::TERM, "SIGTERM"),
            _ = sighup.recv() => forward(rustix::process::Signal::HUP, "SIGHUP"),
        }
    };
    let elapsed = started.elapsed();
    let stats = pinned.stats();
    drop(pinned);
    eprintln!("{}", report(&stats, limits, elapsed, status));
    if status.code() == Some(125) {
        eprintln!("pinned: exit code 125 may mean the command could not join the cgroup");
    }
    // Exit as the command did (128 + signal when a signal ended it, as shells do).
    let code = status.code().or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s));
    std::process::exit(code.unwrap_or(1));
}

/// The end-of-run summary.
pub(crate) fn report(stats: &Stats, limits: Limits, elapsed: Duration, status: ExitStatus) -> String {
    let wall_us = elapsed.as_micros().max(1) as f64;
    let mut out = format!("pinned: {status} after {:.2} s", elapsed.as_secs_f64());
    if let Some(usage) = stats.usage_us {
        out.push_str(&format!(
            "\npinned: cpu used {:.2} s ({:.3} cores on average, quota {:.3})",
            usage as f64 / 1e6,
            usage as f64 / wall_us,
            limits.quota_us as f64 / limits.period_us as f64
        ));
    }
    out.push_str(&format!(
        "\npinned: throttled in {} of {} periods ({:.0}%), throttled time {:.2} s (as the kernel counts it)",
        stats.nr_throttled,
        stats.nr_periods,
        stats.throttled_ratio() * 100.0,
        stats.throttled_us as f64 / 1e6,
    ));
    out.push_str(&format!(
        "\npinned: memory peak {} of {}",
        stats.peak_bytes.map_or_else(|| "unknown (no memory.peak)".into(), mib),
        mib(limits.memory_bytes)
    ));
    // Some kernels count an OOM kill without a failcnt; print the count only when it says something.
    if let Some(hits) = stats.limit_hits.filter(|h| *h > 0) {
        out.push_str(&format!(", limit hit {hits} times"));
    }
    if let Some(kills) = stats.oom_kills {
        out.push_str(&format!(", {kills} OOM kills"));
    }
    out
}

fn shell_words(argv: &[OsString]) -> String {
    argv.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}
