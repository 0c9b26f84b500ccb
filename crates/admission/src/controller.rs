//! The limit controllers. Pure arithmetic on window summaries (no clock, no locks), called by
//! the class state under its lock once per window and, for AIMD, once per sample.

use crate::config::{AdmissionConfig, Algorithm, ClassConfig, Mode};

/// What one controller window saw. Times in seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WindowSummary {
    pub(crate) elapsed: f64,
    pub(crate) completed: u32,
    pub(crate) mean: f64,
    pub(crate) p95: f64,
    /// Time-weighted mean of the in-flight count.
    pub(crate) in_flight: f64,
    /// Some arrival found the limit reached (it queued or was refused): demand exceeded the limit,
    /// so throughput in this window says something about capacity.
    pub(crate) limited: bool,
}

#[derive(Debug)]
pub(crate) enum Controller {
    Off,
    Fixed(usize),
    Aimd(Aimd),
    Gradient(Gradient),
}

impl Controller {
    pub(crate) fn new(cfg: &AdmissionConfig, class: &ClassConfig) -> Self {
        let bounds = Bounds {
            min: usize_f64(class.min_limit),
            max: usize_f64(class.max_limit),
        };
        let initial = usize_f64(class.initial_limit);
        let target = class.latency_target.as_secs_f64();
        match (cfg.mode, cfg.algorithm) {
            (Mode::Off, _) => Self::Off,
            (Mode::Static, _) => Self::Fixed(class.static_limit),
            (Mode::Adaptive, Algorithm::Aimd) => Self::Aimd(Aimd {
                limit: initial,
                bounds,
                target,
            }),
            (Mode::Adaptive, Algorithm::Gradient) => {
                Self::Gradient(Gradient::new(initial, bounds, target, cfg.smoothing))
            }
        }
    }

    /// The ceiling on in-flight work right now.
    pub(crate) fn limit(&self) -> usize {
        match self {
            Self::Off => usize::MAX,
            Self::Fixed(n) => *n,
            Self::Aimd(a) => round(a.limit),
            Self::Gradient(g) => g.effective_limit(),
        }
    }

    /// The controller's estimate (for the snapshot); differs from `limit` during a probe.
    pub(crate) fn estimate(&self) -> Option<f64> {
        match self {
            Self::Off => None,
            Self::Fixed(n) => Some(usize_f64(*n)),
            Self::Aimd(a) => Some(a.limit),
            Self::Gradient(g) => Some(g.limit),
        }
    }

    /// The estimated no-load latency, seconds (gradient only).
    pub(crate) fn baseline(&self) -> Option<f64> {
        match self {
            Self::Gradient(g) => g.base,
            _ => None,
        }
    }

    /// Whether admissions now belong to a baseline probe (gradient only).
    pub(crate) fn probing(&self) -> bool {
        matches!(self, Self::Gradient(g) if g.probing)
    }

    pub(crate) fn adapts(&self) -> bool {
        matches!(self, Self::Aimd(_) | Self::Gradient(_))
    }

    /// Shortest window worth deciding on: long enough for in-flight work to turn over.
    pub(crate) fn window_floor(&self) -> f64 {
        self.baseline().map_or(0.0, |b| 3.0 * b)
    }

    pub(crate) fn on_sample(&mut self, rtt: f64, probe: bool, limited: bool) {
        match self {
            Self::Aimd(a) => a.on_sample(rtt, limited),
            Self::Gradient(g) if probe => {
                g.probe_sum += rtt;
                g.probe_n += 1;
            }
            _ => {}
        }
    }

