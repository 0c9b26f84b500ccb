//! ECS service auto scaling with a CPU target-tracking policy, as the service stack configures
//! it, and the lifecycle of the tasks it starts and stops. Pure: time is seconds since the run
//! began, and the fleet runner turns the events into processes, balancer commands and signals.
//!
//! What it copies from Application Auto Scaling's target tracking:
//! - the metric is the service's average CPU over one period (a minute), of the tasks running;
//! - scale-out when it is above the target for `out_periods` periods in a row (the policy's
//!   high alarm: 3 of 3 one-minute datapoints), to `ceil(tasks x cpu / target)`, at least one
//!   more, at most the maximum; again only after the scale-out cooldown;
//! - scale-in when it is below 90% of the target for `in_periods` periods in a row (the low
//!   alarm: 15 datapoints), to `ceil(tasks x cpu / target)`, at least the minimum; never within
//!   the scale-in cooldown of the last scale-in, nor the scale-out cooldown of the last
//!   scale-out;
//! - a new task serves only after `start_delay` (image pull, container start) and then the
//!   balancer's own health checks; a task scaled in is deregistered, drains for the
//!   deregistration delay, then gets SIGTERM. The newest task goes first.

use std::time::Duration;

/// The policy, from the stack (`fleet::stack`), with the periods a short run may shorten.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    /// Average CPU the policy holds, as a fraction of each task's quota.
    pub(crate) target: f64,
    pub(crate) min_tasks: u32,
    pub(crate) max_tasks: u32,
    pub(crate) period: Duration,
    pub(crate) out_periods: u32,
    pub(crate) in_periods: u32,
    pub(crate) out_cooldown: Duration,
    pub(crate) in_cooldown: Duration,
    /// From the scale-out decision to the process starting.
    pub(crate) start_delay: Duration,
    /// From deregistration to SIGTERM.
    pub(crate) drain_delay: Duration,
}

/// Scale-in needs the metric below this share of the target (target tracking's low alarm).
pub(crate) const SCALE_IN_SHARE: f64 = 0.9;

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Decided, not started yet (the start delay).
    Pending {
        starts_at_s: u64,
    },
    /// The process runs and is registered with the balancer (whose health checks decide
    /// whether it gets traffic).
    Running,
    /// Deregistered: no new requests; SIGTERM at `stop_at_s`.
    Draining {
        stop_at_s: u64,
    },
    Stopped,
}

/// What the runner must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Start task `n`'s process and register it with the balancer.
    Start(usize),
    /// Deregister task `n` from the balancer: it drains.
    Deregister(usize),
    /// Send task `n` SIGTERM.
    Stop(usize),
}

/// A scaling decision, for the timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Decision {
    pub(crate) at_s: u64,
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) cpu: f64,
}

#[derive(Debug)]
pub(crate) struct Autoscaler {
    policy: Policy,
    tasks: Vec<TaskState>,
    above: u32,
    below: u32,
    last_out_s: Option<u64>,
    last_in_s: Option<u64>,
    pub(crate) decisions: Vec<Decision>,
}

