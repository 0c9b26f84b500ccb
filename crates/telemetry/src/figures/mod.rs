//! A process's figures, each described once, and their three views.
//!
//! A layer adds its figures to a [`Figures`] list: for each figure its Prometheus name, kind,
//! help text, its series (label values and a value), and where it appears in the other two
//! views: its CloudWatch metric (the embedded metric format, [`crate::emf`]) and its member of
//! the process's JSON status (the API's `/v1/ops/status`, the worker's `/health`). The views are
//! rendered from that one list: `/metrics` encodes it ([`Figures`] is a Prometheus
//! [`Collector`]), [`to_emf::EmfPublisher`] computes the CloudWatch lines from it, and the JSON
//! serialises the same status the figures are read from. A new figure is written in one place.
//!
//! A figure absent from a view says so, with the reason ([`Figure::no_emf`],
//! [`Figure::no_ops`], [`Figure::no_prometheus`]); one that says nothing about a view is a
//! mistake each binary's tests catch (they render the three views and check each figure
//! against each).

pub mod to_emf;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Metric;

pub use crate::emf::Unit;

/// The reason most figures are absent from CloudWatch: it carries what an alarm reads, and a
/// few figures for a dashboard beside them (docs/OPERATIONS.md); the others are read on
/// `/metrics` and `/v1/ops/status`.
pub const NOT_ALARMED: &str = "no alarm reads it: CloudWatch carries the alarms' figures and a few beside them";

/// The reason a setting published as a gauge (a cap, a number of slots; [`Figures::setting`]) is
/// absent from CloudWatch: it moves only with the task definition, which says it.
pub const SETTING: &str = "a setting: it changes only with the task definition, which holds it";

/// A figure's kind, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A total since start that only grows (Prometheus adds `_total`); CloudWatch gets what
    /// happened during each interval.
    Counter,
    /// A level now.
    Gauge,
    /// A distribution, kept by a live metric ([`Figures::live`]).
    Histogram,
}

/// A value: Prometheus writes an integer without a point, a float with one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A count or an integer level.
    Int(i64),
    /// A duration, a ratio, a rate.
    Float(f64),
}

impl Number {
    /// As a float (CloudWatch and comparisons).
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // counts far below 2^53
    pub fn as_f64(self) -> f64 {
        match self {
            Self::Int(n) => n as f64,
            Self::Float(x) => x,
        }
    }
}

