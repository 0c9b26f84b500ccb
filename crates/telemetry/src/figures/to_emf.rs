//! A process's figures as CloudWatch embedded-metric-format lines ([`crate::emf`]), for ECS,
//! where nothing scrapes `/metrics`: one line for the task (dimensions `Environment`, `Service`)
//! and one per admission class (plus `Class`). Counters are published as what happened during
//! the interval (CloudWatch sums them across tasks and periods); gauges as their value at the
//! line's time.

use std::collections::HashMap;
use std::time::SystemTime;

use super::{EmfMetric, Figure, Figures, Kind, Lines, Number, Presence, Series};
use crate::emf::Line;

/// Builds a process's lines from its figures, remembering the totals the previous lines were
/// computed from.
#[derive(Debug)]
pub struct EmfPublisher {
    namespace: String,
    environment: String,
    /// The `Service` dimension (`api`, `worker`).
    service: &'static str,
    /// Each counter's total at the previous lines, by class (`None`: the task's line) and name.
    previous: HashMap<(Option<String>, &'static str), f64>,
}

/// One metric of a line being summed up.
struct Sum {
    metric: EmfMetric,
    counter: bool,
    /// The sum of the known values; `None` while none is known.
    value: Option<f64>,
}

/// Adds a series' value to `m`'s sum in `sums`.
fn add(sums: &mut Vec<Sum>, f: &Figure, m: &EmfMetric, value: Option<f64>) {
    match sums.iter_mut().find(|s| s.metric.name == m.name) {
        Some(sum) => {
            if let Some(v) = value {
                sum.value = Some(sum.value.unwrap_or(0.0) + v);
            }
        }
        None => sums.push(Sum { metric: m.clone(), counter: f.kind == Kind::Counter, value }),
    }
}

impl EmfPublisher {
    /// A publisher of `service`'s lines whose first lines count everything since the process
    /// started.
    #[must_use]
    pub fn new(namespace: &str, environment: &str, service: &'static str) -> Self {
        Self { namespace: namespace.to_owned(), environment: environment.to_owned(), service, previous: HashMap::new() }
    }

    /// The lines of `figures` for the interval since the previous call: the task's, then one
    /// per admission class (the series labelled `class` of a figure on [`Lines::Class`]). Each
    /// figure is published on the lines it names, its series summed (figures under one name
    /// are summed too, e.g. connections refused and reset); a counter as what happened since
    /// the previous lines; a metric with no known value left out rather than published as 0.
    pub fn lines_of(&mut self, figures: &Figures, now: SystemTime) -> Vec<Line> {
        let mut task: Vec<Sum> = Vec::new();
        let mut classes: Vec<(String, Vec<Sum>)> = Vec::new();
        for f in figures.iter() {
            let Presence::At(metrics) = &f.emf else { continue };
            for m in metrics {
                if matches!(m.lines, Lines::Task | Lines::TaskAndClass) {
                    for s in series(f, m) {
                        add(&mut task, f, m, s.value.map(Number::as_f64));
                    }
                }
                if matches!(m.lines, Lines::Class | Lines::TaskAndClass) {
                    for s in series(f, m) {
                        let Some(class) = s.label("class") else { continue };
                        let at = match classes.iter().position(|(c, _)| c == class) {
                            Some(at) => at,
                            None => {
                                classes.push((class.to_owned(), Vec::new()));
                                classes.len() - 1
                            }
                        };
                        add(&mut classes[at].1, f, m, s.value.map(Number::as_f64));
                    }
                }
            }
        }
        let mut totals = HashMap::new();
        let line = || {
            Line::new(&self.namespace, now)
                .dimension("Environment", &self.environment)
                .dimension("Service", self.service)
        };
        let mut lines = vec![self.fill(line(), None, &task, &mut totals)];
        for (class, sums) in &classes {
            lines.push(self.fill(line().dimension("Class", class), Some(class), sums, &mut totals));
        }
        self.previous = totals;
        lines
    }

    /// `line` with `sums`' metrics; each counter's total is kept in `totals` for the next lines.
    fn fill(
        &self,
        mut line: Line,
        class: Option<&String>,
        sums: &[Sum],
        totals: &mut HashMap<(Option<String>, &'static str), f64>,
    ) -> Line {
        for sum in sums {
            let Some(value) = sum.value else { continue };
            if sum.counter {
                let key = (class.cloned(), sum.metric.name);
                let before = self.previous.get(&key).copied().unwrap_or(0.0);
                totals.insert(key, value);
                line.metric(sum.metric.name, sum.metric.unit, (value - before).max(0.0));
            } else {
                line.metric(sum.metric.name, sum.metric.unit, value);
            }
        }
        line
    }
}

/// The series of `f` that metric `m` takes.
fn series<'f>(f: &'f Figure, m: &EmfMetric) -> impl Iterator<Item = &'f Series> {
    let only = m.only;
    f.series.iter().filter(move |s| only.is_none_or(|(label, value)| s.label(label) == Some(value)))
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use serde_json::Value;

    use super::*;
    use crate::figures::Unit;

    /// Two counters under one CloudWatch name, and a per-class gauge whose first class's value
    /// may be unknown.
    fn figures(refused: u64, reset: u64, limit: Option<usize>) -> Figures {
        let mut out = Figures::default();
        out.counter("refused", "Refused", refused).emf("Refused", Unit::Count, Lines::Task).no_ops("a test");
        out.counter("reset", "Reset", reset).emf("Refused", Unit::Count, Lines::Task).no_ops("a test");
        out.figure(Kind::Gauge, "limit", "Limit")
            .maybe(&[("class", "a")], limit.map(Number::from))
            .series(&[("class", "b")], 3_usize)
            .emf("Limit", Unit::Count, Lines::Class)
            .no_ops("a test");
        out.gauge("level", "Level", 7_i64).no_emf("a test").no_ops("a test");
        out
    }

    fn json(lines: &[Line]) -> Vec<Value> {
        lines.iter().map(|l| serde_json::from_str(&l.to_json()).expect("JSON")).collect()
    }

    #[test]
    fn figures_under_one_name_add_up_counters_count_their_interval_and_unknowns_are_left_out() {
        let mut publisher = EmfPublisher::new("Test", "test", "test");
        let first = json(&publisher.lines_of(&figures(2, 1, None), UNIX_EPOCH));
        assert_eq!(first.len(), 3, "the task's line and one per class: {first:?}");
        assert_eq!(first[0]["Refused"], 3.0, "refused and reset add up: {first:?}");
        assert!(first[0].get("Level").is_none(), "a figure marked absent is left out: {first:?}");
        assert_eq!((first[1]["Class"].as_str(), first[1].get("Limit")), (Some("a"), None), "unknown: {first:?}");
        assert_eq!((first[2]["Class"].as_str(), &first[2]["Limit"]), (Some("b"), &Value::from(3.0)));

        let second = json(&publisher.lines_of(&figures(5, 1, Some(4)), UNIX_EPOCH));
        assert_eq!(second[0]["Refused"], 3.0, "what happened since the first lines: {second:?}");
        assert_eq!(second[1]["Limit"], 4.0, "a gauge is its value now: {second:?}");
        let third = json(&publisher.lines_of(&figures(5, 1, Some(4)), UNIX_EPOCH));
        assert_eq!(third[0]["Refused"], 0.0, "{third:?}");
    }
}
