//! The self-contained HTML report: the table, the reading of the curve, and SVG charts drawn
//! with plotters (latency percentiles and achieved vs offered per step, refusal share, and the
//! server's limit and in-flight over time). No scripts, no external assets.

use std::fmt::Write as _;

use plotters::prelude::*;
/// The colour type of [`Series`], for callers that draw with [`chart`].
pub use plotters::style::RGBColor;

use crate::report::{Report, StepReport};

/// A named, coloured line of `(x, y)` points.
pub type Series = (String, RGBColor, Vec<(f64, f64)>);

fn x_of(s: &StepReport) -> f64 {
    s.offered_rps.or(s.concurrency.map(|c| c as f64)).unwrap_or(s.index as f64)
}

fn x_label(r: &Report) -> &'static str {
    if r.steps.iter().any(|s| s.offered_rps.is_some()) { "offered req/s" } else { "concurrent callers" }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// One line chart as an SVG string (760 x 360); empty if there is nothing to draw. Also used
/// by `cargo xtask lab` for its charts.
pub fn chart(title: &str, x_desc: &str, y_desc: &str, series: &[Series], log_y: bool) -> String {
    let pts: Vec<(f64, f64)> =
        series.iter().flat_map(|s| s.2.iter().copied()).filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
    if pts.is_empty() {
        return String::new();
    }
    let (mut x0, mut x1) = pts.iter().fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let (mut y0, mut y1) = pts.iter().fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.1), a.1.max(p.1)));
    if x1 <= x0 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    if log_y {
        y0 = (y0 * 0.8).max(0.01);
        y1 = (y1 * 1.25).max(y0 * 10.0);
    } else {
        y0 = y0.min(0.0);
        y1 = if y1 <= y0 { y0 + 1.0 } else { y1 * 1.1 };
    }
    let mut svg = String::new();
    let drawn: Result<(), Box<dyn std::error::Error>> = (|| {
        let root = SVGBackend::with_string(&mut svg, (760, 360)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut b = ChartBuilder::on(&root);
        b.caption(title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(64);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut c = $chart;
                c.configure_mesh().x_desc(x_desc).y_desc(y_desc).light_line_style(WHITE.mix(0.0)).draw()?;
                for (name, color, data) in series {
                    let color = *color;
                    c.draw_series(LineSeries::new(data.iter().copied(), color.stroke_width(2)))?
                        .label(name.as_str())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                    c.draw_series(data.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
                }
                c.configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()?;
            }};
        }
        if log_y {
            draw!(b.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?);
        } else {
            draw!(b.build_cartesian_2d(x0..x1, y0..y1)?);
        }
        root.present()?;
        Ok(())
    })();
    match drawn {
        Ok(()) => svg,
        Err(e) => format!("<p>chart {title:?} could not be drawn: {}</p>", escape(&e.to_string())),
    }
}

/// The charts' colours, in the order lines take them: one palette for every chart drawn with
/// [`chart`], this crate's and its callers'.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn per_step(r: &Report, f: impl Fn(&StepReport) -> Option<f64>) -> Vec<(f64, f64)> {
    r.steps.iter().filter_map(|s| f(s).map(|y| (x_of(s), y))).collect()
}

/// Renders the report as one HTML page.
pub fn render(r: &Report) -> String {
    let [latency, throughput, refusals] = step_charts(r);
    let server = server_chart(r);

    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>loadlab: {name}</title><style>\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}\
         pre{{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}}\
         table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
         .bad{{color:#b00}}</style></head><body>",
        name = escape(&r.name)
    );
    let _ = write!(
        h,
        "<h1>loadlab {:?}: {}</h1><p>target <code>{}</code>, started {}, generator {} on {} cores</p>",
        r.kind,
        escape(&r.name),
        escape(&r.target),
        escape(&r.started_at),
        escape(&r.generator.version),
        r.generator.cores
    );
    if let Some(a) = &r.analysis {
        let _ = write!(h, "<h2>Reading the curve</h2><pre>{}</pre>", escape(&a.describe()));
    }
    let _ = write!(h, "<h2>Steps</h2><pre>{}</pre>", escape(&r.table()));
    for svg in [&latency, &throughput, &refusals, &server] {
        if !svg.is_empty() {
            let _ = write!(h, "<div>{svg}</div>");
        }
    }
    write_tenants(&mut h, r);
    write_smoke(&mut h, r);
    h.push_str("<p>The JSON report holds every figure on this page and every server sample.</p></body></html>");
    h
}

