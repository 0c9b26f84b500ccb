//! The CPU gate: under a CPU quota, keep the process's CPU use below a share of its quota by
//! refusing new work at the door, the heaviest tenants first.
//!
//! Why: a container's CPU limit is a CFS quota (a quarter core is 25 ms of CPU per 100 ms
//! period). Once a period's quota is spent, the whole process is frozen until the next period,
//! whatever admission's in-flight limit says: every request in flight, and every refusal, waits
//! out the freeze. A latency-based limit cannot see that the freeze is not queueing. The gate
//! reads what the quota is measured in, CPU time, once per window (`cpu_window`, 100 ms) and keeps
//! it under `cpu_target` of the quota, so the process is not frozen and answers, including its
//! refusals, stay fast.
//!
//! How: once two windows in a row have used more than the target, the gate shuts: it allows a
//! budget of requests per window, lowered in proportion to the overshoot and raised by at most 10%
//! a window while under it (steering by the mean of the last windows' use); once demand has
//! fitted in the budget for ten windows the gate opens. The budget is shared between tenants
//! max-min fairly (water filling over each tenant's arrival rate), and each tenant is paced at
//! the water level: a tenant asking for less passes whole, a heavier one has its excess held
//! (up to `cpu_pace`) until its turn, and refused past that. The budget never
//! goes below half of what fits under the target at the CPU cost per request measured while the
//! gate was open: past that, the CPU goes on refusals (which the gate cannot make cheaper) and
//! refusing more would only lose goodput.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::state::lock;

/// CPU time used by the process (its cgroup), for the CPU gate. The API gives one that reads its
/// own cgroup; tests give a simulated one.
pub trait CpuMeter: Send + Sync + 'static {
    /// The quota, in cores (0.25 for a quarter core).
    fn cores(&self) -> f64;
    /// Cumulative CPU time used since some fixed point; `None` when it cannot be read now (the
    /// gate then keeps its last decision).
    fn usage(&self) -> Option<Duration>;
}

/// Windows with demand inside the budget before the gate opens.
const CALM_WINDOWS: u32 = 10;
/// Windows in a row over the target before an open gate shuts: one window's reading swings with
/// a burst of arrivals or where the scheduler's periods fall in it, and a gate shut by a single
/// one held and refused requests at a quarter of the capacity in the lab.
const SHUT_AFTER: u32 = 2;
/// Most the budget grows per window while under the target.
const GROWTH: f64 = 1.10;
/// Most it shrinks per window (a measured overshoot of 2x or more halves it).
const MIN_STEP: f64 = 0.5;
/// The budget's floor, as a share of what fits under the target at the measured cost.
const FLOOR: f64 = 0.5;
/// Tenants tracked at once; past this, new keys share one slot (a flood of forged keys cannot
/// grow the table).
const MAX_TENANTS: usize = 4096;
/// A gap this many windows long without a request resets the gate to open.
const RESET_GAP: u32 = 5;
/// While shut, the burst a tenant may send at once on top of its pace, in windows of its share.
/// Small: a burst is held (paced) rather than refused, and the bursts of all tenants together
/// mostly stay under the backstop.
const BURST: f64 = 0.2;
/// While shut, what passes (or is held) in one window never exceeds the budget by more than this
/// factor, whatever the shares say (tenants new to the table have no rate yet, and the user's
/// key may not be verified: a client changing its key every window must not walk around the
/// gate). Above
/// `1 + BURST`, so tenants on their schedules seldom reach it: only when the level is a few
/// requests a window, where whole requests round up and tenants that started in the same window
/// stay in phase.
const BACKSTOP: f64 = 1.25;

pub(crate) struct CpuGate {
    meter: Arc<dyn CpuMeter>,
    cores: f64,
    target: f64,
    window: Duration,
    /// The longest a request is held to pace its tenant (0: refuse at once).
    pace: Duration,
    /// Requests finished (slots released) since the last window.
    completed: AtomicU32,
    state: Mutex<GateState>,
}

impl fmt::Debug for CpuGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuGate").field("cores", &self.cores).field("target", &self.target).finish_non_exhaustive()
    }
}

struct Tenant {
    /// Arrivals in this window.
    arrivals: u32,
    /// Arrivals per window, smoothed.
    rate: f64,
    /// While shut, the tenant's theoretical arrival time (GCRA): when its next request would be
    /// on schedule at the water level's rate. A request finding it further ahead than the burst
    /// allows is held until it is not, or refused when that is more than `pace` away.
    tat: Instant,
}

