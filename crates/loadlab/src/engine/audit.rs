//! The generator's self-audit of a step: whether it kept to its schedule, stayed under its
//! in-flight cap and left itself CPU to spare (a step where it did not is invalid), what the
//! step cost it, and whether Little's law finds requests queued where neither side counts them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{Begun, Engine};
use crate::report::{Audit, LittlesLaw, Mode, SeriesSummary};
use crate::stats::StepRecorder;

impl Engine {
    /// Audits step `b` at its end: `rec` holds its requests, `send_lag_p99_ms` is their send
    /// lag's p99, `cpu1` the generator's CPU seconds at the end, `elapsed_s` the step's length
    /// up to its last response, and `server` the server's samples over it.
    pub(super) fn audit(
        &self,
        b: &Begun,
        rec: &StepRecorder,
        send_lag_p99_ms: f64,
        cpu1: Option<f64>,
        elapsed_s: f64,
        server: &BTreeMap<String, SeriesSummary>,
    ) -> Audit {
        let (ctx, mode) = (&b.ctx, b.mode);
        let completed = rec.completed();
        let achieved_rps = completed as f64 / elapsed_s;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let cpu_s = match (b.cpu0, cpu1) {
            (Some(a), Some(z)) => Some((z - a).max(0.0)),
            _ => None,
        };
        let cpu_cores = cpu_s.map(|c| c / elapsed_s);
        let cap_waits = ctx.cap_waits.load(Ordering::Relaxed);
        let mut reasons = Vec::new();
        let mut warnings = Vec::new();
        if mode == Mode::Open {
            if send_lag_p99_ms > self.cfg.max_send_lag_ms {
                reasons.push(format!(
                    "send lag p99 {:.2}ms > {}ms: the generator fell behind its schedule",
                    send_lag_p99_ms, self.cfg.max_send_lag_ms
                ));
            }
            if cap_waits > 0 {
                reasons.push(format!(
                    "in-flight cap {} reached: {cap_waits} requests waited for a slot (the loop went partly closed)",
                    self.cfg.max_in_flight.unwrap_or_default()
                ));
            }
        }
        if let Some(c) = cpu_cores
            && c > 0.9 * cores as f64
        {
            reasons.push(format!("generator CPU {c:.2} of {cores} cores"));
        } else if let Some(c) = cpu_cores
            && c > 0.5 * cores as f64
        {
            warnings.push(format!("generator CPU {c:.2} of {cores} cores: it competes with the target"));
        }
        let expected = achieved_rps * rec.corrected_seconds() / completed.max(1) as f64;
        let generator = rec.busy_seconds() / elapsed_s;
        let server_in_flight = server_queue(server);
        let mut hidden = None;
        if expected > 1.5 * generator + 1.0 {
            hidden = Some(format!(
                "{:.1} requests in flight by L = lambda W but {generator:.1} sent: {:.1} waited inside the generator before sending",
                expected,
                expected - generator
            ));
        } else if let Some(srv) = server_in_flight
            && generator > 1.5 * srv + 1.0
        {
            hidden = Some(format!(
                "{generator:.1} requests in flight from the generator but the server counts {srv:.1}: ~{:.1} queue unseen (accept backlog, sockets, a proxy)",
                generator - srv
            ));
        }
        Audit {
            valid: reasons.is_empty(),
            reasons,
            cpu_s,
            cpu_us_per_request: cpu_s.map(|c| c * 1e6 / completed.max(1) as f64),
            cpu_cores,
            connections_opened: self.http.connections_opened().saturating_sub(b.conns0),
            peak_in_flight: ctx.peak.load(Ordering::Relaxed),
            in_flight_cap: if mode == Mode::Open { self.cfg.max_in_flight } else { None },
            cap_waits,
            littles_law: LittlesLaw {
                expected_in_flight: expected,
                generator_in_flight: generator,
                server_in_flight,
                hidden_queueing: hidden,
            },
            warnings,
        }
    }
}

/// The server's own count of requests it holds: `in_flight` plus `queue_depth`, preferring
/// the `capacity` section's totals.
fn server_queue(server: &BTreeMap<String, crate::report::SeriesSummary>) -> Option<f64> {
    let pick = |suffix: &str| {
        server
            .get(&format!("capacity.{suffix}"))
            .or_else(|| {
                server
                    .iter()
                    .filter(|(k, _)| k.ends_with(&format!(".{suffix}")) || k.as_str() == suffix)
                    .min_by_key(|(k, _)| k.len())
                    .map(|(_, v)| v)
            })
            .map(|v| v.mean)
    };
    let in_flight = pick("in_flight")?;
    Some(in_flight + pick("queue_depth").unwrap_or(0.0))
}