impl Autoscaler {
    /// A service with `initial` tasks already running (tasks 0..initial).
    pub(crate) fn new(policy: Policy, initial: u32) -> Self {
        let initial = initial.clamp(policy.min_tasks, policy.max_tasks);
        Self {
            policy,
            tasks: vec![TaskState::Running; initial as usize],
            above: 0,
            below: 0,
            last_out_s: None,
            last_in_s: None,
            decisions: Vec::new(),
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn tasks(&self) -> &[TaskState] {
        &self.tasks
    }

    /// The most tasks that exist at once: the maximum running or pending, and beside them the
    /// ones still draining from a scale-in (at most the maximum less the minimum, while the
    /// drain delay is no longer than the scale-out cooldown, which the fleet checks), as an ECS
    /// service starts new tasks while deregistered ones drain.
    pub(crate) fn slots(policy: &Policy) -> u32 {
        policy.max_tasks + policy.max_tasks.saturating_sub(policy.min_tasks)
    }

    /// The desired count: tasks pending or running.
    pub(crate) fn desired(&self) -> u32 {
        let n = self.tasks.iter().filter(|t| matches!(t, TaskState::Pending { .. } | TaskState::Running)).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// At the end of a period: `cpu` is the average over it of the measured tasks' CPU, as a
    /// fraction of one task's quota. Decides, and returns what to do at once.
    pub(crate) fn on_period(&mut self, now_s: u64, cpu: f64) -> Vec<Event> {
        let p = self.policy;
        if cpu > p.target {
            (self.above, self.below) = (self.above + 1, 0);
        } else if cpu < SCALE_IN_SHARE * p.target {
            (self.above, self.below) = (0, self.below + 1);
        } else {
            (self.above, self.below) = (0, 0);
        }
        let current = self.desired();
        let proportional = proportional(current, cpu, p.target);
        let since = |t: Option<u64>| t.map_or(u64::MAX, |t| now_s.saturating_sub(t));
        let cooled = |t: Option<u64>, d: Duration| since(t) >= d.as_secs();
        let mut events = Vec::new();
        if self.above >= p.out_periods && cooled(self.last_out_s, p.out_cooldown) && current < p.max_tasks {
            let to = proportional.max(current + 1).min(p.max_tasks);
            for _ in current..to {
                let pending = TaskState::Pending { starts_at_s: now_s + p.start_delay.as_secs() };
                // A stopped task's slot is used again, so a fleet needs at most `slots()`.
                match self.tasks.iter().position(|t| *t == TaskState::Stopped) {
                    Some(i) => self.tasks[i] = pending,
                    None => self.tasks.push(pending),
                }
            }
            self.last_out_s = Some(now_s);
            self.decisions.push(Decision { at_s: now_s, from: current, to, cpu });
        } else if self.below >= p.in_periods
            && cooled(self.last_in_s, p.in_cooldown)
            && cooled(self.last_out_s, p.out_cooldown)
            && current > p.min_tasks
        {
            let to = proportional.min(current - 1).max(p.min_tasks);
            events = self.scale_in(now_s, to, cpu);
        }
        events
    }

    /// Scales in to `to` tasks now (the policy's decision, or an operator lowering the desired
    /// count): the highest slot first; a pending one is cancelled, a running one deregistered, to
    /// get SIGTERM after the drain delay.
    pub(crate) fn scale_in(&mut self, now_s: u64, to: u32, cpu: f64) -> Vec<Event> {
        let current = self.desired();
        let to = to.max(self.policy.min_tasks);
        let mut events = Vec::new();
        if to >= current {
            return events;
        }
        let mut remove = current - to;
        for i in (0..self.tasks.len()).rev() {
            if remove == 0 {
                break;
            }
            match self.tasks[i] {
                TaskState::Pending { .. } => self.tasks[i] = TaskState::Stopped,
                TaskState::Running => {
                    self.tasks[i] = TaskState::Draining { stop_at_s: now_s + self.policy.drain_delay.as_secs() };
                    events.push(Event::Deregister(i));
                }
                _ => continue,
            }
            remove -= 1;
        }
        self.last_in_s = Some(now_s);
        self.decisions.push(Decision { at_s: now_s, from: current, to, cpu });
        events
    }

    /// Every second: starts the tasks whose delay is over and stops the drained ones.
    pub(crate) fn tick(&mut self, now_s: u64) -> Vec<Event> {
        let mut events = Vec::new();
        for (i, t) in self.tasks.iter_mut().enumerate() {
            match *t {
                TaskState::Pending { starts_at_s } if now_s >= starts_at_s => {
                    *t = TaskState::Running;
                    events.push(Event::Start(i));
                }
                TaskState::Draining { stop_at_s } if now_s >= stop_at_s => {
                    *t = TaskState::Stopped;
                    events.push(Event::Stop(i));
                }
                _ => {}
            }
        }
        events
    }
}

/// `ceil(tasks x cpu / target)`.
fn proportional(tasks: u32, cpu: f64, target: f64) -> u32 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (f64::from(tasks) * cpu / target.max(1e-9) - 1e-9).ceil().clamp(0.0, 1e6) as u32;
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            target: 0.6,
            min_tasks: 2,
            max_tasks: 4,
            period: Duration::from_secs(60),
            out_periods: 3,
            in_periods: 15,
            out_cooldown: Duration::from_secs(60),
            in_cooldown: Duration::from_secs(180),
            start_delay: Duration::from_secs(60),
            drain_delay: Duration::from_secs(30),
        }
    }