impl From<u64> for Number {
    fn from(n: u64) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<usize> for Number {
    fn from(n: usize) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Number {
    fn from(n: u32) -> Self {
        Self::Int(i64::from(n))
    }
}

impl From<i64> for Number {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<f64> for Number {
    fn from(x: f64) -> Self {
        Self::Float(x)
    }
}

/// One series of a figure: its label values and its value (`None`: not known now, e.g.
/// admission off has no limit).
#[derive(Debug, Clone)]
pub struct Series {
    /// Label names and values, in the order Prometheus writes them.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: Option<Number>,
}

impl Series {
    /// The value of label `name`.
    #[must_use]
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// Which CloudWatch lines carry a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// The task's line, every series summed.
    Task,
    /// Each admission class's line, the series labelled with that `class`.
    Class,
    /// Both.
    TaskAndClass,
}

/// A figure as one CloudWatch metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmfMetric {
    /// The metric's name.
    pub name: &'static str,
    /// Its unit (a counter's is [`Unit::Count`]: what happened during the interval).
    pub unit: Unit,
    /// Its lines.
    pub lines: Lines,
    /// Only the series with this label value (`("outcome", "error")`); all of them if `None`.
    pub only: Option<(&'static str, &'static str)>,
}

/// Whether and where a figure appears in a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence<T> {
    /// Said nothing: a mistake (the views' test fails on it).
    Unsaid,
    /// It appears, so.
    At(T),
    /// Deliberately absent; the reason.
    Absent(&'static str),
}

/// One figure: its description and its series now.
#[derive(Debug)]
pub struct Figure {
    /// The Prometheus name, after the registry's prefix (`breakwater_`, `breakwater_worker_`)
    /// and before a counter's `_total`.
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// The Prometheus help text.
    pub help: &'static str,
    /// Its series (none: the Prometheus family is left out, as an empty family is).
    pub series: Vec<Series>,
    /// What Prometheus, which has no null, shows for a series whose value is not known (0
    /// unless the figure says otherwise).
    pub prometheus_unknown: Number,
    /// In `/metrics` (every figure, unless marked).
    pub prometheus: Presence<()>,
    /// Its CloudWatch metrics (a figure may feed several, e.g. requests by outcome).
    pub emf: Presence<Vec<EmfMetric>>,
    /// Its member of `/v1/ops/status`, a JSON pointer; `{label}` stands for a series' label
    /// value, and a step into an array picks the element holding that value (an admission
    /// class's `name`, a job kind's `kind`).
    pub ops: Presence<String>,
    /// A live Prometheus metric that encodes itself (the request middleware's families by
    /// route), in place of the series.
    live: Option<Box<dyn Metric>>,
}

impl Figure {
    /// Adds a series labelled `labels`.
    pub fn series(&mut self, labels: &[(&'static str, &str)], value: impl Into<Number>) -> &mut Self {
        self.maybe(labels, Some(value.into()))
    }

    /// Adds a series whose value may be unknown now.
    pub fn maybe(&mut self, labels: &[(&'static str, &str)], value: Option<Number>) -> &mut Self {
        let labels = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        self.series.push(Series { labels, value });
        self
    }

    /// What Prometheus shows for an unknown value (`-1`: no limit).
    pub fn unknown_in_prometheus_as(&mut self, value: impl Into<Number>) -> &mut Self {
        self.prometheus_unknown = value.into();
        self
    }

    /// Published in CloudWatch on `lines` as `name`, every series (summed on the task's line).
    /// A counter's unit is [`Unit::Count`]: what happened during the interval.
    pub fn emf(&mut self, name: &'static str, unit: Unit, lines: Lines) -> &mut Self {
        self.emf_metric(EmfMetric { name, unit, lines, only: None })
    }

    /// Published in CloudWatch as `name` on the task's line, the series labelled `label` =
    /// `value` only.
    pub fn emf_only(&mut self, name: &'static str, label: &'static str, value: &'static str) -> &mut Self {
        self.emf_metric(EmfMetric { name, unit: Unit::Count, lines: Lines::Task, only: Some((label, value)) })
    }

    fn emf_metric(&mut self, metric: EmfMetric) -> &mut Self {
        match &mut self.emf {
            Presence::At(metrics) => metrics.push(metric),
            _ => self.emf = Presence::At(vec![metric]),
        }
        self
    }

    /// Deliberately not published to CloudWatch, for `reason`.
    pub fn no_emf(&mut self, reason: &'static str) -> &mut Self {
        self.emf = Presence::Absent(reason);
        self
    }

    /// In `/v1/ops/status` at `pointer`, relative to the layer's own member.
    pub fn ops(&mut self, pointer: &str) -> &mut Self {
        self.ops = Presence::At(pointer.to_owned());
        self
    }

    /// Deliberately not in `/v1/ops/status`, for `reason`.
    pub fn no_ops(&mut self, reason: &'static str) -> &mut Self {
        self.ops = Presence::Absent(reason);
        self
    }

    /// Deliberately not in `/metrics`, for `reason`.
    pub fn no_prometheus(&mut self, reason: &'static str) -> &mut Self {
        self.prometheus = Presence::Absent(reason);
        self
    }

    /// Whether `/metrics` shows it now: it has a series (or its live metric has one).
    #[must_use]
    pub fn is_shown(&self) -> bool {
        self.live.as_ref().map_or(!self.series.is_empty(), |live| !live.is_empty())
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // As the registry does for what is registered in it: a full stop after the help text,
        // and a family with no series yet left out.
        let help = format!("{}.", self.help);
        if let Some(live) = &self.live {
            if live.is_empty() {
                return Ok(());
            }
            return live.encode(encoder.encode_descriptor(self.name, &help, None, live.metric_type())?);
        }
        if self.series.is_empty() {
            return Ok(());
        }
        let metric_type = match self.kind {
            Kind::Counter => MetricType::Counter,
            // A histogram has no single-valued series: only a live metric (above) carries one.
            Kind::Gauge | Kind::Histogram => MetricType::Gauge,
        };
        let mut family = encoder.encode_descriptor(self.name, &help, None, metric_type)?;
        for s in &self.series {
            let value = s.value.unwrap_or(self.prometheus_unknown);
            let metric = family.encode_family(&s.labels)?;
            match (self.kind, value) {
                (Kind::Counter, Number::Int(n)) => ConstCounter::new(u64::try_from(n).unwrap_or(0)).encode(metric)?,
                (Kind::Counter, Number::Float(x)) => ConstCounter::new(x).encode(metric)?,
                (_, Number::Int(n)) => ConstGauge::new(n).encode(metric)?,
                (_, Number::Float(x)) => ConstGauge::new(x).encode(metric)?,
            }
        }
        Ok(())
    }
}

/// Figures read from every layer of a process, in the order `/metrics` lists them.
#[derive(Debug, Default)]
pub struct Figures {
    figures: Vec<Figure>,
}

impl Figures {
    /// Adds a figure with no series yet.
    pub fn figure(&mut self, kind: Kind, name: &'static str, help: &'static str) -> &mut Figure {
        self.figures.push(Figure {
            name,
            kind,
            help,
            series: Vec::new(),
            prometheus_unknown: Number::Int(0),
            prometheus: Presence::At(()),
            emf: Presence::Unsaid,
            ops: Presence::Unsaid,
            live: None,
        });
        self.figures.last_mut().expect("just pushed")
    }

    /// A counter with one unlabelled series.
    pub fn counter(&mut self, name: &'static str, help: &'static str, total: u64) -> &mut Figure {
        self.figure(Kind::Counter, name, help).series(&[], total)
    }

    /// A gauge with one unlabelled series.
    pub fn gauge(&mut self, name: &'static str, help: &'static str, value: impl Into<Number>) -> &mut Figure {
        self.figure(Kind::Gauge, name, help).series(&[], value)
    }

    /// A setting (a cap, a number of slots) as a gauge with one unlabelled series, absent from
    /// CloudWatch ([`SETTING`]).
    pub fn setting(&mut self, name: &'static str, help: &'static str, value: impl Into<Number>) -> &mut Figure {
        self.gauge(name, help, value).no_emf(SETTING)
    }

    /// A figure whose live Prometheus metric encodes itself (a family the request middleware
    /// keeps by route).
    pub fn live(&mut self, kind: Kind, name: &'static str, help: &'static str, metric: Box<dyn Metric>) -> &mut Figure {
        let f = self.figure(kind, name, help);
        f.live = Some(metric);
        f
    }

    /// Runs `publish` with the ops pointers it gives taken under `member` of `/v1/ops/status`
    /// (e.g. `/layers/body`).
    pub fn under(&mut self, member: &str, publish: impl FnOnce(&mut Self)) {
        let first = self.figures.len();
        publish(self);
        for f in &mut self.figures[first..] {
            if let Presence::At(pointer) = &mut f.ops {
                *pointer = format!("{member}/{pointer}");
            }
        }
    }

    /// The figures, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Figure> {
        self.figures.iter()
    }
}

/// Encodes the figures in `/metrics` (those not marked absent from it).
impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.figures.iter().filter(|f| !matches!(f.prometheus, Presence::Absent(_))) {
            f.encode(&mut encoder)?;
        }
        Ok(())
    }
}
