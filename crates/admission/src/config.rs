//! Settings: plain data with defaults that need no tuning. The API parses its environment into these.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

/// How admission decides how much work to let in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The in-flight limit adapts to the service (see [`Algorithm`]).
    #[default]
    Adaptive,
    /// A fixed in-flight ceiling per class ([`ClassConfig::static_limit`]), like the seed's
    /// `BR_MAX_INFLIGHT_REQUESTS=80`. For experiments and comparison.
    Static,
    /// No limit, no queue, no refusal. Requests are still counted and timed, so the same binary
    /// can be measured with and without protection.
    Off,
}

/// The adaptive controller (only used in [`Mode::Adaptive`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Vegas/Gradient2-style: finds the knee (throughput x no-load latency, Little's law) and sits
    /// just above it, so queueing happens in the admission queue, not inside the service. The
    /// latency target is a ceiling. The default: see `docs/ADMISSION.md` for the measurement.
    #[default]
    Gradient,
    /// The seed's rule: additive increase while the window's p95 is under the latency target,
    /// multiplicative decrease when it is not. Holds latency *at* the target rather than at the knee.
    Aimd,
}

/// A mode or algorithm name that is not one of the known ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

impl FromStr for Mode {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "adaptive" => Ok(Self::Adaptive),
            "static" => Ok(Self::Static),
            "off" => Ok(Self::Off),
            other => Err(ParseError(format!("unknown admission mode {other:?} (expected adaptive, static or off)"))),
        }
    }
}

impl FromStr for Algorithm {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gradient" => Ok(Self::Gradient),
            "aimd" => Ok(Self::Aimd),
            other => Err(ParseError(format!("unknown admission algorithm {other:?} (expected gradient or aimd)"))),
        }
    }
}

/// Index of a route class in [`AdmissionConfig::classes`]. The classifier returns one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ClassId(pub(crate) u16);

impl ClassId {
    /// The first class, present in every configuration.
    pub const DEFAULT: ClassId = ClassId(0);

    /// The class's position in [`AdmissionConfig::classes`].
    #[must_use]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Settings of one route class: its own limit, queue and latency target, so that cheap reads
/// never wait behind expensive lists.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassConfig {
    /// Name shown in snapshots and metrics (`default`, `reads`, `lists`...).
    pub name: String,
    /// The p95 latency the operator wants for admitted work. The only number to configure:
    /// the in-flight limit is derived from the service. Default 200 ms.
    pub latency_target: Duration,
    /// The fixed ceiling used in [`Mode::Static`]. Default 80 (the seed's default). 0 admits
    /// nothing: with no queue, every request of the class is refused at once, which is how the
    /// lab measures what a refusal costs.
    pub static_limit: usize,
    /// Where the adaptive limit starts. Default 10: low enough not to swamp a quarter-core task
    /// (whose right number was 5), high enough that startup doubling reaches hundreds in a second.
    pub initial_limit: usize,
    /// The adaptive limit never goes below this. Default 2.
    pub min_limit: usize,
    /// The adaptive limit never goes above this. Default 1000.
    pub max_limit: usize,
    /// Waiters beyond the limit. Small on purpose: a queue only absorbs bursts; a full queue is an
    /// immediate `load_shed`. Default 32: room for one waiter each from a few dozen tenants.
    pub queue_capacity: usize,
    /// Longest a request may wait in the queue before `queue_timeout`. Default 100 ms, half the
    /// target, so a wait plus a normal service time still meets it.
    pub max_queue_wait: Duration,
    /// The longest `Retry-After` a refusal of this class gives, in whole seconds from 1 to
    /// [`LONGEST_RETRY_AFTER`] (the default). A class whose clients must all be back within a
    /// bound (the API's event streams after a restart) sets it lower.
    pub longest_retry_after: u32,
}

/// The longest `Retry-After` any refusal gives, in seconds: a sustained flood is told to back off
/// for at most a minute.
pub const LONGEST_RETRY_AFTER: u32 = 60;

impl ClassConfig {
    /// A class with the default settings and the given name.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }
}

impl Default for ClassConfig {
    fn default() -> Self {
        Self {
            name: "default".to_owned(),
            latency_target: Duration::from_millis(200),
            static_limit: 80,
            initial_limit: 10,
            min_limit: 2,
            max_limit: 1000,
            queue_capacity: 32,
            max_queue_wait: Duration::from_millis(100),
            longest_retry_after: LONGEST_RETRY_AFTER,
        }
    }
}

