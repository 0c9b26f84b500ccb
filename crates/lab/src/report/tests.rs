//! The report's tests: goals and markdown on records built here, and the whole report rendered
//! again from the committed `docs/lab/lab.json`.

use std::collections::BTreeMap;

use breakwater_loadlab::report::TenantReport;

use super::goals::check;
use super::*;
use crate::plan::Plan;
use crate::record::fixtures::{lab_with, row, sweep};
use crate::record::reading::refused_by_code;
use crate::record::{Capacity, Flood, Noisy, RefusalCost, Row, Variant};

/// The committed run's report, rendered again from its JSON, is what is committed, byte for byte:
/// the whole report in docs/lab/REPORT.md, its headline in docs/PERFORMANCE.md and the charts
/// beside them. The report reads nothing but the record, and whoever changes how it renders
/// renders the committed run again.
#[test]
fn the_committed_lab_json_renders_the_committed_report() -> anyhow::Result<()> {
    let root = crate::rig::services::root();
    let json = root.join("docs/lab/lab.json");
    let lab = LabRecord::from_json(&std::fs::read_to_string(&json)?, &json.display().to_string())?;
    for (path, section) in [("docs/lab/REPORT.md", markdown(&lab, "")), ("docs/PERFORMANCE.md", headline(&lab, "lab/"))]
    {
        let doc = std::fs::read_to_string(root.join(path))?;
        let rendered = replace_generated(&doc, &section);
        if rendered != doc {
            let first = rendered.lines().zip(doc.lines()).position(|(a, b)| a != b);
            panic!("{path}'s generated section differs from its render, first at line {first:?}");
        }
    }
    for (name, svg) in charts(&lab) {
        let committed = std::fs::read_to_string(root.join("docs/lab").join(name))?;
        assert!(svg == committed, "docs/lab/{name} differs from its render");
    }
    Ok(())
}

#[test]
fn the_generated_section_is_replaced_and_the_rest_kept() {
    let doc = "# Performance\n\n## Seeding\n\nfast\n";
    let once = replace_generated(doc, "## The lab\n\nv1");
    assert!(once.starts_with(doc.trim_end()), "{once}");
    assert!(once.contains("v1") && once.contains(BEGIN) && once.contains(END));
    let twice = replace_generated(&format!("{once}\n## After\n\nkept\n"), "## The lab\n\nv2");
    assert!(twice.contains("v2") && !twice.contains("v1"), "{twice}");
    assert!(twice.contains("## Seeding\n\nfast") && twice.contains("## After\n\nkept"), "{twice}");
    assert_eq!(twice.matches(BEGIN).count(), 1);
}

