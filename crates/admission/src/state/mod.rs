//! The shared controller: one per process, behind an `Arc`, cloned into every per-connection
//! service, so the limit is global, never per connection. One short mutex per route class.

mod slot;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::{AdmissionConfig, ClassConfig, ClassId, ConfigError};
use crate::controller::{Controller, WindowSummary};
use crate::fairness::flooding;
use crate::histogram::Histogram;
use crate::keys::KeyHasher;
use crate::queue::{FairQueue, Outcome, Waiter};
use crate::refusal::{Refusal, RefusalReason, retry_after};
use crate::snapshot::{ClassSnapshot, Load, ShedTotals, Snapshot};
pub(crate) use slot::{SlotGuard, Ticket};

/// How long each half of the live latency histogram covers: p50/p95 describe the last 10-20 s.
const RECENT: Duration = Duration::from_secs(10);

/// The admission controller. Cheap to clone (an `Arc`): keep one for [`Admission::snapshot`] and
/// build the layer from it with [`Admission::layer`](crate::Admission::layer).
#[derive(Clone)]
pub struct Admission {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("mode", &self.shared.config.mode)
            .field("algorithm", &self.shared.config.algorithm)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Shared {
    pub(crate) config: AdmissionConfig,
    classes: Box<[Class]>,
    bypassed: AtomicU64,
}

struct Class {
    config: ClassConfig,
    state: Mutex<ClassState>,
}

struct ClassState {
    controller: Controller,
    in_flight: usize,
    high_water: usize,
    /// Slots held per tenant, so the next free slot goes to the waiting tenant holding fewest.
    tenant_slots: HashMap<Option<u64>, usize, KeyHasher>,
    queue: FairQueue,
    next_waiter: u64,
    window: Window,
    recent: [Histogram; 2],
    recent_since: Instant,
    admitted: u64,
    shed: ShedTotals,
    /// Completions per second in the last window (published).
    throughput: f64,
    /// Completions per busy second in the last window: prices Retry-After, deadlines and the
    /// overload queue's room.
    drain_rate: f64,
    /// Offered / admitted in the last window (>= 1).
    pressure: f64,
    /// Median service time in the last window, seconds.
    service_p50: f64,
    /// The last time an arrival found a free slot and nobody waiting. Sustained overload (CoDel)
    /// is this being longer ago than `codel_interval`.
    last_idle: Instant,
}

struct Window {
    started: Instant,
    /// Integral of the in-flight count over time, for its time-weighted mean.
    area: f64,
    /// Seconds with at least one request in flight: the drain rate is completions per busy
    /// second, so that an idle spell inside a window does not make the service look slow.
    busy: f64,
    last_change: Instant,
    completed: u32,
    sum: f64,
    hist: Histogram,
    limited: bool,
    arrivals: u32,
    admitted: u32,
}

impl Window {
    fn new(now: Instant) -> Self {
        Self {
            started: now,
            area: 0.0,
            busy: 0.0,
            last_change: now,
            completed: 0,
            sum: 0.0,
            hist: Histogram::default(),
            limited: false,
            arrivals: 0,
            admitted: 0,
        }
    }
}

/// What the door decided.
pub(crate) enum Decision {
    Admit(SlotGuard),
    Wait(Ticket, Instant),
    Refuse(Refusal),
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock (a class's, the pacer's) leaves counters that are still
    // meaningful; carry on.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Admission {
    /// Builds the controller. Fails only on inconsistent settings (e.g. `min_limit > max_limit`).
    pub fn new(config: AdmissionConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let now = Instant::now();
        let classes = config
            .classes
            .iter()
            .map(|c| Class {
                config: c.clone(),
                state: Mutex::new(ClassState {
                    controller: Controller::new(&config, c),
                    in_flight: 0,
                    high_water: 0,
                    tenant_slots: HashMap::default(),
                    queue: FairQueue::default(),
                    next_waiter: 0,
                    window: Window::new(now),
                    recent: [Histogram::default(), Histogram::default()],
                    recent_since: now,
                    admitted: 0,
                    shed: ShedTotals::default(),
                    throughput: 0.0,
                    drain_rate: 0.0,
                    pressure: 1.0,
                    service_p50: 0.0,
                    last_idle: now,
                }),
            })
            .collect();
        Ok(Self { shared: Arc::new(Shared { config, classes, bypassed: AtomicU64::new(0) }) })
    }

    /// The configuration it runs with.
    #[must_use]
    pub fn config(&self) -> &AdmissionConfig {
        &self.shared.config
    }

