//! What each `loadlab` subcommand does: builds its configuration from the arguments, runs it,
//! prints and writes what it gives, and returns the exit code (1 for a regression found by
//! `compare`, 3 for a failed smoke stage, 0 otherwise).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use breakwater_loadlab::analysis::{AnalysisConfig, analyze};
use breakwater_loadlab::compare::Thresholds;
use breakwater_loadlab::html;
use breakwater_loadlab::profiles::ProfilesFile;
use breakwater_loadlab::report::{Report, StepReport, ms};
use breakwater_loadlab::runs::{self, ProfileConfig, Progress, RampConfig, RunError, Sampling, SweepConfig, UrlSteps};

use crate::{
    CompareArgs, OutArgs, ProfileArgs, RampArgs, ReportArgs, RunArgs, SmokeArgs, StreamsArgs, SweepArgs, UrlArgs,
};

fn progress_line(s: &StepReport) {
    let what = s.offered_rps.map_or_else(|| format!("c={}", s.concurrency.unwrap_or(0)), |r| format!("{r:.0}/s"));
    eprintln!(
        "step {:>2} {:<14} {:>9} achieved {:>8.1}/s goodput {:>8.1}/s p50 {:>8} p99 {:>8} refused {:>5.1}% errors {:>5} {}",
        s.index,
        s.label,
        what,
        s.achieved_rps,
        s.goodput_rps,
        ms(s.ok.corrected.p50_ms),
        ms(s.ok.corrected.p99_ms),
        s.refused_share * 100.0,
        s.errors.stats.count,
        if s.audit.valid { String::new() } else { format!("INVALID: {}", s.audit.reasons.join("; ")) }
    );
}

