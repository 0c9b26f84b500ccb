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
        let bounds = Bounds { min: usize_f64(class.min_limit), max: usize_f64(class.max_limit) };
        let initial = usize_f64(class.initial_limit);
        let target = class.latency_target.as_secs_f64();
        match (cfg.mode, cfg.algorithm) {
            (Mode::Off, _) => Self::Off,
            (Mode::Static, _) => Self::Fixed(class.static_limit),
            (Mode::Adaptive, Algorithm::Aimd) => Self::Aimd(Aimd { limit: initial, bounds, target }),
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

    /// Still finding the first limit (gradient startup).
    pub(crate) fn starting(&self) -> bool {
        matches!(self, Self::Gradient(g) if g.startup)
    }

    /// Whether window summaries change the limit.
    pub(crate) fn adapts(&self) -> bool {
        matches!(self, Self::Aimd(_) | Self::Gradient(_))
    }

    /// Shortest window worth deciding on: long enough for in-flight work to turn over.
    pub(crate) fn window_floor(&self) -> f64 {
        self.baseline().map_or(0.0, |b| 2.0 * b)
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
/// pinned low to re-measure nor creeps up under sustained load. `docs/ADMISSION.md` has the
/// long version.
///
/// * The knee of a service is where more concurrency stops adding throughput; by Little's law it
///   sits at `throughput x no-load latency`. The limit aims at `HEADROOM` times that, so the
///   service is always busy but work beyond it waits in the admission queue (where it can be
///   ordered, made fair and timed out) instead of inside the service.
/// * `q = mean latency / baseline` says whether work is queueing inside the service (Vegas's
///   queue estimate, as a ratio). With a queue, the limit moves (by `smoothing`) toward
///   `HEADROOM x in-flight / q + QUEUE_ALLOWANCE`: the knee by Little's law, plus two requests
///   allowed to queue inside the service (Vegas's alpha), so that a small knee (a quarter-core
///   task has one of 1-3) does not leave the service idle whenever slow requests hold every
///   slot. Without a queue, and with the last probe showing room, it grows x1.05 per window,
///   accelerating to x1.2.
/// * The baseline comes from *probes*: every sixth window the limit runs at 0.9x the knee (the
///   limit less the allowance) for one window, and the latency of work admitted then is the
///   latency just below the knee. A lower one always replaces the baseline; a higher one only if
///   it is flat (latency did not fall with the limit, after a steady window): a genuinely slower
///   service, which our own queue cannot fake. Envoy's filter instead pins the limit to a small
///   constant for a whole measurement interval.
/// * Startup doubles the limit per window until latency rises; if the first doubling doubles
///   latency, the start was above the knee and the limit halves until latency stops following.
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
    /// The last probe was flat: the limit is at or below the knee, growing is safe.
    below_knee: bool,
    /// Latency jumped and no probe has said why yet.
    suspect: bool,
    /// Startup found the initial limit above the knee and is halving down to it.
    descending: bool,
    settling: bool,
    /// Mean latency and limit of the last window before a startup halving.
    descent_ref: (f64, f64),
    doublings: u32,
    growth_streak: u32,
    windows_since_probe: u32,
    probe_sum: f64,
    probe_n: u32,
    mean_before_probe: f64,
    /// The window before the probe had about the same latency as the one before it.
    steady_before_probe: bool,
    /// Mean latency of the last window that was not a probe.
    last_mean: f64,
    /// The target's floor under the limit in force: +1 per window while demand exceeds the
    /// limit and the window's p95 is under [`Self::TARGET_SHARE`] of the target, x0.9 per window
    /// over it.
    target_floor: f64,
}

impl Gradient {
    const HEADROOM: f64 = 1.03;
    /// Requests allowed to queue inside the service on top of the knee: TCP Vegas's alpha (2 in
    /// Linux's `tcp_vegas`); Netflix's Gradient2 has the same term (`queueSize`). Without it a
    /// knee of 1-3 requests, estimated from noisy windows of mixed cheap and slow requests, sits
    /// at the limit's floor: in the lab (a quarter core) the limit was 2 per class at half of
    /// capacity and 1% of requests timed out in the queue behind two slow ones while the CPU
    /// was 40% idle. It costs at most two service times of latency.
    const QUEUE_ALLOWANCE: f64 = 2.0;
    const PROBE_FACTOR: f64 = 0.9;
    const PROBE_EVERY: u32 = 6;
    const PROBE_MIN_SAMPLES: u32 = 8;
    /// `q` at or below this means no queue inside the service. Growth also needs the last
    /// probe to have been flat, so noise in `q` alone never grows the limit.
    const NO_QUEUE: f64 = 1.02;
    /// Startup doubling stops once `q` passes this.
    const STARTUP_EXIT: f64 = 1.25;
    /// Growth per window while there is no queue: x1.05 for three windows in a row, then x1.10,
    /// x1.15, x1.2 at most, so a knee that moved far up (a slower dependency, more CPUs) is
    /// reached in a few windows, while a few noisy windows cannot jump far past a nearby knee.
    const GROWTH_STEP: f64 = 0.05;
    const GROWTH_MAX: f64 = 1.2;
    /// The share of the latency target admitted work may take inside the service before the
    /// target's floor backs off; the rest is the queue's.
    const TARGET_SHARE: f64 = 0.5;
    const BACKOFF: f64 = 0.9;

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
            below_knee: false,
            suspect: false,
            descending: false,
            settling: false,
            descent_ref: (0.0, 0.0),
            doublings: 0,
            growth_streak: 0,
            windows_since_probe: 0,
            probe_sum: 0.0,
            probe_n: 0,
            mean_before_probe: 0.0,
            steady_before_probe: false,
            last_mean: 0.0,
            target_floor: 0.0,
        }
    }

    fn effective_limit(&self) -> usize {
        if self.probing {
            // Below the knee, not just below the aim: without the allowance queued inside, the
            // probe's latency is the no-load latency.
            round(self.bounds.clamp((self.limit - Self::QUEUE_ALLOWANCE).max(1.0) * Self::PROBE_FACTOR))
        } else {
            round(self.bounds.clamp(self.limit.max(self.target_floor)))
        }
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
        let last_mean = std::mem::replace(&mut self.last_mean, w.mean);
        if let Some(v) = self.finish_probe() {
            self.below_knee = v.flat;
            self.suspect = false;
        }
        let base = match self.base {
            None => w.mean,
            // During startup the baseline is a running minimum of window means. After it only
            // probes lower it: a running minimum over every window of a mixed workload sinks
            // to the windows that happened to hold only cheap requests (in the lab, a 0.59 ms
            // baseline under a 1.7 ms p50, which held the limit at its floor).
            Some(b) if w.mean < b && self.startup && !self.descending => w.mean,
            Some(b) => b,
        };
        self.base = Some(base);
        let q = w.mean / base;
        // Little's law: throughput = in-flight / latency, so the knee (throughput x no-load
        // latency) is in-flight / q. Far less noisy than counting completions.
        let knee = Self::HEADROOM * w.in_flight / q;
        let aim = knee + Self::QUEUE_ALLOWANCE;
        let throughput = w.in_flight / w.mean;
        let before = self.limit;

        if self.startup {
            self.startup_window(w, q, aim);
        } else if after_probe {
            // This window's completions were admitted under the probe's lower limit: they tell
            // about the baseline (done above), not about where the limit should be.
        } else {
            self.steady_window(w, q, aim);
        }
        if w.limited && base < self.target {
            // Never admit more than could finish within the target at this throughput.
            self.limit = self.limit.min((throughput * self.target).max(knee));
        }
        let floor = if self.descending { 0.25 } else { 0.5 };
        self.limit = self.bounds.clamp(self.limit.max(before * floor));
        if !self.startup {
            self.steer_by_target(w);
        }

        if !self.startup {
            self.schedule_probe(w, after_probe, last_mean);
        }
    }

    /// One startup window, whose latency ratio to the baseline is `q`: the limit doubles while
    /// demand exceeds it and latency holds, and startup ends at `aim` once latency rises. If the
    /// first doubling showed the start was above the knee, the limit comes down instead, halving
    /// until latency stops following it, and startup ends there.
    fn startup_window(&mut self, w: &WindowSummary, q: f64, aim: f64) {
        if std::mem::take(&mut self.settling) {
            // The first window after halving still completes work admitted before it.
        } else if self.descending {
            let (ref_mean, ref_limit) = self.descent_ref;
            if w.mean / ref_mean < 1.25 * (self.limit / ref_limit) {
                // Latency fell in proportion to the limit: still above the knee. Halve again.
                self.descent_ref = (w.mean, self.limit);
                self.base = Some(w.mean);
                self.limit *= 0.5;
                self.settling = true;
            } else {
                // Latency stopped following the limit down: this window ran at or below
                // the knee, so its latency is the no-load latency.
                self.base = Some(w.mean);
                self.startup = false;
                self.below_knee = true;
                self.probe_next = true;
            }
        } else if q > Self::STARTUP_EXIT {
            if q > 1.6 && self.doublings == 1 && self.limit >= 4.0 * self.bounds.min {
                // The first doubling nearly doubled latency: the initial limit was already
                // above the knee, so the baseline measured at it is too high. Halve until
                // latency stops halving with the limit.
                self.descending = true;
                self.settling = true;
                self.descent_ref = (w.mean, self.limit);
                self.limit *= 0.25;
            } else {
                self.startup = false;
                self.limit = aim;
                self.probe_next = true;
            }
        } else if w.limited {
            self.limit *= 2.0;
            self.doublings += 1;
        }
    }

    /// One window after startup (not the one right after a probe), whose latency ratio to the
    /// baseline is `q`: the limit grows while there is no queue and the last probe showed room;
    /// otherwise it moves toward `aim`, and a probe is asked for when capacity may have grown
    /// or latency jumped.
    fn steady_window(&mut self, w: &WindowSummary, q: f64, aim: f64) {
        let may_probe = self.windows_since_probe >= 2;
        if q <= Self::NO_QUEUE && w.limited && self.below_knee {
            self.growth_streak += 1;
            let steps = f64::from(self.growth_streak.saturating_sub(2).max(1));
            self.limit *= (1.0 + Self::GROWTH_STEP * steps).min(Self::GROWTH_MAX);
        } else {
            self.growth_streak = 0;
            if q <= Self::NO_QUEUE && w.limited && may_probe {
                // No queue, yet the last probe did not show room: has capacity grown?
                self.probe_next = true;
            }
            // At the aim, `QUEUE_ALLOWANCE` requests queue inside the service, so `q` settles
            // at about limit / (limit - allowance); a jump is half again beyond that.
            let settled_q = self.limit / (self.limit - Self::QUEUE_ALLOWANCE).max(1.0);
            if q > 1.5 * Self::HEADROOM * settled_q && !self.suspect && may_probe {
                // A jump in latency: our own queue (capacity fell), or a slower service (the
                // knee moved up)? Only a probe tells; until it does, step down gently.
                self.suspect = true;
                self.probe_next = true;
            }
            let mut target = aim;
            if self.suspect {
                target = target.max(self.limit * Self::PROBE_FACTOR);
            }
            self.limit += self.smoothing * (target - self.limit);
        }
    }

    /// Counts a window after startup and starts a probe for the next one when one is due: asked
    /// for, or `PROBE_EVERY` windows since the last. `last_mean` is the mean latency of the
    /// window before this one.
    fn schedule_probe(&mut self, w: &WindowSummary, after_probe: bool, last_mean: f64) {
        self.windows_since_probe += 1;
        // A probe is compared with the window before it, which must have run at the full
        // limit: never the window right after another probe.
        let due = self.probe_next || self.windows_since_probe >= Self::PROBE_EVERY;
        // While the target's floor holds the limit above the estimate, a probe below the knee
        // would only throw throughput away: the floor, not the baseline, decides the limit.
        let floor_rules = self.target_floor > self.limit;
        if due && !after_probe && !floor_rules {
            self.probe_next = false;
            self.probing = true;
            self.mean_before_probe = w.mean;
            self.steady_before_probe = (w.mean / last_mean - 1.0).abs() < 0.05;
        }
    }

    /// The target's floor: work that would meet the target is admitted even past the knee. The
    /// knee is where more concurrency stops lowering latency, not where it stops paying: under a
    /// CPU quota, a process that the quota freezes serves what piled up in one batch, at less
    /// CPU per request, so throughput keeps rising past the knee the latency shows (a quarter-core
    /// task: 2-3 in flight at the knee, 25% more 2xx/s at 20-50). So while demand exceeds the
    /// limit and admitted work finishes within [`Self::TARGET_SHARE`] of the target, the floor
    /// rises by one per window, and it backs off x0.9 per window over that. The other share is
    /// the admission queue's: the longest wait is half the target too. The knee estimate goes on
    /// underneath and takes over when the floor falls below it.
    fn steer_by_target(&mut self, w: &WindowSummary) {
        if w.p95 > Self::TARGET_SHARE * self.target {
            self.target_floor *= Self::BACKOFF;
        } else if w.limited {
            self.target_floor = self.target_floor.max(self.limit) + 1.0;
        }
        self.target_floor = self.bounds.clamp(self.target_floor);
    }

    /// Folds a completed probe into the baseline and says what it showed about the knee.
    fn finish_probe(&mut self) -> Option<Verdict> {
        if self.probe_n < Self::PROBE_MIN_SAMPLES {
            return None;
        }
        let p = self.probe_sum / f64::from(self.probe_n);
        self.probe_sum = 0.0;
        self.probe_n = 0;
        let before = self.mean_before_probe;
        // Flat: latency did not move with the limit, so the limit was at or below the knee.
        let flat = p >= 0.97 * before;
        if p > 1.05 * before || (flat && !self.steady_before_probe) {
            // Latency rose while the limit fell, or was moving before the probe: the service
            // is changing under us, and comparing the probe with the window before it could
            // mislead. Probe again.
            self.probe_next = true;
            return None;
        }
        let base = self.base.unwrap_or(p);
        if p <= base {
            // The service is faster than we thought: lowering the baseline is always safe.
            self.base = Some(p);
        } else if flat {
            // Below the knee and slower than the baseline: the no-load latency rose (a slower
            // dependency). Only a steady window before the probe gets here, so a capacity
            // change in mid-probe cannot pass for this.
            self.base = Some(p);
        }
        // Otherwise latency fell with the limit: the probe was still queued, so `p` is only an
        // upper bound of the no-load latency, which the baseline already is below.
        Some(Verdict { flat })
    }
}