    /// Live figures: limits, in-flight, queues, refusals by reason, latency. Takes each class
    /// lock for a copy of a few counters and two small histograms.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        let cfg = &self.shared.config;
        let mut all = Histogram::default();
        let classes: Vec<ClassSnapshot> = self
            .shared
            .classes
            .iter()
            .map(|class| {
                let st = lock(&class.state);
                all.merge(&st.recent[0]);
                all.merge(&st.recent[1]);
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                let q = |p| st.recent[0].quantile_with(&st.recent[1], p).map(ms);
                let limit = st.controller.limit();
                ClassSnapshot {
                    name: class.config.name.clone(),
                    limit: (limit != usize::MAX).then_some(limit),
                    limit_estimate: st.controller.estimate(),
                    load: Load {
                        in_flight: st.in_flight,
                        high_water: st.high_water,
                        queue_depth: st.queue.len(),
                        queue_capacity: class.config.queue_capacity,
                        max_queue_wait_ms: ms(class.config.max_queue_wait),
                        latency_target_ms: ms(class.config.latency_target),
                        admitted_total: st.admitted,
                        shed: st.shed,
                        p50_ms: q(0.5),
                        p95_ms: q(0.95),
                    },
                    baseline_ms: st.controller.baseline().map(|b| b * 1e3),
                    throughput_per_sec: st.throughput,
                    longest_retry_after_seconds: class.config.longest_retry_after,
                }
            })
            .collect();
        Snapshot::from_classes(cfg, classes, self.shared.bypassed.load(Ordering::Relaxed), &all)
    }

    pub(crate) fn count_bypass(&self) {
        self.shared.bypassed.fetch_add(1, Ordering::Relaxed);
    }

    fn class(&self, id: ClassId) -> (ClassId, &Class) {
        // An id from another configuration falls back to the default class rather than panic.
        match self.shared.classes.get(id.index()) {
            Some(c) => (id, c),
            None => (ClassId::DEFAULT, &self.shared.classes[0]),
        }
    }

    /// The door: the class's limit and queue. Admit now, queue or refuse; never blocks beyond the
    /// class lock. The deadline header is read only if the request cannot go straight in.
    pub(crate) fn admit(
        &self,
        id: ClassId,
        tenant: Option<u64>,
        client_timeout: impl FnOnce() -> Option<Duration>,
    ) -> Decision {
        let now = Instant::now();
        let cfg = &self.shared.config;
        let (id, class) = self.class(id);
        let mut st = lock(&class.state);
        st.window.arrivals += 1;
        if st.in_flight < st.controller.limit() && st.queue.is_empty() {
            st.last_idle = now;
            let probe = st.controller.probing();
            st.take_slot(now, tenant);
            drop(st);
            return Decision::Admit(SlotGuard::new(self.shared.clone(), id, tenant, now, probe));
        }
        st.window.limited = true;

        // A full queue with nobody to push out: the cheapest refusal, decided before even
        // reading the deadline header.
        let full = st.queue.len() >= class.config.queue_capacity;
        let victim = if full {
            let state = &*st;
            let slots = &state.tenant_slots;
            let victim = state.queue.eviction_victim(tenant, |k| slots.get(&k).copied().unwrap_or(0));
            if victim.is_none() {
                st.shed.queue_full += 1;
                return Decision::Refuse(st.refusal(id, &class.config, RefusalReason::QueueFull));
            }
            victim
        } else {
            None
        };

        let client_timeout = client_timeout();
        if let Some(timeout) = client_timeout {
            let expected_wait = st.expected_wait(tenant, &class.config);
            let needed = expected_wait + st.service_p50;
            if needed > timeout.as_secs_f64() {
                return Decision::Refuse(st.deadline_refusal(id, &class.config, expected_wait, timeout));
            }
        }
        if let Some(i) = victim {
            // The pushed-out waiter gets the refusal; the newcomer takes its place.
            st.shed.queue_full += 1;
            let refusal = st.refusal(id, &class.config, RefusalReason::QueueFull);
            if let Some(evicted) = st.queue.evict(i) {
                let _ = evicted.tx.send(Outcome::Refused(refusal));
            }
        }
        let queued = st.queue.queued(tenant);
        let flooding = st.flooding(tenant, queued > 0, now, cfg);
        if flooding && queued >= st.overload_room(cfg) {
            // Sustained overload from this tenant: it already has queued all that can drain
            // within the short wait. Refuse now rather than after the wait.
            st.shed.queue_full += 1;
            return Decision::Refuse(st.refusal(id, &class.config, RefusalReason::QueueFull));
        }
        let mut wait = if flooding { cfg.overload_wait } else { class.config.max_queue_wait };
        if let Some(timeout) = client_timeout {
            wait = wait.min(timeout.saturating_sub(Duration::from_secs_f64(st.service_p50)));
        }
        let (tx, rx) = oneshot::channel();
        let waiter = st.next_waiter;
        st.next_waiter += 1;
        st.queue.push(tenant, Waiter { id: waiter, tenant, tx });
        drop(st);
        let ticket = Ticket { admission: self.clone(), class: id, tenant, waiter, rx, since: now, settled: false };
        Decision::Wait(ticket, now + wait)
    }