/// The charts over the steps: latency percentiles of ok responses, achieved vs offered, and the
/// refused and failed share.
fn step_charts(r: &Report) -> [String; 3] {
    let xl = x_label(r);
    let pos = |v: f64| (v > 0.0).then_some(v);
    let latency = chart(
        "Latency of ok responses (corrected for coordinated omission)",
        xl,
        "ms (log)",
        &[
            ("p50".into(), PALETTE[0], per_step(r, |s| pos(s.ok.corrected.p50_ms))),
            ("p95".into(), PALETTE[1], per_step(r, |s| pos(s.ok.corrected.p95_ms))),
            ("p99".into(), PALETTE[2], per_step(r, |s| pos(s.ok.corrected.p99_ms))),
            ("p99 uncorrected".into(), PALETTE[4], per_step(r, |s| pos(s.ok.uncorrected.p99_ms))),
        ],
        true,
    );
    let mut throughput_series = vec![
        ("achieved (all responses)".into(), PALETTE[0], per_step(r, |s| Some(s.achieved_rps))),
        ("goodput (ok)".into(), PALETTE[3], per_step(r, |s| Some(s.goodput_rps))),
    ];
    if r.steps.iter().any(|s| s.offered_rps.is_some()) {
        throughput_series.push(("offered".into(), RGBColor(150, 150, 150), per_step(r, |s| s.offered_rps)));
    }
    let throughput = chart("Achieved vs offered", xl, "req/s", &throughput_series, false);
    let refusals = chart(
        "Refused and failed share",
        xl,
        "% of responses",
        &[
            ("refused".into(), PALETTE[1], per_step(r, |s| Some(s.refused_share * 100.0))),
            ("errors".into(), PALETTE[2], per_step(r, |s| Some(s.error_share * 100.0))),
        ],
        false,
    );
    [latency, throughput, refusals]
}

/// The server's limit, in-flight and queue depth over the run, as its samples have them.
fn server_chart(r: &Report) -> String {
    let mut keys: Vec<&String> = r
        .samples
        .iter()
        .flat_map(|s| s.values.keys())
        .filter(|k| k.ends_with("limit") || k.ends_with("in_flight") || k.ends_with("queue_depth"))
        .collect();
    keys.sort();
    keys.dedup();
    let server_series: Vec<Series> = keys
        .iter()
        .take(PALETTE.len())
        .enumerate()
        .map(|(i, k)| {
            let pts = r.samples.iter().filter_map(|s| s.values.get(*k).map(|v| (s.t_s, *v))).collect();
            ((*k).clone(), PALETTE[i], pts)
        })
        .collect();
    chart("Server limit and in-flight over time", "seconds since start", "requests", &server_series, false)
}

/// The tenants' table, for a run with tenants.
fn write_tenants(h: &mut String, r: &Report) {
    if !r.tenants.is_empty() {
        let _ = write!(
            h,
            "<h2>Tenants</h2><p>fairness (Jain's index over admitted share): {}</p><table><tr><th>tenant</th><th>weight</th><th>share</th><th>sent</th><th>ok</th><th>refused</th><th>errors</th><th>ok p99 ms</th></tr>",
            r.fairness.map_or("-".into(), |f| format!("{f:.3}"))
        );
        for t in &r.tenants {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{:.3}</td><td>{:.1}%</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td></tr>",
                escape(&t.tenant_id),
                t.weight,
                t.share * 100.0,
                t.sent,
                t.ok,
                t.refused,
                t.errors,
                t.ok_p99_ms
            );
        }
        h.push_str("</table>");
    }
}

/// The smoke stage's table, for a run that had one.
fn write_smoke(h: &mut String, r: &Report) {
    if let Some(sm) = &r.smoke {
        h.push_str("<h2>Smoke stage</h2><table><tr><th>step</th><th>request</th><th>status</th><th>ms</th><th>result</th></tr>");
        for s in &sm.steps {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td class=\"{}\">{}</td></tr>",
                escape(&s.name),
                escape(&s.request),
                s.status.map_or("-".into(), |v| v.to_string()),
                s.latency_ms,
                if s.ok { "" } else { "bad" },
                escape(s.reason.as_deref().unwrap_or("ok"))
            );
        }
        h.push_str("</table>");
    }
}
