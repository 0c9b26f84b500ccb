//! CloudWatch metrics without an agent: with `METRICS_EMF_INTERVAL_SECS` set, the API writes its
//! figures to stdout every interval as CloudWatch embedded-metric-format lines
//! ([`breakwater_telemetry::emf`]). On ECS the `awslogs` driver carries them to CloudWatch Logs,
//! which turns them into metrics; the alarms in `infra/cloudformation/alarms.yaml` watch those.
//! Nothing on ECS scrapes `/metrics`, and a collector sidecar would take CPU from a task sized
//! at a quarter of a core.
//!
//! Each interval writes one line for the task (dimensions `Environment`, `Service`) and one per
//! admission class (plus `Class`). Counters are published as what happened during the interval
//! (CloudWatch sums them across tasks and periods); gauges as their value at the line's time.
//! The last line is written after the server has drained, so a stopping task's final requests
//! are counted too.

use std::collections::HashMap;
use std::time::SystemTime;

use breakwater_telemetry::emf::{Line, Source};

use crate::figures::{EmfMetric, Figure, Figures, Kind, Lines, Presence};
use crate::state::AppState;

/// The `Service` dimension of the API's lines.
pub const SERVICE: &str = "api";

/// Builds the lines, remembering the totals the previous lines were computed from.
#[derive(Debug)]
pub struct Publisher {
    namespace: String,
    environment: String,
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

impl Publisher {
    /// A publisher whose first lines count everything since the process started.
    #[must_use]
    pub fn new(namespace: &str, environment: &str) -> Self {
        Self { namespace: namespace.to_owned(), environment: environment.to_owned(), previous: HashMap::new() }
    }

    /// The lines for the interval since the previous call: the task's, then one per admission
    /// class. Reads the job queue's figures through their cache (a query at most every
    /// `JOBS_STATS_TTL_MS`, never longer than `JOBS_STATS_TIMEOUT_MS`).
    pub async fn lines(&mut self, state: &AppState) -> Vec<Line> {
        let queue = state.queue_stats.get(&state.pool).await;
        self.lines_of(&crate::figures::read(state, queue), SystemTime::now())
    }

    /// The lines of `figures`: each figure published to CloudWatch on the lines it names, its
    /// series summed (figures under one name are summed too, e.g. connections refused and
    /// reset); a counter as what happened since the previous lines; a metric with no known
    /// value left out rather than published as 0.
    fn lines_of(&mut self, figures: &Figures, now: SystemTime) -> Vec<Line> {
        let mut task: Vec<Sum> = Vec::new();
        let mut classes: Vec<(String, Vec<Sum>)> = Vec::new();
        for f in figures.iter() {
            let Presence::At(metrics) = &f.emf else { continue };
            for m in metrics {
                if matches!(m.lines, Lines::Task | Lines::TaskAndClass) {
                    for s in series(f, m) {
                        add(&mut task, f, m, s.value.map(crate::figures::Number::as_f64));
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
                        add(&mut classes[at].1, f, m, s.value.map(crate::figures::Number::as_f64));
                    }
                }
            }
        }
        let mut totals = HashMap::new();
        let line = || {
            Line::new(&self.namespace, now).dimension("Environment", &self.environment).dimension("Service", SERVICE)
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
fn series<'f>(f: &'f Figure, m: &EmfMetric) -> impl Iterator<Item = &'f crate::figures::Series> {
    let only = m.only;
    f.series.iter().filter(move |s| only.is_none_or(|(label, value)| s.label(label) == Some(value)))
}

/// The API's [`Source`]: its publisher and the state it reads.
#[derive(Debug)]
pub(crate) struct ApiSource {
    publisher: Publisher,
    state: AppState,
}

impl ApiSource {
    /// Lines in the namespace and environment of the state's configuration.
    pub(crate) fn new(state: AppState) -> Self {
        let options = &state.config.metrics_emf;
        Self { publisher: Publisher::new(&options.namespace, &options.environment), state }
    }
}

impl Source for ApiSource {
    async fn lines(&mut self) -> Vec<Line> {
        self.publisher.lines(&self.state).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use serde_json::Value;

    use super::*;
    use crate::figures::{Number, Unit};

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
        let mut publisher = Publisher::new("Test", "test");
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
