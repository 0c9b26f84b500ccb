//! The goals of the lab, measured against their targets: the adaptive variant, and its ratios to
//! `off` where a goal compares them.

use serde::{Deserialize, Serialize};

use super::cells::{codes_cell, opt};
use crate::plan::multiple_label;
use crate::record::reading::{at, callers, capacity_achieved, meets_objective};
use crate::record::{LabRecord, Noisy, RefusalCost, Row, SLO_MS, Variant};

/// One goal, measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Goal {
    pub(crate) goal: String,
    pub(crate) target: String,
    pub(crate) measured: String,
    /// `None` when it could not be measured in this run.
    pub(crate) met: Option<bool>,
    /// By how much it was missed, and what saturated.
    pub(crate) note: String,
}

fn sat(r: &Row) -> String {
    if r.saturated.is_empty() { "nothing saturated".into() } else { format!("saturated: {}", r.saturated.join(", ")) }
}

pub(crate) fn check(
    goal: &str,
    target: &str,
    measured: Option<f64>,
    unit: &str,
    ok: impl Fn(f64) -> bool,
    t: f64,
) -> Goal {
    let met = measured.map(&ok);
    // Shares of peak and ratios in hundredths, the rest in tenths; a miss gets more digits until it no
    // longer prints as the target itself (0.947 against 0.95, 200.04 ms against 200).
    let mut digits = if unit == "of peak" || unit == "x" { 2 } else { 1 };
    if let (Some(m), Some(false)) = (measured, met) {
        while digits < 6 && format!("{m:.digits$}") == format!("{t:.digits$}") {
            digits += 1;
        }
    }
    let note = match (measured, met) {
        (Some(m), Some(false)) => {
            let by = (m - t).abs();
            let rel = if t == 0.0 { String::new() } else { format!(" ({:.0}%)", by / t * 100.0) };
            format!("missed by {by:.digits$} {unit}{rel}")
        }
        (None, _) => "not measured in this run".into(),
        _ => String::new(),
    };
    Goal {
        goal: goal.into(),
        target: target.into(),
        measured: measured.map_or_else(|| "-".into(), |m| format!("{m:.digits$} {unit}")),
        met,
        note,
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    a.zip(b).and_then(|(a, b)| (b > 0.0).then(|| a / b))
}

/// A goal on a ratio, with what saturated in `r` when it is missed.
fn ratio_goal(goal: &str, target: f64, measured: Option<f64>, r: Option<&Row>) -> Goal {
    let mut g = check(goal, &format!(">= {target}"), measured, "x", |v| v >= target, target);
    if let (Some(false), Some(r)) = (g.met, r) {
        g.note.push_str(&format!("; {}", sat(r)));
    }
    g
}

/// The goals ("never worse than no protection", and the one-tenant mix) against the adaptive
/// variant, with `off` for the ratios that compare.
pub(crate) fn goals(lab: &LabRecord) -> Vec<Goal> {
    let Some(v) = lab.variants.iter().find(|v| v.name == "adaptive") else { return Vec::new() };
    let mut out = Vec::new();
    sweep_goals(&mut out, v);
    if let Some(off) = lab.variants.iter().find(|v| v.name == "off") {
        against_off(&mut out, v, off, &lab.variants);
    }
    ramp_goals(&mut out, &v.ramp);
    honouring_goals(&mut out, v);
    if let Some(c) = &lab.refusal_cost {
        refusal_cost_goal(&mut out, c);
    }
    health_and_memory_goals(&mut out, &v.ramp);
    tenant_goals(&mut out, v);
    for g in &mut out {
        g.note = g.note.trim_start_matches("; ").to_owned();
    }
    out
}

/// 2xx/s at `n` callers of a sweep.
fn ok_at(rows: &[Row], n: usize) -> Option<f64> {
    callers(rows, n).map(|r| r.ok_rps)
}

/// Callers that ignore Retry-After: the served work must not fall as they multiply.
fn sweep_goals(out: &mut Vec<Goal>, v: &Variant) {
    for (mix, rows) in [("", &v.sweep), ("one tenant: ", &v.sweep_one)] {
        for (n, target) in [(192, 0.9), (1000, 0.8)] {
            if callers(rows, n).is_none() {
                continue;
            }
            let r = ratio(ok_at(rows, n), ok_at(rows, 4));
            out.push(ratio_goal(&format!("{mix}2xx/s at {n} callers / at 4"), target, r, callers(rows, n)));
        }
    }
}

/// The ratios of the adaptive variant to no protection: served work at 192 callers, and capacity.
/// `all` is every variant of the run: the most any of them served in one step of a sweep bounds
/// what adaptive can serve at 192 callers, so a miss says when that bound was below the goal.
fn against_off(out: &mut Vec<Goal>, v: &Variant, off: &Variant, all: &[Variant]) {
    type Mix = fn(&Variant) -> &[Row];
    let mixes: [(&str, Mix); 2] = [("", |v| &v.sweep), ("one tenant: ", |v| &v.sweep_one)];
    for (mix, rows) in mixes {
        let (a, o) = (rows(v), rows(off));
        if callers(a, 192).is_some() {
            let r = ratio(ok_at(a, 192), ok_at(o, 192));
            let mut g = ratio_goal(&format!("{mix}2xx/s at 192 callers, adaptive / off"), 1.3, r, callers(a, 192));
            let most = all.iter().flat_map(rows).map(|r| r.ok_rps).fold(0.0, f64::max);
            if let (Some(false), Some(off_192)) = (g.met, ok_at(o, 192)) {
                let bound = most / off_192;
                if bound < 1.3 {
                    g.note.push_str(&format!(
                        "; out of reach in this run: off served {off_192:.0} 2xx/s at 192 callers, and the most any \
                         variant served in one step of this sweep was {most:.0}, {bound:.2} x off's"
                    ));
                }
            }
            out.push(g);
        }
    }
    for (mix, a, o) in [("", &v.ramp, &off.ramp), ("one tenant: ", &v.ramp_one, &off.ramp_one)] {
        if a.is_empty() {
            continue;
        }
        let (ca, co) = (capacity_achieved(a), capacity_achieved(o));
        let mut g = ratio_goal(&format!("{mix}capacity (achieved 2xx/s), adaptive / off"), 0.98, ratio(ca, co), None);
        g.note = format!(
            "{}adaptive {} 2xx/s, off {}{}",
            if g.note.is_empty() { String::new() } else { format!("{}; ", g.note) },
            opt(ca, 0),
            opt(co, 0),
            a.iter()
                .find(|r| !meets_objective(r) && r.ok_rps >= ca.unwrap_or(0.0) * 0.9)
                .map_or_else(String::new, |n| format!("; adaptive at {}: {}", n.label, sat(n)))
        );
        out.push(g);
    }
}

/// Goodput past capacity as a share of the peak, and the admitted p99 there.
fn ramp_goals(out: &mut Vec<Goal>, ramp: &[Row]) {
    let peak = ramp.iter().map(|r| r.goodput_rps).fold(0.0, f64::max);
    out.push(Goal {
        goal: "peak goodput (2xx/s in steps meeting p99 <= 200 ms)".into(),
        target: "(reference)".into(),
        measured: format!("{peak:.1} req/s"),
        met: None,
        note: String::new(),
    });
    for (m, frac) in [(2.0, 0.95), (10.0, 0.8)] {
        let x = multiple_label(m);
        let Some(r) = at(ramp, m) else { continue };
        let share = (peak > 0.0).then(|| r.goodput_rps / peak);
        let mut g =
            check(&format!("goodput at {x}"), &format!(">= {frac} of peak"), share, "of peak", |v| v >= frac, frac);
        if g.met == Some(false) {
            g.note.push_str(&format!("; {}", sat(r)));
        } else if !r.valid {
            // What saturated names an invalid step when the goal is missed; say it when met too.
            g.note.push_str(&format!(
                "; the load generator could not keep this step's schedule ({})",
                r.invalid.join("; ")
            ));
        }
        out.push(g);
        let mut g =
            check(&format!("admitted p99 at {x}"), "<= 200 ms", Some(r.ok_p99_ms), "ms", |v| v <= SLO_MS, SLO_MS);
        if g.met == Some(false) {
            g.note.push_str(&format!("; {}", sat(r)));
        }
        out.push(g);
    }
}

/// Clients that honour `Retry-After`: refusals answered at once, few attempts per success.
fn honouring_goals(out: &mut Vec<Goal>, v: &Variant) {
    if let Some(r) = at(&v.ramp_honouring, 10.0) {
        let mut g = check(
            "shed p50 at 10x, clients honouring Retry-After",
            "<= 20 ms",
            r.shed_p50_ms,
            "ms",
            |v| v <= 20.0,
            20.0,
        );
        if r.shed_p50_ms.is_none() {
            g.note = "nothing was shed".into();
        } else if g.met == Some(false) {
            g.note.push_str(&format!("; {}", sat(r)));
        }
        out.push(g);
    }
    if let Some((r, l)) = at(&v.ramp_honouring, 2.0).and_then(|r| Some((r, r.logical.as_ref()?))) {
        let per = (l.succeeded > 0).then_some(l.attempts_per_success);
        let mut g = check("honouring clients at 2x: attempts per success", "<= 2", per, "", |v| v <= 2.0, 2.0);
        g.note.push_str(&format!("; {} of {} logical requests gave up", l.gave_up, l.requests));
        out.push(g);
        let p99 = (l.succeeded > 0).then_some(l.time_to_success.p99_ms);
        let mut g =
            check("honouring clients at 2x: p99 time to success", "<= 3000 ms", p99, "ms", |v| v <= 3000.0, 3000.0);
        if g.met == Some(false) {
            g.note.push_str(&format!("; {}", sat(r)));
        }
        out.push(g);
    }
}

/// What a refusal costs the API, against a bare hyper server.
fn refusal_cost_goal(out: &mut Vec<Goal>, c: &RefusalCost) {
    let (kept, _) = c.ratios();
    let mut g =
        check("CPU per refusal, kept alive: the API / a bare hyper server", "<= 1.2", kept, "x", |v| v <= 1.2, 1.2);
    g.note = format!(
        "{}{} us against {} us (refusal-only steps; new connections: {} us against {} us)",
        if g.note.is_empty() { String::new() } else { format!("{}; ", g.note) },
        opt(RefusalCost::us_per_refusal(c.api_kept_alive.as_ref()), 1),
        opt(RefusalCost::us_per_refusal(c.floor_kept_alive.as_ref()), 1),
        opt(RefusalCost::us_per_refusal(c.api_new_connections.as_ref()), 1),
        opt(RefusalCost::us_per_refusal(c.floor_new_connections.as_ref()), 1),
    );
    out.push(g);
}

/// `/health` through the whole ramp, and the resident set at 10x.
fn health_and_memory_goals(out: &mut Vec<Goal>, ramp: &[Row]) {
    if let Some(r) = at(ramp, 10.0) {
        let fails: usize = ramp.iter().map(|r| r.health_failures).sum();
        let probes: usize = ramp.iter().map(|r| r.health_probes).sum();
        out.push(Goal {
            goal: "/health always answering (whole ramp)".into(),
            target: "every probe 200 within 1 s".into(),
            measured: format!(
                "{} of {probes} probes failed (10x: slowest {})",
                fails,
                r.health_max_ms.map_or_else(|| "-".into(), |m| format!("{m:.1} ms"))
            ),
            met: (probes > 0).then_some(fails == 0),
            note: if fails > 0 { sat(r) } else { String::new() },
        });
        let rss = r.rss_max_bytes.map(|b| b / f64::from(1 << 20));
        let mut g = check("peak RSS at 10x", "<= 64 MiB", rss, "MiB", |v| v <= 64.0, 64.0);
        if g.met == Some(false) {
            g.note.push_str("; the API's resident set at its largest during the 10x step");
        }
        out.push(g);
    }
}

/// The other tenants beside a flooding or a noisy one.
fn tenant_goals(out: &mut Vec<Goal>, v: &Variant) {
    if let Some(f) = &v.flood {
        let mut g = check(
            "flood: the flooding tenant's refusals that are 429",
            ">= 95%",
            Some(f.flooder_429_share() * 100.0),
            "%",
            |v| v >= 95.0,
            95.0,
        );
        g.note.push_str(&format!("; {}", codes_cell(&f.flooder_refused_by_code)));
        out.push(g);
        out.extend(quiet_goals("flood: the other tenants'", &f.others, 99.5));
    }
    if let Some(n) = &v.noisy {
        out.extend(quiet_goals("noisy neighbour: quiet tenants'", n, 99.0));
    }
}

/// The quiet tenants' success and worst p99 beside a noisy or flooding one.
fn quiet_goals(who: &str, n: &Noisy, success: f64) -> [Goal; 2] {
    let mut a = check(
        &format!("{who} success"),
        &format!(">= {success}%"),
        Some(n.quiet_success * 100.0),
        "%",
        |v| v >= success,
        success,
    );
    let mut b = check(
        &format!("{who} p99 (worst tenant)"),
        "<= 200 ms",
        Some(n.quiet_p99_worst_ms),
        "ms",
        |v| v <= SLO_MS,
        SLO_MS,
    );
    for g in [&mut a, &mut b] {
        if g.met == Some(false) {
            g.note.push_str(&format!("; {}", sat(&n.row)));
        }
    }
    [a, b]
}