impl Tenant {
    fn new(now: Instant) -> Self {
        Self { arrivals: 0, rate: 0.0, tat: now }
    }
}

/// What the gate decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    /// Pass at this instant, when the tenant's schedule has room for it: it came early, past its
    /// burst (a heavy tenant over its share, or a light one's burst). It is held at most
    /// `cpu_pace`, and never past the client's deadline. A caller that waits for its answer
    /// before sending again is slowed to its share rather than refused.
    Hold(Instant),
    /// Over its share past the pace, or over the backstop: `cpu_quota`.
    Refuse,
    /// Its turn comes within the pace, but not before the client's deadline: refused now, as a
    /// `deadline` refusal, rather than held for an answer nobody waits for.
    Late {
        wait: Duration,
        timeout: Duration,
    },
}

struct GateState {
    last_tick: Instant,
    last_usage: Option<Duration>,
    /// Requests that may pass per window while shut; `None` while the gate is open.
    budget: Option<f64>,
    calm: u32,
    /// Windows in a row whose reading was over the target.
    over: u32,
    /// CPU used in the last window, as a share of the quota.
    utilization: f64,
    /// The same, averaged over the last windows while shut: what the gate steers by.
    smoothed: f64,
    /// CPU seconds per passed request, measured in windows the gate was open.
    cost: Option<f64>,
    /// Requests let through, by the window they go on in: the one in progress first, then the
    /// next ones (held requests).
    released: VecDeque<u32>,
    tenants: HashMap<Option<u64>, Tenant>,
    /// The water level of the last share (requests per window per tenant), while shut.
    level: f64,
    refused: u64,
    held: u64,
    shut_windows: u64,
}

/// The CPU gate's figures, for `/v1/ops/status` and `/metrics`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuSnapshot {
    /// The quota, in cores.
    pub quota_cores: f64,
    /// The share of the quota the gate keeps CPU use under.
    pub target: f64,
    /// CPU used in the last window, as a share of the quota.
    pub utilization: f64,
    /// Whether the gate is shut now (pacing tenants at their shares, refusing past them).
    pub shut: bool,
    /// While shut: requests per second it lets through.
    pub budget_per_sec: Option<f64>,
    /// CPU time per request while the gate was open, microseconds (what the budget's floor is
    /// computed from).
    pub cost_per_request_us: Option<f64>,
    /// Windows spent shut since start.
    pub shut_windows: u64,
    /// Refusals by the gate since start (also counted in the class totals: as `deadline` when the
    /// client's `Request-Timeout` ends before its hold would, as `cpu_quota` otherwise).
    pub refused_total: u64,
    /// Requests the gate held (paced) before letting them through, since start.
    pub held_total: u64,
    /// The configured pace: the longest it holds one, milliseconds (0: it refuses instead).
    pub pace_ms: f64,
}

impl CpuGate {
    pub(crate) fn new(meter: Arc<dyn CpuMeter>, target: f64, window: Duration, pace: Duration, now: Instant) -> Self {
        let cores = meter.cores();
        let last_usage = meter.usage();
        Self {
            meter,
            cores,
            target,
            window,
            pace,
            completed: AtomicU32::new(0),
            state: Mutex::new(GateState {
                last_tick: now,
                last_usage,
                budget: None,
                calm: 0,
                over: 0,
                utilization: 0.0,
                smoothed: 0.0,
                cost: None,
                released: VecDeque::new(),
                tenants: HashMap::new(),
                level: f64::INFINITY,
                refused: 0,
                held: 0,
                shut_windows: 0,
            }),
        }
    }