#[test]
fn goals_are_read_from_the_adaptive_variant_against_off() {
    let mut at10 = row("10x", 10.0, 30.0, 150.0, 0.9);
    at10.rss_max_bytes = Some(f64::from(40 << 20));
    let one = row("1x", 1.0, 100.0, 50.0, 0.0);
    let at2 = Row { shed_p50_ms: Some(1.0), refused: 50, ..row("2x", 2.0, 98.0, 180.0, 0.5) };
    let mut lab = lab_with(vec![one.clone(), at2, at10]);
    let honouring_2x = Row {
        logical: Some(breakwater_loadlab::retry::LogicalReport {
            requests: 100,
            succeeded: 90,
            gave_up: 10,
            attempts: 270,
            attempts_per_success: 3.0,
            time_to_success: breakwater_loadlab::stats::Pcts { p99_ms: 2500.0, ..Default::default() },
            cut_off: 0,
        }),
        ..row("2x", 2.0, 90.0, 100.0, 0.2)
    };
    let honouring_10x = Row { shed_p50_ms: Some(12.0), ..row("10x", 10.0, 90.0, 100.0, 0.8) };
    let v = &mut lab.variants[0];
    v.sweep = sweep(&[(4, 100.0), (192, 95.0), (1000, 70.0)]);
    v.sweep_one = sweep(&[(4, 100.0), (192, 50.0)]);
    v.ramp_honouring = vec![honouring_2x, honouring_10x];
    v.flood = Some(Flood {
        tenant: "t".into(),
        tenant_rate: 10.0,
        callers: 64,
        flooder_sent: 1000,
        flooder_ok: 10,
        flooder_refused_by_code: BTreeMap::from([("rate_limited".into(), 980), ("load_shed".into(), 10)]),
        others: Noisy {
            tenant: "t".into(),
            offered_rps: 50.0,
            noisy_sent: 0,
            noisy_ok: 0,
            noisy_refused: 0,
            quiet_tenants: 49,
            quiet_sent: 1000,
            quiet_ok: 990,
            quiet_refused: 10,
            quiet_refused_by_code: BTreeMap::new(),
            quiet_errors: 0,
            quiet_success: 0.99,
            quiet_p99_worst_ms: 80.0,
            quiet_p99_weighted_ms: 40.0,
            row: Row::default(),
        },
        shed_percent: Some(0.5),
    });
    let cost = |cores: f64, refused_rps: f64| {
        Some(Row { achieved_rps: refused_rps, refused_share: 1.0, api_cpu_cores: Some(cores), ..Row::default() })
    };
    lab.refusal_cost = Some(RefusalCost {
        api_kept_alive: cost(0.24, 10_000.0),
        floor_kept_alive: cost(0.25, 12_500.0),
        ..RefusalCost::default()
    });
    lab.variants.push(Variant {
        name: "off".into(),
        sweep: sweep(&[(4, 100.0), (192, 60.0)]),
        sweep_one: sweep(&[(4, 100.0), (192, 60.0)]),
        ramp: vec![Row { ok_rps: 110.0, ..one }],
        ..Variant::default()
    });
    let g = goals(&lab);
    let find = |name: &str| g.iter().find(|x| x.goal == name).unwrap_or_else(|| panic!("{name}: {g:?}"));
    let met = |name: &str| find(name).met;
    assert_eq!(met("2xx/s at 192 callers / at 4"), Some(true), "0.95");
    assert_eq!(met("2xx/s at 1000 callers / at 4"), Some(false), "0.70");
    assert_eq!(met("one tenant: 2xx/s at 192 callers / at 4"), Some(false), "0.5");
    assert!(g.iter().all(|x| x.goal != "one tenant: 2xx/s at 1000 callers / at 4"), "not swept: no goal");
    assert_eq!(met("2xx/s at 192 callers, adaptive / off"), Some(true), "95 / 60");
    assert_eq!(met("one tenant: 2xx/s at 192 callers, adaptive / off"), Some(false), "50 / 60");
    // Capacity is what was achieved: 100 2xx/s against off's 110.
    let cap = find("capacity (achieved 2xx/s), adaptive / off");
    assert_eq!((cap.measured.as_str(), cap.met), ("0.91 x", Some(false)), "{cap:?}");
    assert!(cap.note.contains("adaptive 100 2xx/s, off 110"), "{}", cap.note);
    assert_eq!(met("goodput at 2x"), Some(true), "98 of a 100 peak");
    assert_eq!(met("goodput at 10x"), Some(false), "30 of a 100 peak");
    assert_eq!(met("admitted p99 at 10x"), Some(true));
    assert_eq!(met("shed p50 at 10x, clients honouring Retry-After"), Some(true));
    assert_eq!(met("honouring clients at 2x: attempts per success"), Some(false), "3 attempts");
    assert!(find("honouring clients at 2x: attempts per success").note.contains("10 of 100 logical requests gave up"));
    assert_eq!(met("honouring clients at 2x: p99 time to success"), Some(true), "2.5 s");
    let cpu = find("CPU per refusal, kept alive: the API / a bare hyper server");
    assert_eq!((cpu.measured.as_str(), cpu.met), ("1.20 x", Some(true)), "24 us against 20 us: {cpu:?}");
    assert!(cpu.note.starts_with("24.0 us against 20.0 us"), "{}", cpu.note);
    assert_eq!(met("flood: the flooding tenant's refusals that are 429"), Some(true));
    assert_eq!(met("flood: the other tenants' success"), Some(false), "99% < 99.5%");
    assert_eq!(met("flood: the other tenants' p99 (worst tenant)"), Some(true));
    assert_eq!(met("peak RSS at 10x"), Some(true));
    let md = markdown(&lab, "lab/");
    for h in [
        "### What a refusal costs",
        "### One tenant flooding",
        "**adaptive, honouring**",
        "| adaptive | one tenant | 192 |",
    ] {
        assert!(md.contains(h), "{h} missing from the report");
    }
    // A step over the objective counts no goodput.
    let slow = lab_with(vec![row("1x", 1.0, 100.0, 250.0, 0.0)]);
    assert!(goals(&slow).iter().any(|x| x.goal.starts_with("peak goodput") && x.measured == "0.0 req/s"));
}