    fn release(&self, guard: &SlotGuard) {
        let cfg = &self.shared.config;
        let (_, class) = self.class(guard.class);
        let mut st = lock(&class.state);
        let now = Instant::now();
        st.account(now);
        st.in_flight -= 1;
        if let Some(n) = st.tenant_slots.get_mut(&guard.tenant) {
            *n -= 1;
            if *n == 0 {
                st.tenant_slots.remove(&guard.tenant);
            }
        }
        let (completed, probe, admitted_at) = (guard.completed, guard.probe, guard.admitted_at);
        if completed {
            st.record(now.saturating_duration_since(admitted_at), probe, now, cfg);
        }
        st.dispatch(now, cfg);
    }
}

impl ClassState {
    /// Adds the in-flight count since its last change to the window's integral.
    fn account(&mut self, now: Instant) {
        let w = &mut self.window;
        #[allow(clippy::cast_precision_loss)]
        let n = self.in_flight as f64;
        let dt = now.saturating_duration_since(w.last_change).as_secs_f64();
        w.area += n * dt;
        if self.in_flight > 0 {
            w.busy += dt;
        }
        w.last_change = now;
    }

    fn take_slot(&mut self, now: Instant, tenant: Option<u64>) {
        self.account(now);
        self.in_flight += 1;
        *self.tenant_slots.entry(tenant).or_insert(0) += 1;
        self.high_water = self.high_water.max(self.in_flight);
        self.admitted += 1;
        self.window.admitted += 1;
    }

