//! Lab records for tests: a step row and a record with one adaptive variant.

use super::{LabRecord, Machine, Row, SCHEMA, SLO_MS, Variant};
use crate::plan::Plan;

pub(crate) fn row(label: &str, m: f64, ok_rps: f64, p99: f64, refused: f64) -> Row {
    let mut r = Row {
        label: label.into(),
        offered_rps: Some(m * 100.0),
        multiple: Some(m),
        ok: 100,
        completed: 100,
        ok_rps,
        ok_p99_ms: p99,
        refused_share: refused,
        valid: true,
        ..Row::default()
    };
    r.goodput_rps = if p99 <= SLO_MS { ok_rps } else { 0.0 };
    r
}

pub(crate) fn lab_with(ramp: Vec<Row>) -> LabRecord {
    LabRecord {
        schema: SCHEMA.into(),
        date: "2026-01-01T00:00:00Z".into(),
        machine: Machine {
            cores: 2,
            cpu_model: "x".into(),
            kernel: "6".into(),
            cgroup: "v1".into(),
            unpinned: None,
            load_average: ("1 1 1".into(), "2 2 2".into()),
        },
        commit: "abc".into(),
        seed: "s".into(),
        database: "d".into(),
        plan: Plan::new(true),
        capacity: None,
        variants: vec![Variant { name: "adaptive".into(), ramp, ..Variant::default() }],
        noisy_tenant_share: 0.55,
        refusal_cost: None,
        wall_s: 60.0,
    }
}

pub(crate) fn sweep(points: &[(usize, f64)]) -> Vec<Row> {
    points
        .iter()
        .map(|&(n, ok)| Row { callers: Some(n), ok_rps: ok, ..row(&n.to_string(), 1.0, ok, 10.0, 0.0) })
        .collect()
}