/// Where `off` barely fell at 192 callers, no variant could serve 1.3x its work there: the miss
/// says so, with the most any step served; a miss that was within reach says nothing of it.
#[test]
fn a_ratio_to_off_out_of_reach_says_so() {
    let mut lab = lab_with(vec![row("1x", 1.0, 100.0, 50.0, 0.0)]);
    lab.variants[0].sweep = sweep(&[(4, 100.0), (192, 95.0)]);
    lab.variants[0].sweep_one = sweep(&[(4, 100.0), (192, 60.0)]);
    lab.variants.push(Variant {
        name: "off".into(),
        sweep: sweep(&[(4, 98.0), (16, 104.0), (192, 90.0)]),
        sweep_one: sweep(&[(4, 100.0), (192, 70.0)]),
        ..Variant::default()
    });
    let g = goals(&lab);
    let find = |name: &str| g.iter().find(|x| x.goal == name).unwrap_or_else(|| panic!("{name}: {g:?}"));
    let weighted = find("2xx/s at 192 callers, adaptive / off");
    assert_eq!(weighted.met, Some(false), "95 / 90");
    assert!(
        weighted.note.contains("out of reach in this run: off served 90 2xx/s at 192 callers, and the most any variant served in one step of this sweep was 104, 1.16 x off's"),
        "{}",
        weighted.note
    );
    let one = find("one tenant: 2xx/s at 192 callers, adaptive / off");
    assert_eq!(one.met, Some(false), "60 / 70");
    assert!(!one.note.contains("out of reach"), "100 / 70 is 1.43, within reach: {}", one.note);
}

#[test]
fn the_lab_profiles_parse_and_resolve() -> Result<(), String> {
    for quick in [true, false] {
        let plan = Plan::new(quick);
        let f = breakwater_loadlab::profiles::ProfilesFile::parse(&plan.profiles(123.4, 40.0))?;
        let ramp = f.resolve("lab-ramp", Some(200.0), 1.0)?;
        let rates: Vec<f64> = ramp.stages.iter().map(|s| s.rps).collect();
        let want: Vec<f64> = plan.ramp_multiples.iter().map(|m| m * 200.0).collect();
        assert_eq!(rates, want);
        assert_eq!(f.resolve("lab-capacity-change", Some(200.0), 1.0)?.stages.len(), 3);
        assert!(f.resolve("lab-capacity-change", Some(200.0), 1.0)?.pause.is_zero());
        assert_eq!(f.resolve("lab-noisy", None, 1.0)?.stages[0].rps, 123.4);
        assert_eq!(f.resolve("lab-calibrate", None, 1.0)?.stages.len(), plan.calibration_rps.len());
    }
    Ok(())
}

#[test]
fn a_share_of_peak_that_rounds_to_its_target_prints_the_miss() {
    let g = check("goodput at 2x", ">= 0.95 of peak", Some(0.947), "of peak", |v| v >= 0.95, 0.95);
    assert_eq!((g.measured.as_str(), g.met), ("0.947 of peak", Some(false)));
    assert!(g.note.starts_with("missed by 0.003 of peak"), "{}", g.note);
    let g = check("goodput at 2x", ">= 0.95 of peak", Some(0.951), "of peak", |v| v >= 0.95, 0.95);
    assert_eq!((g.measured.as_str(), g.met, g.note.as_str()), ("0.95 of peak", Some(true), ""));
    let g = check("goodput at 2x", ">= 0.95 of peak", Some(0.72), "of peak", |v| v >= 0.95, 0.95);
    assert_eq!(g.measured, "0.72 of peak");
    let g = check("goodput at 2x", ">= 0.95 of peak", Some(0.9496), "of peak", |v| v >= 0.95, 0.95);
    assert_eq!(g.measured, "0.9496 of peak");
    let g = check("admitted p99 at 2x", "<= 200 ms", Some(200.04), "ms", |v| v <= 200.0, 200.0);
    assert_eq!((g.measured.as_str(), g.met), ("200.04 ms", Some(false)));
}