    /// Whether a request of `tenant` may go on to the class's limit and queue: now, after a
    /// hold, or not at all. `deadline` reads the client's deadline, only if the request would be
    /// held.
    ///
    /// While shut, each tenant is paced at the water level's rate (a GCRA: a fifth of a window's
    /// share may pass at once, the rest on schedule). A request ahead of its tenant's schedule by
    /// up to `pace` (and by less than its deadline) is held until its turn; further ahead,
    /// refused. An open-loop flood is refused at once, beyond a pace's worth of held requests; a
    /// caller that waits for each answer is held a few milliseconds instead of being refused and
    /// coming straight back.
    pub(crate) fn pass(
        &self,
        tenant: Option<u64>,
        now: Instant,
        deadline: impl FnOnce() -> Option<Duration>,
    ) -> Verdict {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        if now.saturating_duration_since(st.last_tick) >= self.window {
            self.tick(st, now);
        }
        let key = if st.tenants.len() >= MAX_TENANTS && !st.tenants.contains_key(&tenant) { None } else { tenant };
        let t = st.tenants.entry(key).or_insert_with(|| Tenant::new(now));
        t.arrivals += 1;
        let Some(budget) = st.budget else {
            *slot(&mut st.released, 0) += 1;
            return Verdict::Pass;
        };
        // One request's share of the schedule (none if the last share found no tenant to share
        // with; a level under one request a window spaces them more than a window apart).
        let spacing = if st.level.is_finite() {
            self.window.mul_f64(1.0 / st.level.max(1e-3)).min(self.window * 1000)
        } else {
            Duration::ZERO
        };
        let burst = self.window.mul_f64(BURST);
        // A schedule left from a lower level (further ahead than a full burst, a full pace and
        // one request at today's spacing, where today's schedule cannot reach) is forgiven down
        // to the end of the pace, so the tenant is not locked out once the level rises.
        let limit = now + burst + self.pace;
        if t.tat > limit + spacing {
            t.tat = limit;
        }
        let tat = t.tat.max(now);
        let early = (tat - now).saturating_sub(burst);
        // Held past the pace, or until the client has given up: refused now instead.
        let too_early = early > self.pace;
        let late = if early.is_zero() || too_early { None } else { deadline().filter(|d| early >= *d) };
        // The backstop counts requests in the window they go on in: a held one's may be the next.
        let released = slot(&mut st.released, self.window_of(st.last_tick, now + early));
        let verdict = if too_early || f64::from(*released) >= budget * BACKSTOP {
            Verdict::Refuse
        } else if let Some(timeout) = late {
            Verdict::Late { wait: early, timeout }
        } else {
            *released += 1;
            t.tat = tat + spacing;
            if early.is_zero() { Verdict::Pass } else { Verdict::Hold(now + early) }
        };
        match verdict {
            Verdict::Refuse | Verdict::Late { .. } => st.refused += 1,
            Verdict::Hold(_) => st.held += 1,
            Verdict::Pass => {}
        }
        verdict
    }

    /// The window (0: the one in progress, since `last_tick`) an instant falls in.
    fn window_of(&self, last_tick: Instant, at: Instant) -> usize {
        let ahead = at.saturating_duration_since(last_tick).as_nanos() / self.window.as_nanos().max(1);
        // At most `pace` ahead (a second at most), so a few dozen windows.
        usize::try_from(ahead).unwrap_or(usize::MAX).min(1024)
    }

    /// A request let through has finished.
    pub(crate) fn completed(&self) {
        self.completed.fetch_add(1, Ordering::Relaxed);
    }

    /// End of a window: measure the CPU, move the budget, share it out.
    fn tick(&self, st: &mut GateState, now: Instant) {
        let dt = now.saturating_duration_since(st.last_tick);
        st.last_tick = now;
        let usage = self.meter.usage();
        let used = match (usage, st.last_usage) {
            (Some(a), Some(b)) => Some(a.saturating_sub(b)),
            _ => None,
        };
        if usage.is_some() {
            st.last_usage = usage;
        }
        // Counts per window of nominal length, whatever this one lasted.
        let scale = self.window.as_secs_f64() / dt.as_secs_f64().max(1e-9);
        // What went on in the windows that ended (one, or a few after a gap), per window.
        let windows = (dt.as_nanos() / self.window.as_nanos().max(1)).clamp(1, 1024);
        let went_on: u32 = (0..windows).map_while(|_| st.released.pop_front()).sum();
        let passed = f64::from(went_on) * scale;
        let done = self.completed.swap(0, Ordering::Relaxed);
        let mut demand = 0.0;
        for t in st.tenants.values_mut() {
            t.rate = 0.5 * t.rate + 0.5 * f64::from(t.arrivals) * scale;
            t.arrivals = 0;
            demand += t.rate;
        }
        st.tenants.retain(|_, t| t.rate >= 0.01);
        if dt >= self.window * RESET_GAP {
            // Idle for a while: whatever was true before is stale.
            st.budget = None;
            st.calm = 0;
            st.over = 0;
            return;
        }
        let Some(used) = used else { return };
        let u = used.as_secs_f64() / (dt.as_secs_f64() * self.cores);
        st.utilization = u;
        // Shut, the gate steers by the mean of the last windows: one window's reading swings
        // with where the scheduler's periods fall in it. Open, it shuts on two windows in a row
        // over the target, so that a flood is met within 200 ms and a burst is not. (In the lab
        // it held CPU use 4-12 points under its target with or without the averaging;
        // docs/ADMISSION.md.)
        st.smoothed = if st.budget.is_some() { 0.5 * st.smoothed + 0.5 * u } else { u };
        let u = st.smoothed;
        // The CPU cost of a request, from windows in which the gate was open (and so refused
        // nothing): CPU used per request
        // finished (finished, not passed: in a throttled window part of the work passed is done
        // in the next one). Refusals by the class limits count into it, so it errs high, and the
        // floor low.
        if st.budget.is_none() && done > 0 && u > 0.2 {
            let cost = used.as_secs_f64() / f64::from(done);
            st.cost = Some(st.cost.map_or(cost, |c| 0.8 * c + 0.2 * cost));
        }
        let floor =
            st.cost.map_or(1.0, |c| (FLOOR * self.target * self.cores * self.window.as_secs_f64() / c).max(1.0));
        st.over = if st.utilization > self.target { st.over.saturating_add(1) } else { 0 };
        let was_shut = st.budget.is_some();
        if u > self.target && (st.budget.is_some() || st.over >= SHUT_AFTER) {
            st.calm = 0;
            // From the budget, unless demand fell well under it (then from what passed).
            let base = st.budget.map_or(passed, |b| if passed < 0.5 * b { passed.max(1.0) } else { b });
            st.budget = Some((base * (self.target / u).max(MIN_STEP)).max(floor));
        } else if let Some(b) = st.budget {
            let grown = b * (self.target / u.max(1e-3)).min(GROWTH);
            st.calm = if demand <= grown { st.calm + 1 } else { 0 };
            st.budget = if st.calm >= CALM_WINDOWS { None } else { Some(grown.max(floor)) };
        }
        if was_shut {
            // The windows that ended shut; a tick late by a few (no request came) counts them all.
            st.shut_windows += u64::try_from(windows).unwrap_or(u64::MAX);
        }
        st.level = share(st.budget, &st.tenants);
    }