    /// Seconds until a newcomer of `tenant` would be admitted, at the last measured drain rate.
    fn expected_wait(&self, tenant: Option<u64>, class: &ClassConfig) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let ahead = self.queue.position(tenant) as f64;
        ahead / self.drain_rate_or_guess(class)
    }

    fn drain_rate_or_guess(&self, class: &ClassConfig) -> f64 {
        if self.drain_rate > 0.0 {
            self.drain_rate
        } else {
            // Before the first window: what the limit would do at the target latency.
            #[allow(clippy::cast_precision_loss)]
            let limit = self.controller.limit().min(class.max_limit) as f64;
            limit / class.latency_target.as_secs_f64()
        }
    }

    /// A client's deadline that an expected `wait` (seconds) would outlast: counted, and
    /// refused with that wait, the deadline and a `Retry-After` from the wait.
    fn deadline_refusal(&mut self, class: ClassId, cfg: &ClassConfig, wait: f64, timeout: Duration) -> Refusal {
        self.shed.deadline += 1;
        let mut r = self.refusal(class, cfg, RefusalReason::Deadline);
        r.wait_ms = secs_to_ms(wait);
        r.client_timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        r.retry_after_seconds = retry_after(0, 1.0 / wait.max(1e-3), 1.0, cfg.longest_retry_after);
        r
    }

    fn refusal(&self, class: ClassId, cfg: &ClassConfig, reason: RefusalReason) -> Refusal {
        let queued = self.queue.len();
        Refusal {
            reason,
            class,
            in_flight: self.in_flight,
            limit: self.controller.limit(),
            queued,
            queue_capacity: cfg.queue_capacity,
            retry_after_seconds: retry_after(
                queued,
                self.drain_rate_or_guess(cfg),
                self.pressure,
                cfg.longest_retry_after,
            ),
            wait_ms: 0,
            client_timeout_ms: 0,
        }
    }

    fn record(&mut self, rtt: Duration, probe: bool, now: Instant, cfg: &AdmissionConfig) {
        if now.saturating_duration_since(self.recent_since) >= RECENT {
            self.recent[1] = std::mem::take(&mut self.recent[0]);
            self.recent_since = now;
        }
        self.recent[0].record(rtt);
        // Windows run in every mode: the drain rate they measure prices Retry-After, deadlines
        // and the overload queue room even with a static limit or none.
        let secs = rtt.as_secs_f64();
        self.window.completed += 1;
        self.window.sum += secs;
        self.window.hist.record(rtt);
        self.controller.on_sample(secs, probe, self.window.limited);

        let elapsed = now.saturating_duration_since(self.window.started).as_secs_f64();
        let floor = cfg.window.as_secs_f64().max(self.controller.window_floor());
        // Enough evidence: a minimum count, or one limit's worth (a full turnover) if smaller,
        // but never fewer than eight: at a limit of 2, windows of two completions from a mixed
        // workload made the mean, and so the knee estimate, swing by several times.
        let needed = u32::try_from(self.controller.limit()).unwrap_or(u32::MAX).max(8).min(cfg.window_samples);
        if elapsed >= floor && self.window.completed >= needed {
            let w = &self.window;
            let p = |q| w.hist.quantile(q).map_or(0.0, |d| d.as_secs_f64());
            let summary = WindowSummary {
                elapsed,
                completed: w.completed,
                mean: w.sum / f64::from(w.completed),
                p95: p(0.95),
                in_flight: w.area / elapsed.max(1e-9),
                limited: w.limited,
            };
            self.throughput = summary.throughput();
            // Completions per busy second: what the service drains while it has work, which
            // is what a refused caller waits on. Over the whole window, an idle spell before
            // a burst priced Retry-After at up to a minute (docs/ADMISSION.md).
            self.drain_rate = f64::from(w.completed) / w.busy.max(1e-3);
            self.pressure = f64::from(w.arrivals) / f64::from(w.admitted.max(1));
            self.service_p50 = p(0.5);
            if self.controller.adapts() {
                self.controller.on_window(&summary);
            }
            self.window = Window::new(now);
            self.window.last_change = now;
        }
    }

    /// Waiters that can be admitted within the overload wait at the measured drain rate.
    fn overload_room(&self, cfg: &AdmissionConfig) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let room = (self.drain_rate * cfg.overload_wait.as_secs_f64()).round() as usize;
        room.max(1)
    }

    /// How long the class has been in overload: since an arrival last found a free slot, or a
    /// whole interval if the last window was offered over 25% more than it admitted (a brief
    /// empty queue, e.g. when a probe ends, does not end sustained overload). Not while the
    /// controller is still finding its first limit: that pressure is its own doing.
    fn backlog(&self, now: Instant, cfg: &AdmissionConfig) -> Duration {
        let since_idle = now.saturating_duration_since(self.last_idle);
        if self.pressure >= 1.25 && !self.controller.starting() {
            since_idle.max(cfg.codel_interval)
        } else {
            since_idle
        }
    }

    fn flooding(&self, tenant: Option<u64>, waiting: bool, now: Instant, cfg: &AdmissionConfig) -> bool {
        let backlog = self.backlog(now, cfg);
        let busy = self.controller.limit().min(self.in_flight.max(1));
        let (waiting_tenants, queued) = (self.queue.tenants(), self.queue.queued(tenant) > 0);
        flooding(&self.tenant_slots, waiting_tenants, queued, busy, tenant, waiting, backlog, cfg)
    }

    /// Hands free slots to waiters: the waiting tenant with the smallest footprint (slots held
    /// plus waiters) first, ties in turn.
    fn dispatch(&mut self, now: Instant, cfg: &AdmissionConfig) {
        while self.in_flight < self.controller.limit() {
            let slots = &self.tenant_slots;
            let busy = self.controller.limit().min(self.in_flight.max(1));
            let backlog = self.backlog(now, cfg);
            let waiting_tenants = self.queue.tenants();
            let Some(w) = self.queue.pop(
                |k| slots.get(&k).copied().unwrap_or(0),
                // Only tenants with waiters are asked.
                |k| cfg.adaptive_lifo && flooding(slots, waiting_tenants, true, busy, k, true, backlog, cfg),
            ) else {
                break;
            };
            let probe = self.controller.probing();
            if w.tx.send(Outcome::Admitted { probe }).is_ok() {
                self.take_slot(now, w.tenant);
            }
        }
    }
}

fn secs_to_ms(secs: f64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ms = (secs * 1e3).round().clamp(0.0, 1e12) as u64;
    ms
}

impl WindowSummary {
    fn throughput(&self) -> f64 {
        f64::from(self.completed) / self.elapsed.max(1e-9)
    }
}