    /// Feeds one CPU figure per period and the seconds in between; returns (second, event).
    fn script(a: &mut Autoscaler, cpu: &[f64]) -> Vec<(u64, Event)> {
        let mut out = Vec::new();
        for (k, &c) in cpu.iter().enumerate() {
            let end = (k as u64 + 1) * 60;
            for s in end - 59..end {
                out.extend(a.tick(s).into_iter().map(|e| (s, e)));
            }
            out.extend(a.on_period(end, c).into_iter().map(|e| (end, e)));
            out.extend(a.tick(end).into_iter().map(|e| (end, e)));
        }
        out
    }

    #[test]
    fn three_periods_over_the_target_scale_out_in_proportion_and_the_task_starts_after_its_delay() {
        let mut a = Autoscaler::new(policy(), 2);
        // The last period sits between 90% of the target and the target: no decision.
        let events = script(&mut a, &[0.5, 0.9, 0.9, 0.9, 0.55]);
        // Two periods over are not enough; the third decides 2 x 0.9 / 0.6 = 3 tasks.
        assert_eq!(a.decisions.len(), 1, "{:?}", a.decisions);
        assert_eq!((a.decisions[0].at_s, a.decisions[0].from, a.decisions[0].to), (240, 2, 3));
        assert_eq!(a.desired(), 3);
        // Decided at 240, started at 300: the start delay.
        assert_eq!(events, vec![(300, Event::Start(2))]);
        assert_eq!(a.tasks()[2], TaskState::Running);
    }

    #[test]
    fn the_cooldown_spaces_scale_outs_and_the_maximum_caps_them() {
        let mut p = policy();
        p.out_periods = 1;
        p.out_cooldown = Duration::from_secs(120);
        let mut a = Autoscaler::new(p, 2);
        script(&mut a, &[0.7, 0.7, 0.7, 3.0, 3.0]);
        let at: Vec<(u64, u32, u32)> = a.decisions.iter().map(|d| (d.at_s, d.from, d.to)).collect();
        // 60: 2 -> ceil(2.33) = 3; 120 inside the cooldown; 180: 3 -> 4; 240 inside; 300: at max.
        assert_eq!(at, vec![(60, 2, 3), (180, 3, 4)]);
        assert_eq!(a.desired(), 4);
    }

    #[test]
    fn scale_in_needs_fifteen_quiet_periods_keeps_the_minimum_and_drains_before_sigterm() {
        let mut p = policy();
        p.out_periods = 1;
        let mut a = Autoscaler::new(p, 2);
        let mut cpu = vec![1.2]; // 2 -> 4
        cpu.extend(std::iter::repeat_n(0.1, 14));
        let events = script(&mut a, &cpu);
        assert_eq!(a.decisions.len(), 1, "fourteen quiet periods are not enough: {:?}", a.decisions);
        let events2 = script_from(&mut a, 15, &[0.1]);
        let last = a.decisions.last().copied().expect("a scale-in");
        assert_eq!((last.from, last.to), (4, 2), "ceil(4 x 0.1 / 0.6) = 1, held at the minimum of 2");
        // The newest two are deregistered, then stopped 30 s later.
        let expected =
            [(960, Event::Deregister(3)), (960, Event::Deregister(2)), (990, Event::Stop(2)), (990, Event::Stop(3))];
        assert_eq!(events2, expected);
        assert_eq!(events.iter().filter(|(_, e)| matches!(e, Event::Start(_))).count(), 2);
        assert_eq!(a.desired(), 2);
    }

