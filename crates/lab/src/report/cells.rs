//! How a figure is written in a table cell or a note.

use std::collections::BTreeMap;

use crate::record::Row;

pub(crate) fn codes_cell(codes: &BTreeMap<String, u64>) -> String {
    if codes.is_empty() {
        return "none".into();
    }
    codes.iter().map(|(k, c)| format!("{k} {c}")).collect::<Vec<_>>().join(", ")
}

pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

pub(crate) fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

pub(crate) fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "-",
    }
}

pub(crate) fn saturated_cell(r: &Row) -> String {
    if r.saturated.is_empty() { "-".into() } else { r.saturated.join("; ") }
}
