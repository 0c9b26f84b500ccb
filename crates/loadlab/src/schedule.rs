//! When requests are meant to go. The schedule is fixed before the step starts (constant or
//! Poisson arrivals from a seed), and a dedicated pacer thread hands each arrival to the
//! runtime at its intended time. Nothing waits for responses, so a slow server cannot slow the
//! schedule down: that is what makes the loop open.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};

/// How arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "snake_case")]
pub enum Arrivals {
    /// Evenly spaced, 1/rate apart (wrk2, k6 constant-arrival-rate).
    #[default]
    Constant,
    /// Exponential gaps with mean 1/rate: how independent users really arrive.
    Poisson,
}

/// What keeps the open loop's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "snake_case")]
pub enum Pacer {
    /// A dedicated OS thread sleeping to each intended time: tens of microseconds of send
    /// lag at low rates, at most one wake-up per 250 us at high ones.
    #[default]
    Thread,
    /// A task on the runtime using tokio's timer (1 ms wheel): arrivals go out in per-tick
    /// batches, up to ~1 ms late, for less CPU per request (as oha and k6 pace).
    Runtime,
}

/// An endless sequence of arrival offsets from the step's start.
#[derive(Debug)]
pub struct Schedule {
    arrivals: Arrivals,
    rate: f64,
    rng: StdRng,
    exp: Option<Exp<f64>>,
    n: u64,
    t: f64,
}

impl Schedule {
    /// `rate` in arrivals per second; a non-positive rate yields no arrivals.
    pub fn new(arrivals: Arrivals, rate: f64, seed: u64) -> Self {
        let exp = if rate > 0.0 { Exp::new(rate).ok() } else { None };
        Self { arrivals, rate, rng: StdRng::seed_from_u64(seed), exp, n: 0, t: 0.0 }
    }
}

impl Iterator for Schedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.rate <= 0.0 || !self.rate.is_finite() {
            return None;
        }
        let offset = match (self.arrivals, &self.exp) {
            (Arrivals::Poisson, Some(exp)) => {
                self.t += exp.sample(&mut self.rng);
                self.t
            }
            _ => self.n as f64 / self.rate,
        };
        self.n += 1;
        Some(Duration::from_secs_f64(offset))
    }
}

/// The pacer thread's shortest sleep. At high rates it wakes at most once per quantum and
/// sends everything then due, instead of once per arrival: at 10,000 req/s that halves its
/// wake-ups (and the runtime's) for at most this much added send lag.
pub const PACER_QUANTUM: Duration = Duration::from_micros(250);

/// Runs `on_arrival` at each intended instant in `[start, start + duration)` on its own OS
/// thread. `std::thread::sleep` overshoots by tens of microseconds, against tokio's
/// millisecond timer wheel, which is why this pacer is not a tokio task. Returns the number of
/// arrivals dispatched.
pub fn spawn_pacer<F>(
    schedule: Schedule,
    start: Instant,
    duration: Duration,
    stop: Arc<AtomicBool>,
    mut on_arrival: F,
) -> std::thread::JoinHandle<u64>
where
    F: FnMut(Instant) + Send + 'static,
{
    std::thread::Builder::new()
        .name("loadlab-pacer".into())
        .spawn(move || {
            let mut sent = 0;
            let mut last_wake = Instant::now();
            for offset in schedule {
                if offset >= duration || stop.load(Ordering::Relaxed) {
                    break;
                }
                let intended = start + offset;
                let now = Instant::now();
                if intended > now {
                    let wake = intended.max(last_wake + PACER_QUANTUM);
                    std::thread::sleep(wake - now);
                    last_wake = Instant::now();
                }
                on_arrival(intended);
                sent += 1;
            }
            sent
        })
        .unwrap_or_else(|e| panic!("cannot start the pacer thread: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_and_poisson_schedules_hit_the_rate() {
        let c: Vec<_> =
            Schedule::new(Arrivals::Constant, 100.0, 1).take_while(|d| *d < Duration::from_secs(10)).collect();
        assert_eq!(c.len(), 1000);
        let p = Schedule::new(Arrivals::Poisson, 100.0, 7).take_while(|d| *d < Duration::from_secs(10)).count();
        assert!((900..1100).contains(&p), "{p}");
        // Seeded: the same seed gives the same schedule.
        let a: Vec<_> = Schedule::new(Arrivals::Poisson, 50.0, 3).take(20).collect();
        let b: Vec<_> = Schedule::new(Arrivals::Poisson, 50.0, 3).take(20).collect();
        assert_eq!(a, b);
    }
}