    pub(crate) fn on_window(&mut self, w: &WindowSummary) {
        match self {
            Self::Aimd(a) => a.on_window(w),
            Self::Gradient(g) => g.on_window(w),
            Self::Off | Self::Fixed(_) => {}
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    min: f64,
    max: f64,
}

impl Bounds {
    fn clamp(self, x: f64) -> f64 {
        x.clamp(self.min, self.max)
    }
}

#[allow(clippy::cast_precision_loss)]
fn usize_f64(n: usize) -> f64 {
    n as f64
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn round(x: f64) -> usize {
    // Limits are clamped to [min, max] (both usize) before they get here.
    x.round().max(1.0) as usize
}

/// The seed's rule, with the p95 of a window as the congestion signal: +1/limit per fast sample
/// while demand exceeds the limit (about +1 per round trip), x0.9 once per window whose p95 is
/// over the target.
#[derive(Debug)]
pub(crate) struct Aimd {
    limit: f64,
    bounds: Bounds,
    target: f64,
}

impl Aimd {
    const BACKOFF: f64 = 0.9;

    fn on_sample(&mut self, rtt: f64, limited: bool) {
        if limited && rtt <= self.target {
            self.limit = self.bounds.clamp(self.limit + 1.0 / self.limit);
        }
    }

    fn on_window(&mut self, w: &WindowSummary) {
        if w.p95 > self.target {
            self.limit = self.bounds.clamp(self.limit * Self::BACKOFF);
        }
    }
}

/// Knee finder in the Vegas / Gradient2 family, with a baseline that neither needs the limit
/// pinned low to re-measure nor creeps up under sustained load.
///
/// * The knee of a service is where more concurrency stops adding throughput; by Little's law it
///   sits at `throughput x no-load latency`. The limit aims at `HEADROOM` times that, so the
///   service is always busy but work beyond it waits in the admission queue (where it can be
///   ordered, made fair and timed out) instead of inside the service.
/// * `q = mean latency / baseline` says whether work is queueing inside the service (Vegas's
///   queue estimate, as a ratio). No queue and demand above the limit: grow x1.2 per window.
///   Queue: move (by `smoothing`) toward the knee estimate.
/// * The baseline comes from *probes*: every few windows the limit runs at 0.8x its estimate for
///   one window, and the latency of work admitted during that window is the latency below the
///   knee. That is how a genuinely slower service raises the baseline, while queueing caused by
///   our own limit cannot (the probe runs below the knee). A 0.8x probe for one window in six
///   costs a few percent of admissions under overload, nothing below it; Envoy's filter instead
///   pins the limit to a small constant for a whole measurement interval.
/// * A probe whose latency fell in proportion to the limit shows the knee is lower still: the
///   limit steps down 0.8x and probes again (fast descent from a too-high start).
/// * The latency target is a ceiling: never more in flight than could finish within the target
///   at the measured throughput (Little's law again), unless that is below the knee.
#[derive(Debug)]
pub(crate) struct Gradient {
    limit: f64,
    bounds: Bounds,
    target: f64,
    smoothing: f64,
    base: Option<f64>,
    startup: bool,
    probing: bool,
    probe_next: bool,
    just_probed: bool,
    windows_since_probe: u32,
    probe_sum: f64,
    probe_n: u32,
    mean_before_probe: f64,
}

impl Gradient {
    const HEADROOM: f64 = 1.1;
    const PROBE_FACTOR: f64 = 0.8;
    const PROBE_EVERY: u32 = 6;
    const PROBE_MIN_SAMPLES: u32 = 8;
    /// `q` at or below this means no queue inside the service.
    const NO_QUEUE: f64 = 1.05;
    /// Startup doubling stops once `q` passes this.
    const STARTUP_EXIT: f64 = 1.25;
    const GROWTH: f64 = 1.1;

    fn new(initial: f64, bounds: Bounds, target: f64, smoothing: f64) -> Self {
        Self {
            limit: bounds.clamp(initial),
            bounds,
            target,
            smoothing,
            base: None,
            startup: true,
            probing: false,
            probe_next: false,
            just_probed: false,
            windows_since_probe: 0,
            probe_sum: 0.0,
            probe_n: 0,
            mean_before_probe: 0.0,
        }
    }

    fn effective_limit(&self) -> usize {
        let factor = if self.probing {
            Self::PROBE_FACTOR
        } else {
            1.0
        };
        round(self.bounds.clamp(self.limit * factor))
    }

    fn on_window(&mut self, w: &WindowSummary) {
        if w.completed == 0 || w.elapsed <= 0.0 {
            return;
        }
        if self.probing {
            // This window ran below the estimate: its throughput says nothing about capacity.
            // The work it admitted is judged when it has completed (next window).
            self.probing = false;
            self.just_probed = true;
            self.windows_since_probe = 0;
            return;
        }
        let after_probe = std::mem::take(&mut self.just_probed);
        let above_knee = self.finish_probe();
        let base = match self.base {
            None => w.mean,
            // A window mean below the baseline means the service got faster (or noise): follow
            // halfway, or all the way during startup where the baseline is a running minimum.
            Some(b) if w.mean < b && self.startup => w.mean,
            Some(b) if w.mean < b && !after_probe => b + 0.5 * (w.mean - b),
            Some(b) => b,
        };
        self.base = Some(base);
        let q = w.mean / base;
        // Little's law: throughput = in-flight / latency, so the knee (throughput x no-load
        // latency) is in-flight / q. Far less noisy than counting completions.
        let knee = Self::HEADROOM * w.in_flight / q;
        let throughput = w.in_flight / w.mean;
        let before = self.limit;

        if self.startup {
            if q > Self::STARTUP_EXIT {
                self.startup = false;
                self.limit = knee;
                self.probe_next = true;
            } else if w.limited {
                self.limit *= 2.0;
            }
        } else if above_knee {
            self.limit *= Self::PROBE_FACTOR;
            self.probe_next = true;
        } else if after_probe {
            // This window's completions were admitted under the probe's lower limit: they tell
            // about the baseline (done above), not about where the limit should be.
        } else if q <= Self::NO_QUEUE {
            if w.limited {
                self.limit *= Self::GROWTH;
            }
        } else {
            self.limit += self.smoothing * (knee - self.limit);
            if q > 1.5 * Self::HEADROOM && self.windows_since_probe >= 2 {
                // A jump in latency: our queue, or a slower service? A probe tells.
                self.probe_next = true;
            }
        }
        if w.limited && base < self.target {
            // Never admit more than could finish within the target at this throughput.
            self.limit = self.limit.min((throughput * self.target).max(knee));
        }
        self.limit = self.bounds.clamp(self.limit.max(before * 0.5));

        if !self.startup {
            self.windows_since_probe += 1;
            if self.probe_next || self.windows_since_probe >= Self::PROBE_EVERY {
                self.probe_next = false;
                self.probing = true;
                self.mean_before_probe = w.mean;
            }
        }
    }

    /// Folds a completed probe into the baseline; true when the probe shows the limit is still
    /// above the knee (latency fell in proportion to the limit).
    fn finish_probe(&mut self) -> bool {
        if self.probe_n < Self::PROBE_MIN_SAMPLES {
            return false;
        }
        let p = self.probe_sum / f64::from(self.probe_n);
        self.probe_sum = 0.0;
        self.probe_n = 0;
        let before = self.mean_before_probe;
        let base = self.base.unwrap_or(p);
        // Proportional (saturated even at 0.8x) and below the baseline we had: that baseline was
        // measured above the knee (a too-high start). Both conditions, so noise alone rarely fires.
        let above_knee = !self.startup && p < 0.83 * before && p < 0.97 * base;
        if p < base || p >= 0.95 * before {
            // Lower: the service is faster than we thought. Flat (latency did not move with the
            // limit): we were below the knee, so this is the no-load latency, higher or not.
            self.base = Some(p);
        }
        // Otherwise latency fell with the limit: the probe was still queued, and `p` is only an
        // upper bound of the no-load latency, which the baseline already is below.
        above_knee
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic service with a sharp knee: `capacity` per second, `base` seconds alone.
    fn window(limit: usize, capacity: f64, base: f64) -> WindowSummary {
        let l = usize_f64(limit);
        let throughput = (l / base).min(capacity);
        let mean = l / throughput;
        WindowSummary {
            elapsed: 0.2,
            completed: 100,
            mean,
            p95: mean,
            in_flight: l,
            limited: true,
        }
        .with_throughput(throughput)
    }

    impl WindowSummary {
        fn with_throughput(mut self, x: f64) -> Self {
            // Round to whole completions: the controller only ever sees counts.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = (x * self.elapsed).round() as u32;
            self.completed = n.max(1);
            self
        }
    }

    fn run(g: &mut Controller, windows: usize, capacity: f64, base: f64) {
        for _ in 0..windows {
            let lim = g.limit();
            let w = window(lim, capacity, base);
            if g.probing() {
                for _ in 0..10 {
                    g.on_sample(base.max(usize_f64(lim) / capacity), true, true);
                }
            }
            g.on_window(&w);
        }
    }

    fn gradient(initial: usize) -> Controller {
        let cfg = AdmissionConfig::default();
        let class = ClassConfig {
            initial_limit: initial,
            ..ClassConfig::default()
        };
        Controller::new(&cfg, &class)
    }

    #[test]
    fn gradient_finds_the_knee_from_below_and_above() {
        // Knee = 400/s x 50 ms = 20.
        for initial in [2, 10, 100, 400] {
            let mut g = gradient(initial);
            run(&mut g, 60, 400.0, 0.05);
            let est = g.estimate().unwrap_or(0.0);
            assert!((16.0..=24.0).contains(&est), "from {initial}: {est}");
        }
    }

    #[test]
    fn gradient_follows_a_slower_dependency_up() {
        // Latency doubles without capacity changing: the knee doubles (20 -> 40).
        let mut g = gradient(10);
        run(&mut g, 40, 400.0, 0.05);
        run(&mut g, 40, 400.0, 0.10);
        let est = g.estimate().unwrap_or(0.0);
        assert!((32.0..=48.0).contains(&est), "{est}");
        assert!(g.baseline().is_some_and(|b| (b - 0.10).abs() < 0.01));
    }

    #[test]
    fn aimd_backs_off_when_p95_exceeds_target() {
        let cfg = AdmissionConfig {
            algorithm: Algorithm::Aimd,
            ..AdmissionConfig::default()
        };
        let mut c = Controller::new(&cfg, &ClassConfig::default());
        for _ in 0..100 {
            c.on_sample(0.01, false, true);
        }
        let grown = c.limit();
        assert!(grown > 10);
        c.on_window(&WindowSummary {
            elapsed: 0.1,
            completed: 10,
            mean: 0.3,
            p95: 0.5,
            in_flight: 10.0,
            limited: true,
        });
        assert!(c.limit() < grown);
    }
}