/// What a finished probe showed.
#[derive(Clone, Copy, Debug)]
struct Verdict {
    flat: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic service with a sharp knee: `capacity` per second, `base` seconds alone.
    fn window(limit: usize, capacity: f64, base: f64) -> WindowSummary {
        let l = usize_f64(limit);
        let throughput = (l / base).min(capacity);
        let mean = l / throughput;
        WindowSummary { elapsed: 0.2, completed: 100, mean, p95: mean, in_flight: l, limited: true }
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

    /// The knee finder alone: a target below the service's no-load latency (50 ms) keeps the
    /// target's floor at zero.
    fn gradient(initial: usize) -> Controller {
        gradient_with_target(initial, std::time::Duration::from_millis(20))
    }

    fn gradient_with_target(initial: usize, target: std::time::Duration) -> Controller {
        let cfg = AdmissionConfig::default();
        let class = ClassConfig { initial_limit: initial, latency_target: target, ..ClassConfig::default() };
        Controller::new(&cfg, &class)
    }

    #[test]
    fn gradient_finds_the_knee_from_below_and_above() {
        // Knee = 400/s x 50 ms = 20; the aim is the knee x 1.03 plus the allowance, 22.6.
        for initial in [2, 10, 100, 400] {
            let mut g = gradient(initial);
            run(&mut g, 60, 400.0, 0.05);
            let est = g.estimate().unwrap_or(0.0);
            assert!((20.0..=26.0).contains(&est), "from {initial}: {est}");
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
    fn the_target_floor_admits_past_the_knee_and_backs_off_over_its_share() {
        // Knee 20 (400/s x 50 ms): a 200 ms target lets the limit rise until admitted work takes
        // its share, 100 ms: 40 in flight at 400/s.
        let mut g = gradient_with_target(10, std::time::Duration::from_millis(200));
        run(&mut g, 200, 400.0, 0.05);
        let limit = usize_f64(g.limit());
        assert!((36.0..=44.0).contains(&limit), "limit in force {limit}");
        let knee = g.estimate().unwrap_or(0.0);
        assert!((18.0..=28.0).contains(&knee), "the knee estimate goes on underneath: {knee}");
        // Capacity halves: latency at 40 in flight doubles past the share, the floor backs off.
        run(&mut g, 100, 200.0, 0.05);
        let limit = usize_f64(g.limit());
        assert!((16.0..=23.0).contains(&limit), "limit in force after halving {limit}");
    }

    #[test]
    fn aimd_backs_off_when_p95_exceeds_target() {
        let cfg = AdmissionConfig { algorithm: Algorithm::Aimd, ..AdmissionConfig::default() };
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
