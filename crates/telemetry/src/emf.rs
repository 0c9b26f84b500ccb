//! CloudWatch's embedded metric format (EMF): metrics written as a JSON log line.
//!
//! A log event that is a JSON object with an `_aws` member naming a namespace, dimension sets
//! and metrics becomes CloudWatch metrics when it reaches CloudWatch Logs (by the ECS `awslogs`
//! driver, for one): no agent, no sidecar, no API call from the process. The values are the
//! object's own members, so the line also reads as a log line. Specification:
//! <https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html>.
//!
//! One [`Line`] is one event: one namespace, one dimension set, up to [`MAX_METRICS`] metrics.
//! [`publish`] writes a [`Source`]'s lines to stdout on an interval, and once more when told to
//! stop (the process's last figures).

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

/// The most metrics one directive may carry (the specification's limit).
pub const MAX_METRICS: usize = 100;

/// A metric's unit, as CloudWatch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Events counted over the line's interval.
    Count,
    /// A duration.
    Seconds,
    /// A duration.
    Milliseconds,
    /// A ratio or a level.
    None,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Count => "Count",
            Self::Seconds => "Seconds",
            Self::Milliseconds => "Milliseconds",
            Self::None => "None",
        }
    }
}

/// One EMF event under construction.
#[derive(Debug, Clone)]
pub struct Line {
    namespace: String,
    timestamp: SystemTime,
    dimensions: Vec<(&'static str, String)>,
    metrics: Vec<(&'static str, Unit, f64)>,
}

impl Line {
    /// An event in `namespace`, stamped `timestamp`.
    #[must_use]
    pub fn new(namespace: &str, timestamp: SystemTime) -> Self {
        Self { namespace: namespace.to_owned(), timestamp, dimensions: Vec::new(), metrics: Vec::new() }
    }

    /// Adds a dimension: every metric of the line is published under the whole set.
    #[must_use]
    pub fn dimension(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.dimensions.push((name, value.into()));
        self
    }

    /// Adds a metric. A value that is not finite (CloudWatch takes none) is left out, so one
    /// unknown figure cannot cost the line its others.
    pub fn metric(&mut self, name: &'static str, unit: Unit, value: f64) -> &mut Self {
        if value.is_finite() {
            self.metrics.push((name, unit, value));
        }
        self
    }

    /// Adds a counter as what happened since the previous line: `now - before` of a total that
    /// only grows (0 rather than negative should it ever not).
    pub fn count_since(&mut self, name: &'static str, now: u64, before: u64) -> &mut Self {
        self.count(name, now.saturating_sub(before))
    }

    /// Adds a number of things (jobs, requests, connections), as a [`Unit::Count`].
    pub fn count(&mut self, name: &'static str, n: u64) -> &mut Self {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^53
        self.metric(name, Unit::Count, n as f64)
    }

    /// The names of the metrics the line carries.
    pub fn metric_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.metrics.iter().map(|(name, _, _)| *name)
    }

    /// The event as one line of JSON (no newline).
    ///
    /// # Panics
    /// When a metric shares its name with a dimension or with another metric, or the line holds
    /// more than [`MAX_METRICS`] metrics: the caller's names are constants, so this is a bug,
    /// and CloudWatch would reject or misread the event.
    #[must_use]
    pub fn to_json(&self) -> String {
        assert!(self.metrics.len() <= MAX_METRICS, "an EMF directive holds at most {MAX_METRICS} metrics");
        let mut root = Map::new();
        for (name, value) in &self.dimensions {
            root.insert((*name).to_owned(), Value::String(value.clone()));
        }
        for (name, _, value) in &self.metrics {
            let clash = root.insert((*name).to_owned(), json!(value));
            assert!(clash.is_none(), "EMF member {name} is given twice");
        }
        let millis = self.timestamp.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let dimension_names: Vec<&str> = self.dimensions.iter().map(|(n, _)| *n).collect();
        let metrics: Vec<Value> =
            self.metrics.iter().map(|(name, unit, _)| json!({ "Name": name, "Unit": unit.as_str() })).collect();
        root.insert(
            "_aws".to_owned(),
            json!({
                "Timestamp": u64::try_from(millis).unwrap_or(u64::MAX),
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [dimension_names],
                    "Metrics": metrics,
                }],
            }),
        );
        Value::Object(root).to_string()
    }
}

