//! `fuzz`: schemathesis against `/openapi.json` with two tenants' tokens.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::testbed::{Api, Testbed};
use super::verdict::Report;
use crate::rig::services;

pub(super) fn venv() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| services::root().join("target"));
    cache.join("breakwater").join("chaos-venv")
}

/// The schemathesis release the suite was written against (its CLI changed at 4.0).
pub(super) const SCHEMATHESIS: &str = "schemathesis>=4.3,<5";

pub(super) fn ensure_schemathesis() -> anyhow::Result<PathBuf> {
    let venv = venv();
    let st = venv.join("bin").join("st");
    if !st.exists() {
        eprintln!("installing {SCHEMATHESIS} into a virtualenv in the user's cache");
        let ok = Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?.success();
        anyhow::ensure!(ok, "python3 -m venv failed (install python3-venv)");
        let ok = Command::new(venv.join("bin").join("pip")).args(["install", "-q", SCHEMATHESIS]).status()?.success();
        anyhow::ensure!(ok, "pip install {SCHEMATHESIS} failed");
    }
    Ok(st)
}

pub(super) async fn run(bed: &Testbed, api: &Api, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "fuzz";
    let st = ensure_schemathesis()?;
    let budget = if bed.quick { 45 } else { 240 };
    for (name, tenant) in ["A", "B"].iter().zip(&bed.tenants) {
        let started = Instant::now();
        let out = tokio::process::Command::new(&st)
            .args(["run", &format!("{}/openapi.json", api.base())])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            ])
            // One worker: with two, its threads parse lambdas' source at once, and CPython 3.11's
            // AST constructor is not thread-safe ("AST constructor recursion depth mismatch", a
            // tool error CI met with every request passing).
            .args(["--max-time", &budget.to_string(), "--workers", "1", "--request-timeout", "10"])
            .args(["--phases", "examples,coverage,fuzzing", "--no-color"])
            .args(["-H", &format!("Authorization: Bearer {}", tenant.token)])
            // The stream answers 200 with a body that never ends: schemathesis would wait out its
            // request timeout on every case. Its bad input is the API's tests' (tests/stream.rs).
            .args(["--exclude-path", "/v1/stream"])
            .env("SCHEMATHESIS_HOOKS", "")
            // It keeps a cache (.schemathesis/) in its working directory: the test bed's, not the repository.
            .current_dir(&bed.dir)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(budget + 120), out).await.context("schemathesis hung")??;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let log = bed.dir.join(format!("schemathesis-{name}.log"));
        std::fs::write(&log, &text)?;
        // The generated-cases line and the closing line ("N failures ... in 45.02s").
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let mut summary: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == "Test cases:")
            .map(|w| w[1])
            .chain(lines.iter().copied().filter(|l| l.starts_with('=') && l.contains(" in ")))
            .collect();
        summary.dedup();
        let summary: Vec<String> = summary.iter().map(|l| l.trim_matches(['=', ' ']).to_owned()).collect();
        // The failures, if any, in full; the rest is in the log file.
        if !out.status.success() {
            println!("{text}");
        }
        report.check(
            S,
            &format!("schemathesis, tenant {name}'s token, every operation but the stream"),
            "exit 0: no 5xx, no schema or status violations",
            format!("{} after {} s: {}", out.status, started.elapsed().as_secs(), summary.join(" / ")),
            out.status.success(),
        );
    }
    // The API's log is searched for panics when it stops, after this scenario.
    Ok(())
}