#[test]
fn the_noisy_table_gives_the_quiet_tenants_refusals_by_code() {
    let tenant = |id: &str, codes: &[(&str, u64)]| TenantReport {
        tenant_id: id.into(),
        weight: 1.0,
        sent: 10,
        share: 0.1,
        ok: 10 - codes.iter().map(|c| c.1).sum::<u64>(),
        refused: codes.iter().map(|c| c.1).sum(),
        refused_by_code: codes.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        errors: 0,
        refused_share: 0.0,
        ok_p99_ms: 1.0,
    };
    let tenants = [
        tenant("noisy", &[("rate_limited", 5)]),
        tenant("a", &[("load_shed", 2)]),
        tenant("a", &[("load_shed", 1), ("queue_timeout", 1)]),
        tenant("b", &[]),
    ];
    let quiet = refused_by_code(tenants.iter().filter(|t| t.tenant_id != "noisy"));
    assert_eq!(quiet, BTreeMap::from([("load_shed".into(), 3), ("queue_timeout".into(), 1)]));

    let noisy = |name: &str, refused: u64, codes: &BTreeMap<String, u64>| Variant {
        name: name.into(),
        noisy: Some(Noisy {
            tenant: "noisy".into(),
            offered_rps: 100.0,
            noisy_sent: 10,
            noisy_ok: 5,
            noisy_refused: 5,
            quiet_tenants: 2,
            quiet_sent: 30,
            quiet_ok: 30 - refused,
            quiet_refused: refused,
            quiet_refused_by_code: codes.clone(),
            quiet_errors: 0,
            quiet_success: 0.9,
            quiet_p99_worst_ms: 1.0,
            quiet_p99_weighted_ms: 1.0,
            row: Row::default(),
        }),
        ..Variant::default()
    };
    let mut lab = lab_with(Vec::new());
    lab.variants = vec![noisy("counted", 4, &quiet), noisy("older", 4, &BTreeMap::new()), noisy("none", 0, &quiet)];
    let md = markdown(&lab, "lab/");
    let line = |v: &str| md.lines().find(|l| l.starts_with(&format!("| {v} |"))).unwrap_or_default().to_owned();
    assert!(line("counted").contains("| load_shed 3, queue_timeout 1 |"), "{}", line("counted"));
    assert!(line("older").contains("| 90.0% | - |"), "not counted per tenant: {}", line("older"));
    assert!(line("none").contains("| 90.0% | none |"), "{}", line("none"));
}

#[test]
fn a_capacity_at_the_calibrations_top_rate_says_it_may_be_higher() {
    let mut lab = lab_with(Vec::new());
    let steps = vec![row("100", 1.0, 100.0, 5.0, 0.0), row("200", 2.0, 200.0, 9.0, 0.0)];
    lab.capacity = Some(Capacity { rps: 200.0, how: "calibrated".into(), calibration: steps.clone() });
    assert!(markdown(&lab, "lab/").contains("the capacity may be higher"));
    lab.capacity = Some(Capacity { rps: 100.0, how: "calibrated".into(), calibration: steps });
    assert!(!markdown(&lab, "lab/").contains("the capacity may be higher"));
}

#[test]
fn the_report_renders_every_section() {
    let lab = lab_with(vec![row("1x", 1.0, 100.0, 50.0, 0.0)]);
    let md = markdown(&lab, "lab/");
    for h in ["### Goals", "### The collapse table", "### Open-loop ramp", "### Capacity change", "### Noisy neighbour"]
    {
        assert!(md.contains(h), "{h}");
    }
    assert!(md.contains("](lab/ramp-goodput.svg)"));
    let charts = charts(&lab);
    assert!(charts[0].1.starts_with("<svg"), "{}", &charts[0].1[..40.min(charts[0].1.len())]);
}