/// Whether and where a process writes its lines: the same variables for every binary.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// How often the figures are written to stdout as CloudWatch embedded-metric-format lines,
    /// in seconds (0: never). For ECS, where nothing scrapes `/metrics`: the `awslogs` driver
    /// carries the lines to CloudWatch, which makes them metrics.
    #[arg(long = "metrics-emf-interval-secs", env = "METRICS_EMF_INTERVAL_SECS", default_value_t = 0)]
    pub interval_secs: u64,
    /// The CloudWatch namespace of those metrics.
    #[arg(long = "metrics-emf-namespace", env = "METRICS_EMF_NAMESPACE", default_value = "Breakwater")]
    pub namespace: String,
    /// Their `Environment` dimension (the CloudFormation stacks' `EnvironmentName`).
    #[arg(long = "metrics-emf-environment", env = "METRICS_EMF_ENVIRONMENT", default_value = "local")]
    pub environment: String,
}

/// The namespace is empty or AWS's own (`AWS/...`), or the environment is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidOptions;

impl std::fmt::Display for InvalidOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("METRICS_EMF_NAMESPACE must be set and not start with AWS/, METRICS_EMF_ENVIRONMENT must be set")
    }
}

impl std::error::Error for InvalidOptions {}

impl Options {
    /// How often the lines are written (`None`: never).
    #[must_use]
    pub fn interval(&self) -> Option<Duration> {
        (self.interval_secs > 0).then(|| Duration::from_secs(self.interval_secs))
    }

    /// Refuses a namespace CloudWatch reserves or an empty name.
    ///
    /// # Errors
    /// [`InvalidOptions`].
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        if self.namespace.trim().is_empty() || self.namespace.starts_with("AWS/") || self.environment.trim().is_empty()
        {
            return Err(InvalidOptions);
        }
        Ok(())
    }

    /// Starts writing `source`'s lines, if an interval is set.
    #[must_use]
    pub fn start(&self, source: impl Source + Send + 'static) -> Option<Publishing> {
        self.interval().map(|every| Publishing::start(source, every))
    }
}

/// A [`publish`] running in the background.
#[derive(Debug)]
pub struct Publishing {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Publishing {
    /// Writes `source`'s lines every `every` until [`Publishing::finish`].
    #[must_use]
    pub fn start(source: impl Source + Send + 'static, every: Duration) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(publish(source, every, stop.clone()));
        Self { stop, task }
    }

    /// Writes the last lines (what happened since the previous ones) and waits for them. Call it
    /// once the process has done its work (drained, stopped), so that work is counted. A failed
    /// writer is logged, never returned: lost metrics are not worth a failed shutdown.
    pub async fn finish(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the CloudWatch metrics writer failed");
        }
    }
}

/// What a process publishes: its lines for the interval since the previous call.
pub trait Source {
    /// The lines (counters as what happened since the previous call).
    fn lines(&mut self) -> impl Future<Output = Vec<Line>> + Send;
}

/// Writes `source`'s lines to stdout every `every` until `stop`, then once more, so the figures
/// of the last interval are not lost. The first lines come after a whole interval.
pub async fn publish(source: impl Source, every: Duration, stop: CancellationToken) {
    publish_to(source, every, stop, write_stdout).await;
}

