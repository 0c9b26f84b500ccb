//! The report's SVG charts: goodput and admitted p99 over the ramp, the admission limit over the
//! capacity change.

use breakwater_loadlab::html::{PALETTE, RGBColor, Series, chart};

use crate::record::{LabRecord, Row};

/// A variant's colour: fixed for off, static and adaptive; an `adaptive-cpu-T` variant's follows
/// its target (hundredths, modulo three; one more with a `-pace-MS`), so it keeps its colour from
/// chart to chart. The variants measured together differ: 0, 0.85 and 0.95; 0.95 and
/// 0.95-pace-0 (which shares 0's colour, never measured beside it).
fn color(name: &str) -> RGBColor {
    match name {
        "off" => PALETTE[2],
        "static" => PALETTE[1],
        "adaptive" => PALETTE[0],
        // Variants of older lab files (the removed CPU gate's), by their name.
        other => PALETTE[3 + other.len() % 3],
    }
}

/// The SVG charts: (file name, svg).
pub(crate) fn charts(lab: &LabRecord) -> Vec<(&'static str, String)> {
    let ramp = |f: fn(&Row) -> Option<f64>| -> Vec<Series> {
        lab.variants
            .iter()
            .map(|v| {
                let pts = v.ramp.iter().filter_map(|r| Some((r.multiple?, f(r)?))).collect();
                (v.name.clone(), color(&v.name), pts)
            })
            .collect()
    };
    let mut out = vec![
        (
            "ramp-goodput.svg",
            chart(
                "Goodput (2xx/s in steps meeting p99 <= 200 ms)",
                "offered load, x capacity",
                "req/s",
                &ramp(|r| Some(r.goodput_rps)),
                false,
            ),
        ),
        (
            "ramp-p99.svg",
            chart(
                "Admitted (2xx) p99 latency",
                "offered load, x capacity",
                "ms (log)",
                &ramp(|r| (r.ok > 0).then_some(r.ok_p99_ms.max(0.1))),
                true,
            ),
        ),
    ];
    let mut change: Vec<Series> = Vec::new();
    for v in &lab.variants {
        let limit: Vec<(f64, f64)> = v.change.timeline.iter().filter_map(|(t, l, _)| Some((*t, (*l)?))).collect();
        if !limit.is_empty() {
            change.push((format!("{} limit", v.name), color(&v.name), limit));
        }
        let flight: Vec<(f64, f64)> = v.change.timeline.iter().map(|(t, _, f)| (*t, *f)).collect();
        let c = color(&v.name);
        change.push((format!("{} in flight", v.name), RGBColor(c.0 / 2 + 100, c.1 / 2 + 100, c.2 / 2 + 100), flight));
    }
    let window = lab
        .variants
        .iter()
        .find_map(|v| v.change.slowed)
        .map_or_else(String::new, |(a, b)| format!(" (database slowed {a:.0}-{b:.0} s)"));
    out.push((
        "capacity-change.svg",
        chart(&format!("Admission limit and in flight over time{window}"), "seconds", "requests", &change, false),
    ));
    out
}