    pub(crate) fn snapshot(&self) -> CpuSnapshot {
        let st = lock(&self.state);
        let per_sec = 1.0 / self.window.as_secs_f64();
        // The gate decides on arrivals; after a quiet gap its last decision is stale (the next
        // request resets it), so report what that request will find.
        let idle = Instant::now().saturating_duration_since(st.last_tick) >= self.window * RESET_GAP;
        let budget = if idle { None } else { st.budget };
        CpuSnapshot {
            quota_cores: self.cores,
            target: self.target,
            utilization: if idle { 0.0 } else { st.utilization },
            shut: budget.is_some(),
            budget_per_sec: budget.map(|b| b * per_sec),
            cost_per_request_us: st.cost.map(|c| c * 1e6),
            shut_windows: st.shut_windows,
            refused_total: st.refused,
            held_total: st.held,
            pace_ms: self.pace.as_secs_f64() * 1e3,
        }
    }
}

/// The count of the `w`th window from now, made if need be.
fn slot(released: &mut VecDeque<u32>, w: usize) -> &mut u32 {
    if released.len() <= w {
        released.resize(w + 1, 0);
    }
    &mut released[w]
}

/// Max-min fair shares of `budget` (requests per window) over the tenants' rates: the water
/// level `L` with `sum(min(rate, L)) = budget`. A tenant asking for less than `L` passes whole;
/// the others are paced at `L`. When the budget covers every rate, what is left is shared
/// equally on top of the highest rate: the rates were measured under the gate's pacing, so they
/// understate what the paced tenants would send, and an unlimited level would let them all in
/// at once. Infinite only with the gate open (or nobody to share with).
#[allow(clippy::cast_precision_loss)]
fn share(budget: Option<f64>, tenants: &HashMap<Option<u64>, Tenant>) -> f64 {
    let Some(budget) = budget else { return f64::INFINITY };
    let mut rates: Vec<f64> = tenants.values().map(|t| t.rate).collect();
    rates.sort_by(f64::total_cmp);
    let mut left = budget;
    for (i, rate) in rates.iter().enumerate() {
        let others = (rates.len() - i) as f64;
        if rate * others > left {
            return left / others;
        }
        left -= rate;
    }
    match rates.last() {
        Some(top) => top + left / rates.len() as f64,
        None => f64::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A meter whose usage the test sets.
    struct Fake {
        cores: f64,
        used_us: AtomicU64,
    }

    impl CpuMeter for Fake {
        fn cores(&self) -> f64 {
            self.cores
        }
        fn usage(&self) -> Option<Duration> {
            Some(Duration::from_micros(self.used_us.load(Ordering::Relaxed)))
        }
    }

    fn tenants(rates: &[f64]) -> HashMap<Option<u64>, Tenant> {
        let now = Instant::now();
        rates.iter().enumerate().map(|(i, &rate)| (Some(i as u64), Tenant { rate, ..Tenant::new(now) })).collect()
    }

    #[test]
    fn shares_are_max_min_fair() {
        // One heavy tenant (90) and three light ones (2 each), budget 30: the light ones pass
        // whole, the heavy one gets the remaining 24.
        let t = tenants(&[90.0, 2.0, 2.0, 2.0]);
        assert!((share(Some(30.0), &t) - 24.0).abs() < 1e-9);
        // A budget over the demand limits nobody: the rest goes on top of the highest rate
        // (116 = 90 + (200 - 96) / 4). An open gate limits nobody either.
        assert!((share(Some(200.0), &t) - 116.0).abs() < 1e-9);
        assert!(share(None, &t).is_infinite());
        // Equal tenants over the budget share it equally.
        assert!((share(Some(10.0), &tenants(&[10.0, 10.0])) - 5.0).abs() < 1e-9);
        // Two heavy, one light: the light passes whole, the heavy split the rest.
        assert!((share(Some(30.0), &tenants(&[50.0, 40.0, 4.0])) - 13.0).abs() < 1e-9);
    }

    const QUOTA: f64 = 0.025;

    /// A quarter core's CPU, simulated: at most 25 ms per 100 ms period (the kernel's throttling),
    /// read by the gate through `meter`.
    struct Cpu {
        meter: Arc<Fake>,
        used_in_period: f64,
        /// CPU used while measuring.
        measured: f64,
    }

    impl Cpu {
        fn new() -> Self {
            Self {
                meter: Arc::new(Fake { cores: 0.25, used_us: AtomicU64::new(0) }),
                used_in_period: 0.0,
                measured: 0.0,
            }
        }

        fn gate(&self, pace: Duration, now: Instant) -> CpuGate {
            CpuGate::new(self.meter.clone(), 0.85, Duration::from_millis(100), pace, now)
        }

        /// Spends up to `want` seconds (and at most `room` more), within the period's quota;
        /// returns what was spent.
        fn spend(&mut self, want: f64, room: f64, measuring: bool) -> f64 {
            let c = want.min(room).min(QUOTA - self.used_in_period).max(0.0);
            self.used_in_period += c;
            let us = u64::try_from(Duration::from_secs_f64(c).as_micros()).expect("small");
            self.meter.used_us.fetch_add(us, Ordering::Relaxed);
            if measuring {
                self.measured += c;
            }
            c
        }
    }

    /// Drives the gate with open-loop arrivals at `rates` per second, one tenant each: each passed
    /// request costs `cost` of CPU, each refusal `refusal_cost`, and work past the quota is lost.
    /// A held request is served when its hold ends. Returns (share of the quota used, requests
    /// passed per second, per tenant) over the last `measure` seconds.
    fn drive(
        rates: &[f64],
        cost: Duration,
        refusal_cost: Duration,
        seconds: u32,
        measure: u32,
    ) -> (f64, Vec<f64>, CpuSnapshot) {
        let mut cpu = Cpu::new();
        let start = Instant::now();
        let gate = cpu.gate(Duration::from_millis(50), start);
        let step = Duration::from_millis(1);
        let mut owed = vec![0.0; rates.len()];
        let mut passed = vec![0u64; rates.len()];
        let mut held: Vec<(Instant, usize)> = Vec::new();
        for ms in 0..u64::from(seconds) * 1000 {
            let now = start + step * u32::try_from(ms).expect("small");
            if ms % 100 == 0 {
                cpu.used_in_period = 0.0;
            }
            let measuring = ms >= u64::from(seconds - measure) * 1000;
            let mut serve = |cpu: &mut Cpu, i: usize| {
                let want = cost.as_secs_f64();
                if cpu.spend(want, want, measuring) >= want {
                    gate.completed();
                }
                if measuring {
                    passed[i] += 1;
                }
            };
            let due: Vec<usize> = held.iter().filter(|(at, _)| *at <= now).map(|&(_, i)| i).collect();
            held.retain(|(at, _)| *at > now);
            for i in due {
                serve(&mut cpu, i);
            }
            for (i, rate) in rates.iter().enumerate() {
                owed[i] += rate / 1000.0;
                while owed[i] >= 1.0 {
                    owed[i] -= 1.0;
                    match gate.pass(Some(i as u64), now, || None) {
                        Verdict::Pass => serve(&mut cpu, i),
                        Verdict::Hold(at) => held.push((at, i)),
                        Verdict::Refuse | Verdict::Late { .. } => {
                            cpu.spend(refusal_cost.as_secs_f64(), 1.0, measuring);
                        }
                    }
                }
            }
        }
        let per_sec = passed.iter().map(|&p| p as f64 / f64::from(measure)).collect();
        (cpu.measured / (f64::from(measure) * 0.25), per_sec, gate.snapshot())
    }

    /// Drives the gate with `callers` closed-loop callers of one tenant: each sends its next
    /// request the moment it has the answer to the last (a client that ignores `Retry-After`).
    /// A request takes `cost` of CPU, a refusal 20 us; the CPU is one core under a quarter-core
    /// quota, in 100 us steps. Returns (answers passed per second, share of answers refused,
    /// share of the quota used) over the last 10 of 20 seconds.
    fn closed_loop(callers: usize, cost: Duration, pace: Duration) -> (f64, f64, f64) {
        let mut cpu = Cpu::new();
        let start = Instant::now();
        let gate = cpu.gate(pace, start);
        let step = Duration::from_micros(100);
        // Per caller: CPU left on its current answer, whether that answer is a pass, and the hold
        // it waits out first.
        let mut work: Vec<Option<(f64, bool)>> = vec![None; callers];
        let mut hold: Vec<Option<Instant>> = vec![None; callers];
        let (mut ok, mut refused) = (0u64, 0u64);
        let seconds = 20u32;
        for tick in 0..u64::from(seconds) * 10_000 {
            let now = start + step * u32::try_from(tick).expect("small");
            if tick % 1000 == 0 {
                cpu.used_in_period = 0.0;
            }
            let measuring = tick >= 100_000;
            let mut room = step.as_secs_f64();
            for c in 0..callers {
                if hold[c].is_some_and(|at| at > now) {
                    continue;
                }
                if hold[c].take().is_some() {
                    work[c] = Some((cost.as_secs_f64(), true));
                }
                let (left, pass) = *work[c].get_or_insert_with(|| match gate.pass(Some(1), now, || None) {
                    Verdict::Pass => (cost.as_secs_f64(), true),
                    Verdict::Refuse | Verdict::Late { .. } => (20e-6, false),
                    Verdict::Hold(at) => {
                        hold[c] = Some(at);
                        (0.0, true)
                    }
                });
                if hold[c].is_some() {
                    work[c] = None;
                    continue;
                }
                let spent = cpu.spend(left, room, measuring);
                room -= spent;
                if spent < left {
                    work[c] = Some((left - spent, pass));
                    continue;
                }
                work[c] = None;
                if pass {
                    gate.completed();
                }
                if measuring {
                    if pass {
                        ok += 1;
                    } else {
                        refused += 1;
                    }
                }
            }
        }
        #[allow(clippy::cast_precision_loss)]
        let (ok, refused) = (ok as f64, refused as f64);
        (ok / 10.0, refused / (ok + refused).max(1.0), cpu.measured / (10.0 * 0.25))
    }

    #[test]
    fn closed_loop_callers_are_paced_not_refused() {
        // Four callers of one tenant at 500 us a request: they alone could use the quota (500
        // answers/s), so the gate shuts. Held rather than refused, they keep close to the target;
        // refused at once, they spin on refusals, which fill the quota and starve the work.
        let cost = Duration::from_micros(500);
        let (paced, paced_refused, paced_cpu) = closed_loop(4, cost, Duration::from_millis(50));
        let (spun, spun_refused, _) = closed_loop(4, cost, Duration::ZERO);
        assert!(paced_refused < 0.01, "paced: {paced_refused} of answers refused");
        assert!(paced > 300.0, "paced: {paced} answers/s of 500 possible");
        assert!(paced_cpu < 0.97, "paced: CPU at {paced_cpu} of the quota");
        assert!(spun_refused > 0.5, "unpaced: {spun_refused} refused (the failure pacing fixes)");
        assert!(paced > spun, "paced {paced}/s against unpaced {spun}/s");
    }

    #[test]
    fn under_the_target_nothing_is_refused() {
        // 300 req/s at 500 us: 0.15 core, 60% of a quarter core.
        let (u, passed, snap) = drive(&[300.0], Duration::from_micros(500), Duration::from_micros(30), 10, 8);
        assert!((u - 0.6).abs() < 0.05, "utilization {u}");
        assert!((passed[0] - 300.0).abs() < 1.0, "passed {passed:?}");
        assert_eq!(snap.refused_total, 0);
        assert!(!snap.shut);
    }

    #[test]
    fn at_twice_the_quota_cpu_stays_under_it() {
        // 1,000 req/s at 500 us would need half a core: twice the quota.
        let (u, passed, snap) = drive(&[1000.0], Duration::from_micros(500), Duration::from_micros(30), 20, 10);
        assert!(snap.shut, "{snap:?}");
        assert!(u < 0.97 && u > 0.6, "utilization {u} should sit under the quota, near the target");
        assert!(passed[0] > 300.0, "goodput {passed:?}: the gate must not starve the service");
    }

    #[test]
    fn a_flooding_tenant_is_refused_before_the_quiet_ones() {
        // One tenant at 1,500 req/s, four at 40 req/s each, 500 us each: the quiet ones alone
        // use a third of the target.
        let rates = [1500.0, 40.0, 40.0, 40.0, 40.0];
        let (u, passed, snap) = drive(&rates, Duration::from_micros(500), Duration::from_micros(30), 20, 10);
        assert!(snap.shut);
        assert!(u < 0.97, "utilization {u}");
        for (i, p) in passed.iter().enumerate().skip(1) {
            assert!((p - 40.0).abs() <= 1.0, "quiet tenant {i} passed {p}/s of 40");
        }
        assert!(passed[0] > 100.0 && passed[0] < 1500.0, "the flood gets the rest: {}", passed[0]);
    }

    #[test]
    fn when_refusals_alone_fill_the_quota_the_budget_holds_its_floor() {
        // 20,000 req/s at 20 us per refusal would be 0.4 core in refusals alone. The gate must
        // keep letting work through (its floor), not shrink to nothing.
        let (_, passed, snap) = drive(&[20_000.0], Duration::from_micros(500), Duration::from_micros(20), 20, 10);
        let cost = snap.cost_per_request_us;
        assert!(passed[0] > 50.0, "passed {passed:?}/s; cost {cost:?}");
    }

    /// A gate (target 0.85, a quarter core) after `windows` windows of `per_window` requests
    /// from tenant 1, each window using the whole quota, and one request after the last; with
    /// its meter and the time now.
    fn overloaded(windows: u32, per_window: u32) -> (Arc<Fake>, CpuGate, Instant) {
        let meter = Arc::new(Fake { cores: 0.25, used_us: AtomicU64::new(0) });
        let start = Instant::now();
        let gate = CpuGate::new(meter.clone(), 0.85, Duration::from_millis(100), Duration::from_millis(50), start);
        let mut now = start;
        for _ in 0..windows {
            for _ in 0..per_window {
                gate.pass(Some(1), now, || None);
            }
            meter.used_us.fetch_add(25_000, Ordering::Relaxed);
            now += Duration::from_millis(100);
        }
        gate.pass(Some(1), now, || None);
        (meter, gate, now)
    }

    #[test]
    fn fresh_tenant_claims_cannot_walk_around_a_shut_gate() {
        // One tenant over the quota for a second shuts the gate.
        let (_, gate, now) = overloaded(10, 100);
        let snap = gate.snapshot();
        let budget = snap.budget_per_sec.unwrap_or_else(|| panic!("shut: {snap:?}")) / 10.0;
        // Then, in one window, 500 requests each claiming a tenant never seen before.
        let passed = (1000..1500u64).filter(|&k| gate.pass(Some(k), now, || None) != Verdict::Refuse).count();
        #[allow(clippy::cast_precision_loss)]
        let passed = passed as f64;
        assert!(passed <= budget * BACKSTOP + 1.0, "{passed} passed with a budget of {budget} a window");
        assert!(passed >= 1.0, "new tenants are not shut out entirely");
    }

    #[test]
    fn the_gate_opens_again_when_load_falls() {
        // Three overloaded windows...
        let (meter, gate, mut now) = overloaded(3, 50);
        assert!(gate.snapshot().shut, "over the target the gate shuts");
        // ...then light load for a few seconds.
        for _ in 0..30 {
            now += Duration::from_millis(100);
            meter.used_us.fetch_add(2_000, Ordering::Relaxed);
            gate.pass(Some(1), now, || None);
        }
        let snap = gate.snapshot();
        assert!(!snap.shut, "{snap:?}");
        // One window over the target is a burst: the gate stays open. Two in a row shut it.
        for shut in [false, true] {
            meter.used_us.fetch_add(25_000, Ordering::Relaxed);
            for _ in 0..20 {
                gate.pass(Some(1), now, || None);
            }
            now += Duration::from_millis(100);
            gate.pass(Some(1), now, || None);
            assert_eq!(gate.snapshot().shut, shut);
        }
        // A long idle gap resets it at once.
        now += Duration::from_secs(2);
        gate.pass(Some(1), now, || None);
        assert!(!gate.snapshot().shut, "after an idle gap the gate is open");
    }

    #[test]
    fn a_schedule_left_from_a_low_level_does_not_lock_a_tenant_out() {
        let (_, gate, now) = overloaded(10, 100);
        // One request a hundred windows: a tenant's schedule moves ten seconds per request.
        lock(&gate.state).level = 0.01;
        assert_eq!(gate.pass(Some(7), now, || None), Verdict::Pass);
        // The level rises (the budget grew, or other tenants left): the tenant is held a pace at
        // most, not refused for the ten seconds its old schedule says.
        lock(&gate.state).level = 50.0;
        let later = now + Duration::from_millis(5);
        assert!(matches!(gate.pass(Some(7), later, || None), Verdict::Hold(at) if at <= later + gate.pace));
        // ...and its schedule then runs at the new level: straight after, it is ahead by more
        // than the pace, and refused.
        assert_eq!(gate.pass(Some(7), later, || None), Verdict::Refuse);
    }

    #[test]
    fn a_request_is_not_held_past_its_clients_deadline() {
        let (_, gate, now) = overloaded(10, 100);
        lock(&gate.state).level = 50.0; // 2 ms apart, a burst of 10
        let refused_before = gate.snapshot().refused_total;
        let mut verdicts = Vec::new();
        for _ in 0..30 {
            verdicts.push(gate.pass(Some(7), now, || Some(Duration::from_millis(10))));
        }
        let held: Vec<Duration> =
            verdicts.iter().filter_map(|v| if let Verdict::Hold(at) = v { Some(*at - now) } else { None }).collect();
        assert!(!held.is_empty(), "{verdicts:?}");
        assert!(held.iter().all(|h| *h < Duration::from_millis(10)), "held past the deadline: {held:?}");
        // Those whose turn is within the pace but past the deadline are refused as late, with
        // the hold they would have had.
        let late: Vec<Duration> = verdicts
            .iter()
            .filter_map(|v| if let Verdict::Late { wait, .. } = v { Some(*wait) } else { None })
            .collect();
        assert!(!late.is_empty(), "past the deadline, refused as late: {verdicts:?}");
        assert!(late.iter().all(|w| *w >= Duration::from_millis(10) && *w <= gate.pace), "{late:?}");
        assert!(
            verdicts
                .iter()
                .all(|v| !matches!(v, Verdict::Late { timeout, .. } if *timeout != Duration::from_millis(10))),
            "{verdicts:?}"
        );
        let refused = verdicts.iter().filter(|v| matches!(v, Verdict::Refuse | Verdict::Late { .. })).count();
        assert_eq!(gate.snapshot().refused_total - refused_before, refused as u64, "counted as the gate's refusals");
        // A refusal takes no turn: a more patient caller is held from where the schedule stands.
        let turn = late[late.len() - 1];
        assert_eq!(gate.pass(Some(7), now, || Some(Duration::from_secs(1))), Verdict::Hold(now + turn));
        // Without a deadline, the same requests are held up to the pace.
        let (_, gate, now) = overloaded(10, 100);
        lock(&gate.state).level = 50.0;
        let longest = (0..30)
            .filter_map(
                |_| if let Verdict::Hold(at) = gate.pass(Some(7), now, || None) { Some(at - now) } else { None },
            )
            .max();
        assert!(longest.is_some_and(|h| h > Duration::from_millis(10)), "{longest:?}");
    }

    #[test]
    fn one_window_over_the_target_before_an_idle_gap_does_not_count_towards_shutting() {
        let meter = Arc::new(Fake { cores: 0.25, used_us: AtomicU64::new(0) });
        let mut now = Instant::now();
        let gate = CpuGate::new(meter.clone(), 0.85, Duration::from_millis(100), Duration::from_millis(50), now);
        gate.pass(Some(1), now, || None);
        // A window over the target, then a second of nothing, then another window over it.
        for gap in [Duration::from_millis(100), Duration::from_secs(1), Duration::from_millis(100)] {
            meter.used_us.fetch_add(25_000, Ordering::Relaxed);
            now += gap;
            gate.pass(Some(1), now, || None);
        }
        assert!(!gate.snapshot().shut, "two windows over the target, but not in a row");
    }
}