fn emit(report: &Report, out: &OutArgs) -> anyhow::Result<()> {
    println!("{}", report.table());
    if let Some(p) = &out.out {
        report.write_json(p)?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &out.html {
        std::fs::write(p, html::render(report))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn rates(a: &RampArgs) -> anyhow::Result<Vec<f64>> {
    if !a.rates.is_empty() {
        return Ok(a.rates.clone());
    }
    match (a.from, a.to, a.steps) {
        (Some(f), Some(t), Some(n)) if n >= 1 => {
            Ok((0..n).map(|k| if n == 1 { f } else { f + (t - f) * k as f64 / (n - 1) as f64 }).collect())
        }
        _ => anyhow::bail!("give --rates, or --from, --to and --steps"),
    }
}

/// Each step on stderr as it ends, unless `--quiet`.
fn progress(out: &OutArgs) -> Progress<'static> {
    let p: &(dyn Fn(&StepReport) + Sync) = &progress_line;
    (!out.quiet).then_some(p)
}

/// A ramp's or a sweep's steps against `--url`; a `--body` that is not JSON is refused here,
/// before the run, rather than as a 400 on every request.
fn url_steps(target: &UrlArgs, step: Duration, pause: Duration, run: &RunArgs) -> anyhow::Result<UrlSteps> {
    if let Some(body) = &target.body {
        serde_json::from_str::<serde_json::Value>(body).context("--body is not JSON")?;
    }
    Ok(UrlSteps {
        urls: target.url.clone(),
        body: target.body.clone(),
        step,
        pause,
        engine: run.engine.config(),
        sampling: run.sampling.config(),
    })
}

/// `loadlab ramp`: the open-loop ramp, its progress on stderr, then its report.
pub(crate) async fn ramp(a: &RampArgs) -> anyhow::Result<ExitCode> {
    let cfg = RampConfig {
        run: url_steps(&a.target, a.step, a.pause, &a.load.run)?,
        rates: rates(a)?,
        analysis: a.load.analysis.config(),
    };
    let report = runs::ramp(&cfg, a.load.run.tokens()?, progress(&a.load.out)).await;
    emit(&report, &a.load.out)?;
    Ok(ExitCode::SUCCESS)
}

/// `loadlab sweep`: the closed-loop sweep, its progress on stderr, then its report.
pub(crate) async fn sweep(a: &SweepArgs) -> anyhow::Result<ExitCode> {
    let cfg = SweepConfig { run: url_steps(&a.target, a.step, a.pause, &a.run)?, concurrency: a.concurrency.clone() };
    let report = runs::sweep(&cfg, a.run.tokens()?, progress(&a.out)).await;
    emit(&report, &a.out)?;
    Ok(ExitCode::SUCCESS)
}

/// `loadlab profile`: a profile, its capacity read from a report if asked, then its report; a
/// failed smoke stage stops it before any load.
pub(crate) async fn profile(a: &ProfileArgs) -> anyhow::Result<ExitCode> {
    let capacity_rps = match (&a.capacity_from, a.capacity) {
        (Some(p), _) => {
            let r = Report::read_json(p)?;
            Some(r.analysis.and_then(|x| x.capacity).map(|c| c.capacity_rps).ok_or_else(|| {
                anyhow::anyhow!("{} has no measured capacity (no step met its objective)", p.display())
            })?)
        }
        (None, c) => c,
    };
    let cfg = ProfileConfig {
        base: a.base.trim_end_matches('/').to_owned(),
        ops_base: Some(a.ops_base.trim_end_matches('/').to_owned()),
        profile: a.name.clone(),
        profiles: ProfilesFile::load(a.profiles.as_deref()).map_err(anyhow::Error::msg)?,
        capacity_rps,
        time_scale: a.time_scale,
        engine: a.load.run.engine.config(),
        analysis: a.load.analysis.config(),
        sampling: Sampling {
            ops_url: a
                .load
                .run
                .sampling
                .ops_url
                .clone()
                .or_else(|| Some(format!("{}/v1/ops/status", a.ops_base.trim_end_matches('/')))),
            ..a.load.run.sampling.config()
        },
        smoke: !a.no_smoke,
    };
    match runs::profile(&cfg, a.load.run.tokens()?, progress(&a.load.out)).await {
        Ok(report) => emit(&report, &a.load.out)?,
        Err(RunError::Smoke(f)) => {
            eprintln!("{f}");
            eprintln!("the run was stopped before any load: fix the path, then run again");
            return Ok(ExitCode::from(3));
        }
        Err(e) => return Err(e.into()),
    }
    Ok(ExitCode::SUCCESS)
}

/// `loadlab streams`: the live-inbox streams, their report printed as JSON and written if asked.
pub(crate) async fn streams(a: &StreamsArgs) -> anyhow::Result<ExitCode> {
    let tokens = a.tokens.load(1)?;
    let config = breakwater_loadlab::streams::StreamsConfig {
        base: a.base.trim_end_matches('/').to_owned(),
        streams: a.streams,
        open_rate: a.open_rate,
        hold: a.hold,
        writes_per_sec: a.writes_per_sec,
    };
    let report = breakwater_loadlab::streams::run(&config, &tokens).await?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &a.out {
        std::fs::write(path, &json)?;
    }
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}

/// `loadlab smoke`: the smoke stage alone, one line per journey step.
pub(crate) async fn smoke(a: &SmokeArgs) -> anyhow::Result<ExitCode> {
    let tokens = a.tokens.load(1)?;
    match runs::smoke_only(a.base.trim_end_matches('/'), Some(a.ops_base.trim_end_matches('/')), &tokens, a.timeout)
        .await
    {
        Ok(r) => {
            for s in &r.steps {
                println!("ok   {:<18} {:<40} {:>4} {:>8.1}ms", s.name, s.request, s.status.unwrap_or(0), s.latency_ms);
            }
            println!("smoke passed");
        }
        Err(f) => {
            for s in &f.report.steps {
                let mark = if s.ok { "ok  " } else { "FAIL" };
                println!(
                    "{mark} {:<18} {:<40} {:>4} {}",
                    s.name,
                    s.request,
                    s.status.unwrap_or(0),
                    s.reason.as_deref().unwrap_or("")
                );
            }
            eprintln!("{f}");
            return Ok(ExitCode::from(3));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `loadlab compare`: the regression gate between two reports, as a table or JSON.
pub(crate) fn compare(a: &CompareArgs) -> anyhow::Result<ExitCode> {
    let base = Report::read_json(&a.baseline)?;
    let cur = Report::read_json(&a.current)?;
    let t = Thresholds {
        latency_factor: a.latency_factor,
        min_latency_rise_ms: a.min_latency_rise.as_secs_f64() * 1000.0,
        throughput_drop: a.throughput_drop,
        error_rise: a.error_rise,
    };
    let c = breakwater_loadlab::compare(&base, &cur, &t);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", c.table());
    }
    Ok(if c.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `loadlab report`: a saved report re-printed, its curve re-read with another objective if
/// asked, and rendered as HTML if asked.
pub(crate) fn report(a: &ReportArgs) -> anyhow::Result<ExitCode> {
    let mut r = Report::read_json(&a.report)?;
    if let Some(slo) = a.slo_p99 {
        let cfg = AnalysisConfig {
            slo_p99_ms: slo.as_secs_f64() * 1000.0,
            headroom: a.headroom,
            ..r.analysis.as_ref().map(|x| x.config.clone()).unwrap_or_default()
        };
        r.analysis = Some(analyze(&r.steps, &cfg));
    }
    println!("{}", r.table());
    if let Some(p) = &a.html {
        std::fs::write(p, html::render(&r))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}