/// Everything admission needs. `Default` is the configuration to run in production.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// Adaptive, static or off. Default adaptive.
    pub mode: Mode,
    /// Which adaptive controller. Default [`Algorithm::Gradient`].
    pub algorithm: Algorithm,
    /// How far the gradient controller moves toward its new estimate each window (0..=1).
    /// Higher reacts faster, lower is steadier. Default 0.5.
    pub smoothing: f64,
    /// Shortest controller window. A window also lasts at least three no-load latencies and
    /// [`Self::window_samples`] completions, so the controller never decides on too little
    /// evidence. Default 50 ms.
    pub window: Duration,
    /// Fewest completions a controller window needs. Default 16.
    pub window_samples: u32,
    /// CoDel interval: when no arrival has found a free slot for this long (or the last window
    /// was offered over 25% more than it admitted), the class is in sustained overload. Then
    /// the tenants causing it (the only one, or any holding over twice its share of slots) get
    /// [`Self::overload_wait`], are served newest first, and may queue no more than drains
    /// within that wait. Default 100 ms (the interval of Facebook's "Fail at Scale").
    pub codel_interval: Duration,
    /// The shortened wait in sustained overload. Default 5 ms (Facebook's value): at 2x, half
    /// the refusals are waiters that timed out, so this bounds their latency.
    pub overload_wait: Duration,
    /// Serve a flooding tenant's newest waiter first during sustained overload (adaptive LIFO),
    /// so admitted work is fresh work whose client is still there. Default true.
    pub adaptive_lifo: bool,
    /// Route classes; the classifier returns an index into this list. Never empty: the first is
    /// [`ClassId::DEFAULT`]. Default: one class named `default`.
    pub classes: Vec<ClassConfig>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Adaptive,
            algorithm: Algorithm::Gradient,
            smoothing: 0.5,
            window: Duration::from_millis(50),
            window_samples: 16,
            codel_interval: Duration::from_millis(100),
            overload_wait: Duration::from_millis(5),
            adaptive_lifo: true,
            classes: vec![ClassConfig::default()],
        }
    }
}

impl AdmissionConfig {
    /// Appends a route class and returns its id, for building the classifier.
    pub fn add_class(&mut self, class: ClassConfig) -> ClassId {
        self.classes.push(class);
        ClassId(u16::try_from(self.classes.len() - 1).unwrap_or(u16::MAX))
    }

    /// The id of the class with this name.
    #[must_use]
    pub fn class_id(&self, name: &str) -> Option<ClassId> {
        let index = self.classes.iter().position(|c| c.name == name)?;
        u16::try_from(index).ok().map(ClassId)
    }

    /// Sets the latency target of every class (the usual single setting).
    pub fn set_latency_target(&mut self, target: Duration) {
        for class in &mut self.classes {
            class.latency_target = target;
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.classes.is_empty() {
            return Err(ConfigError("at least one route class is required".into()));
        }
        if self.classes.len() > usize::from(u16::MAX) {
            return Err(ConfigError("too many route classes".into()));
        }
        if !(0.0..=1.0).contains(&self.smoothing) || self.smoothing == 0.0 {
            return Err(ConfigError("smoothing must be in (0, 1]".into()));
        }
        for c in &self.classes {
            let bad = |what: &str| Err(ConfigError(format!("class {:?}: {what}", c.name)));
            if c.min_limit == 0 || c.min_limit > c.max_limit {
                return bad("need 1 <= min_limit <= max_limit");
            }
            if c.initial_limit < c.min_limit || c.initial_limit > c.max_limit {
                return bad("need min_limit <= initial_limit <= max_limit");
            }
            if c.latency_target.is_zero() {
                return bad("latency_target must be positive");
            }
            if !(1..=LONGEST_RETRY_AFTER).contains(&c.longest_retry_after) {
                return bad(&format!("need 1 <= longest_retry_after <= {LONGEST_RETRY_AFTER}"));
            }
        }
        Ok(())
    }
}

/// A configuration that cannot work (for example `min_limit > max_limit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid admission config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes_and_algorithms() {
        assert_eq!("Adaptive".parse::<Mode>(), Ok(Mode::Adaptive));
        assert_eq!(" off ".parse::<Mode>(), Ok(Mode::Off));
        assert_eq!("static".parse::<Mode>(), Ok(Mode::Static));
        assert!("fast".parse::<Mode>().is_err());
        assert_eq!("aimd".parse::<Algorithm>(), Ok(Algorithm::Aimd));
        assert_eq!("gradient".parse::<Algorithm>(), Ok(Algorithm::Gradient));
    }

    #[test]
    fn rejects_inconsistent_limits() {
        let mut cfg = AdmissionConfig::default();
        assert!(cfg.validate().is_ok());
        cfg.smoothing = 0.0;
        assert!(cfg.validate().is_err());
        cfg.smoothing = 0.5;
        for (longest, ok) in [(0, false), (1, true), (LONGEST_RETRY_AFTER, true), (LONGEST_RETRY_AFTER + 1, false)] {
            cfg.classes[0].longest_retry_after = longest;
            assert_eq!(cfg.validate().is_ok(), ok, "longest_retry_after {longest}");
        }
        cfg.classes[0].min_limit = 50;
        assert!(cfg.validate().is_err());
        cfg.classes.clear();
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn class_ids_follow_the_list() {
        let mut cfg = AdmissionConfig::default();
        let lists = cfg.add_class(ClassConfig::new("lists"));
        assert_eq!(lists.index(), 1);
        assert_eq!(cfg.class_id("lists"), Some(lists));
        assert_eq!(cfg.class_id("default"), Some(ClassId::DEFAULT));
        assert_eq!(cfg.class_id("nope"), None);
    }
}