/// As [`publish`], handing each interval's lines to `sink` instead of stdout.
pub async fn publish_to(
    mut source: impl Source,
    every: Duration,
    stop: CancellationToken,
    mut sink: impl FnMut(&[Line]),
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // immediate
    loop {
        let last = tokio::select! {
            () = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        sink(&source.lines().await);
        if last {
            return;
        }
    }
}

/// One write per line under stdout's lock, so a line never interleaves with a log event (the
/// JSON log layer writes each event whole through the same lock).
pub fn write_stdout(lines: &[Line]) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        let mut text = line.to_json();
        text.push('\n');
        if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
            // Stdout gone (the log driver stopped): nothing to tell, nowhere to tell it.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_line_names_its_metrics_and_dimensions_and_carries_their_values() {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_600_000_123);
        let mut line = Line::new("Breakwater", at).dimension("Environment", "prod").dimension("Service", "api");
        line.metric("Requests", Unit::Count, 42.0).metric("BusyRatio", Unit::None, 0.25).count_since("Shed", 10, 7);
        let v: Value = serde_json::from_str(&line.to_json()).expect("JSON");
        assert_eq!(v["Environment"], "prod");
        assert_eq!(v["Service"], "api");
        assert_eq!(v["Requests"], 42.0);
        assert_eq!(v["BusyRatio"], 0.25);
        assert_eq!(v["Shed"], 3.0);
        let aws = &v["_aws"];
        assert_eq!(aws["Timestamp"], 1_764_600_000_123_u64);
        let directive = &aws["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "Breakwater");
        assert_eq!(directive["Dimensions"], json!([["Environment", "Service"]]));
        assert_eq!(
            directive["Metrics"],
            json!([
                { "Name": "Requests", "Unit": "Count" },
                { "Name": "BusyRatio", "Unit": "None" },
                { "Name": "Shed", "Unit": "Count" },
            ])
        );
        assert_eq!(line.metric_names().collect::<Vec<_>>(), ["Requests", "BusyRatio", "Shed"]);
    }

    #[test]
    fn a_value_that_is_not_finite_is_left_out() {
        let mut line = Line::new("Breakwater", SystemTime::now());
        line.metric("Known", Unit::Count, 1.0).metric("Unknown", Unit::Seconds, f64::NAN).metric(
            "Endless",
            Unit::Seconds,
            f64::INFINITY,
        );
        let v: Value = serde_json::from_str(&line.to_json()).expect("JSON");
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Metrics"], json!([{ "Name": "Known", "Unit": "Count" }]));
        assert!(v.get("Unknown").is_none() && v.get("Endless").is_none(), "{v}");
    }

    /// Counts its calls and says, in each line, whether the stop had come.
    struct Calls {
        stop: CancellationToken,
        started: std::time::Instant,
    }

    impl Source for Calls {
        async fn lines(&mut self) -> Vec<Line> {
            let mut line = Line::new("Test", SystemTime::now());
            line.count("Stopped", u64::from(self.stop.is_cancelled())).metric(
                "AfterMs",
                Unit::Milliseconds,
                self.started.elapsed().as_secs_f64() * 1e3,
            );
            vec![line]
        }
    }

    #[tokio::test]
    async fn lines_come_each_interval_and_once_more_after_the_stop() {
        let stop = CancellationToken::new();
        let source = Calls { stop: stop.clone(), started: std::time::Instant::now() };
        let written = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
        let publisher = tokio::spawn({
            let (stop, written) = (stop.clone(), written.clone());
            publish_to(source, Duration::from_millis(50), stop, move |lines| {
                let mut w = written.lock().expect("lock");
                w.extend(lines.iter().map(|l| serde_json::from_str::<Value>(&l.to_json()).expect("JSON")));
            })
        });
        tokio::time::sleep(Duration::from_millis(180)).await;
        stop.cancel();
        publisher.await.expect("publisher");
        let written = written.lock().expect("lock");
        assert!(written.len() >= 2, "{written:?}");
        // The first after a whole interval and before the stop; the last after it.
        assert!(written[0]["AfterMs"].as_f64().expect("ms") >= 49.0, "{written:?}");
        let stopped: Vec<f64> = written.iter().map(|v| v["Stopped"].as_f64().expect("flag")).collect();
        assert_eq!(stopped.first(), Some(&0.0), "{stopped:?}");
        assert_eq!(stopped.last(), Some(&1.0), "the last line is written after the stop: {stopped:?}");
    }

    #[test]
    #[should_panic(expected = "given twice")]
    fn a_metric_named_like_a_dimension_is_a_bug() {
        let mut line = Line::new("Breakwater", SystemTime::now()).dimension("Service", "api");
        line.metric("Service", Unit::Count, 1.0);
        let _ = line.to_json();
    }
}