    #[test]
    fn a_scale_in_waits_out_both_cooldowns() {
        let mut p = policy();
        p.in_periods = 1;
        p.out_periods = 1;
        p.in_cooldown = Duration::from_secs(180);
        let mut a = Autoscaler::new(p, 2);
        script(&mut a, &[0.9, 0.1, 0.1]);
        // Out at 60 (2 -> 3); at 120 the out cooldown (60 s) is over: in to 2.
        let at: Vec<(u64, u32, u32)> = a.decisions.iter().map(|d| (d.at_s, d.from, d.to)).collect();
        assert_eq!(at, vec![(60, 2, 3), (120, 3, 2)]);
        let mut b = Autoscaler::new(Policy { min_tasks: 1, ..p }, 3);
        // 0.5 is under 90% of the target: 3 -> ceil(2.5) = 3, one fewer at least: 2; then
        // 2 -> 1, but only 180 s after the first.
        script(&mut b, &[0.5, 0.5, 0.5, 0.5]);
        let at: Vec<(u64, u32, u32)> = b.decisions.iter().map(|d| (d.at_s, d.from, d.to)).collect();
        assert_eq!(at, vec![(60, 3, 2), (240, 2, 1)], "the second scale-in waits 180 s after the first");
    }

    #[test]
    fn a_scale_out_while_tasks_drain_starts_beside_them_and_reuses_stopped_slots() {
        let mut p = policy();
        p.out_periods = 1;
        let mut a = Autoscaler::new(p, 2);
        let mut events = a.on_period(60, 1.2); // 2 -> 4: slots 2 and 3, started at 120
        let run = |a: &mut Autoscaler, from: u64, to: u64, events: &mut Vec<Event>| {
            for s in from..=to {
                events.extend(a.tick(s));
            }
        };
        run(&mut a, 61, 120, &mut events);
        events.extend(a.scale_in(130, 2, 0.1)); // 3 and 2 drain until 160
        events.extend(a.on_period(135, 1.2)); // out again while they drain: slots 4 and 5
        run(&mut a, 136, 200, &mut events);
        let starts = |events: &[Event]| -> Vec<usize> {
            events.iter().filter_map(|e| if let Event::Start(i) = e { Some(*i) } else { None }).collect()
        };
        assert_eq!(starts(&events), vec![2, 3, 4, 5], "{events:?}");
        assert_eq!(a.tasks().len(), Autoscaler::slots(&p) as usize, "max 4 + (4 - 2) draining");
        // In and out again once the drain is over: the stopped slots are used again.
        events = a.scale_in(300, 2, 0.1);
        run(&mut a, 301, 340, &mut events);
        a.last_out_s = None;
        events.extend(a.on_period(360, 1.2));
        run(&mut a, 361, 430, &mut events);
        assert_eq!(starts(&events), vec![2, 3], "{events:?}");
        assert_eq!(a.tasks().len(), Autoscaler::slots(&p) as usize);
        assert_eq!(a.desired(), 4);
    }

    /// Like `script`, from period `first` (0-based).
    fn script_from(a: &mut Autoscaler, first: u64, cpu: &[f64]) -> Vec<(u64, Event)> {
        let mut out = Vec::new();
        for (k, &c) in cpu.iter().enumerate() {
            let end = (first + k as u64 + 1) * 60;
            out.extend(a.on_period(end, c).into_iter().map(|e| (end, e)));
            for s in end..end + 60 {
                out.extend(a.tick(s).into_iter().map(|e| (s, e)));
            }
        }
        out
    }
}
