//! Reading a run: the rows of each step from the load lab's report and the samples `lab` took
//! beside it, what saturated, the noisy-neighbour and flood figures per tenant, and the capacity
//! from the calibration. Pure functions of what was measured.

use std::collections::BTreeMap;

use anyhow::Context as _;
use breakwater_loadlab::report::{StepReport, TenantReport};

use super::{Capacity, Change, DbCapRecord, Flood, LabRecord, Noisy, PhaseRun, Row, SCHEMA, SLO_MS, XSample};

impl Capacity {
    /// The highest calibration rate whose step met the objective with at most 1% refused and
    /// 0.1% errors and goodput tracking the offer (the load lab's reading at headroom 1).
    pub(crate) fn from_calibration(run: &PhaseRun, quick: bool) -> anyhow::Result<Self> {
        let calibration = rows(run, None);
        // Not the load lab's own reading: a journey's tail outlasts its step, so "achieved tracks
        // offered" is not a fair test of a short step of the full mix.
        let read = calibration.iter().filter(|r| meets_objective(r)).filter_map(|r| r.offered_rps).reduce(f64::max);
        match read {
            Some(rps) => Ok(Self {
                rps,
                how: "the highest calibration rate whose step met admitted p99 <= 200 ms with <= 1% refused and \
                      <= 0.1% errors (valid steps only), adaptive variant"
                    .into(),
                calibration,
            }),
            // A smoke check must run even on a machine too busy to meet the objective anywhere.
            None if quick => {
                let rps = run.report.steps.first().and_then(|s| s.offered_rps).unwrap_or(10.0);
                Ok(Self {
                    rps,
                    how: "NO calibration step met the objective; the lowest rate is used (quick mode only)".into(),
                    calibration,
                })
            }
            None => anyhow::bail!(
                "no calibration step met p99 <= 200 ms: the machine is too busy or the API is broken; see {}",
                run.name
            ),
        }
    }
}

impl LabRecord {
    /// A saved `lab.json` (`source` names it in errors), read with this code's rules: what
    /// saturated and the goodput are derived again ([`recompute`]).
    pub(crate) fn from_json(text: &str, source: &str) -> anyhow::Result<Self> {
        let mut lab: Self = serde_json::from_str(text).with_context(|| format!("{source} is not a lab.json"))?;
        anyhow::ensure!(lab.schema == SCHEMA, "{source} has schema {}, not {SCHEMA}", lab.schema);
        recompute(&mut lab);
        Ok(lab)
    }
}

/// 2xx/s when the step's admitted p99 met 200 ms, else nothing (a step the
/// load generator could not keep to its schedule still counts what the server did, and says so).
pub(crate) fn goodput(r: &Row) -> f64 {
    if r.ok > 0 && r.ok_p99_ms <= SLO_MS { r.ok_rps } else { 0.0 }
}

/// Derives goodput and what saturated from each row's figures, once the run is complete (what
/// saturated needs the whole lab: the API's CPU allowance, the database's quota). `--from-json`
/// calls it again, so a report re-read with newer code uses its rules.
pub(crate) fn recompute(lab: &mut LabRecord) {
    let cores = api_cores(lab);
    let mut rows: Vec<&mut Row> = Vec::new();
    if let Some(c) = lab.capacity.as_mut() {
        rows.extend(c.calibration.iter_mut());
    }
    for v in &mut lab.variants {
        rows.extend(
            v.sweep
                .iter_mut()
                .chain(v.sweep_honouring.iter_mut())
                .chain(v.sweep_one.iter_mut())
                .chain(v.ramp.iter_mut())
                .chain(v.ramp_one.iter_mut())
                .chain(v.ramp_honouring.iter_mut())
                .chain(v.change.phases.iter_mut()),
        );
        rows.extend(v.noisy.as_mut().map(|n| &mut n.row));
        rows.extend(v.flood.as_mut().map(|f| &mut f.others.row));
    }
    for r in rows {
        r.goodput_rps = goodput(r);
        r.saturated = saturated(r, cores);
    }
    for v in &mut lab.variants {
        db_cap_evidence(&mut v.change.phases, v.change.db_cap.as_ref());
    }
}

/// The CPU the API could use: its quota when pinned, the machine's cores when it ran unpinned.
#[allow(clippy::cast_precision_loss)]
fn api_cores(lab: &LabRecord) -> f64 {
    if lab.machine.unpinned.is_some() { lab.machine.cores as f64 } else { lab.plan.api_cpus }
}

/// A valid step whose admitted p99 met 200 ms, refusing at most 1% and erring at most 0.1%.
pub(crate) fn meets_objective(r: &Row) -> bool {
    r.valid && r.ok > 0 && r.ok_p99_ms <= SLO_MS && r.refused_share <= 0.01 && r.error_share <= 0.001
}

impl Noisy {
    pub(crate) fn from_run(run: &PhaseRun, noisy_tenant: &str) -> Option<Self> {
        let row = rows(run, None).into_iter().next()?;
        // The tokens file has a line per (tenant, user): add them up per tenant.
        let mut per: BTreeMap<&str, (u64, u64, u64, u64, f64)> = BTreeMap::new();
        for t in &run.report.tenants {
            let e = per.entry(t.tenant_id.as_str()).or_default();
            e.0 += t.sent;
            e.1 += t.ok;
            e.2 += t.refused;
            e.3 += t.errors;
            if t.ok > 0 {
                e.4 = e.4.max(t.ok_p99_ms);
            }
        }
        let noisy = per.get(noisy_tenant).copied().unwrap_or_default();
        let quiet: Vec<_> = per.iter().filter(|(id, _)| **id != noisy_tenant).map(|(_, v)| *v).collect();
        let sum = |f: fn(&(u64, u64, u64, u64, f64)) -> u64| quiet.iter().map(f).sum::<u64>();
        let (quiet_sent, quiet_ok) = (sum(|q| q.0), sum(|q| q.1));
        let weighted = quiet.iter().filter(|q| q.1 > 0).map(|q| q.4 * q.1 as f64).sum::<f64>() / quiet_ok.max(1) as f64;
        let quiet_refused_by_code = refused_by_code(run.report.tenants.iter().filter(|t| t.tenant_id != noisy_tenant));
        Some(Self {
            tenant: noisy_tenant.to_owned(),
            offered_rps: row.offered_rps.unwrap_or_default(),
            noisy_sent: noisy.0,
            noisy_ok: noisy.1,
            noisy_refused: noisy.2,
            quiet_tenants: quiet.len(),
            quiet_sent,
            quiet_ok,
            quiet_refused: sum(|q| q.2),
            quiet_refused_by_code,
            quiet_errors: sum(|q| q.3),
            quiet_success: if quiet_sent == 0 { 0.0 } else { quiet_ok as f64 / quiet_sent as f64 },
            quiet_p99_worst_ms: quiet.iter().filter(|q| q.1 > 0).map(|q| q.4).fold(0.0, f64::max),
            quiet_p99_weighted_ms: weighted,
            row,
        })
    }
}

impl Flood {
    pub(crate) fn from_run(run: &PhaseRun, tenant: &str, tenant_rate: f64) -> Option<Self> {
        let others = Noisy::from_run(run, tenant)?;
        let flooder = run.flooder.as_ref()?;
        let step = flooder.steps.first()?;
        let codes = step.refused.by_code.clone();
        // The API started fresh for this run: its totals since start are the run's.
        let last = |key: &str| run.report.steps.last().and_then(|s| s.server.get(key)).map(|x| x.last);
        let shed = last("layers.capacity.shed.queue_full")
            .zip(last("layers.capacity.shed.queue_timeout"))
            .map(|(a, b)| a + b + last("layers.capacity.shed.deadline").unwrap_or(0.0));
        let admitted = last("layers.capacity.admitted_total");
        Some(Self {
            tenant: tenant.to_owned(),
            tenant_rate,
            callers: step.concurrency.unwrap_or(0),
            flooder_sent: step.completed,
            flooder_ok: step.ok.count,
            flooder_refused_by_code: codes,
            others,
            shed_percent: shed.zip(admitted).map(|(s, a)| if s + a > 0.0 { 100.0 * s / (s + a) } else { 0.0 }),
        })
    }
}

/// These tenants' refusals, added up per envelope code.
pub(crate) fn refused_by_code<'a>(tenants: impl Iterator<Item = &'a TenantReport>) -> BTreeMap<String, u64> {
    let mut codes = BTreeMap::new();
    for t in tenants {
        for (code, n) in &t.refused_by_code {
            *codes.entry(code.clone()).or_default() += n;
        }
    }
    codes
}

fn series<'a>(s: &'a StepReport, key: &str) -> Option<&'a breakwater_loadlab::report::SeriesSummary> {
    s.server.get(key)
}

/// Admission's limit over the step, summed over the route classes that had a request in flight
/// in it: a class the step never used (the event streams' in every lab step, the lists' in a
/// step of writes) would add its idle limit and hide a limit the step did reach. A step with no
/// per-class figures falls back to the process's sum (`layers.capacity.limit`).
fn busy_limit(server: &BTreeMap<String, breakwater_loadlab::report::SeriesSummary>) -> Option<f64> {
    let mut sum = None;
    for i in 0.. {
        let Some(limit) = server.get(&format!("layers.capacity.classes.{i}.limit")) else { break };
        if server.get(&format!("layers.capacity.classes.{i}.in_flight")).is_some_and(|f| f.max > 0.0) {
            *sum.get_or_insert(0.0) += limit.mean;
        }
    }
    sum.or_else(|| server.get("layers.capacity.limit").map(|x| x.mean))
}

/// The rows of a run: each step with the samples of its window (what saturated is filled in by
/// [`recompute`]).
pub(crate) fn rows(run: &PhaseRun, capacity: Option<f64>) -> Vec<Row> {
    let mut out = Vec::new();
    let mut timeouts_before = 0.0;
    let mut edge_before = 0.0;
    for (i, s) in run.report.steps.iter().enumerate() {
        let mut r = Row {
            label: s.label.clone(),
            offered_rps: s.offered_rps,
            multiple: s.offered_rps.zip(capacity).map(|(o, c)| o / c),
            callers: s.concurrency,
            elapsed_s: s.elapsed_s,
            completed: s.completed,
            ok: s.ok.count,
            refused: s.refused.stats.count,
            achieved_rps: s.achieved_rps,
            ok_rps: s.goodput_rps,
            ok_p50_ms: s.ok.corrected.p50_ms,
            ok_p99_ms: s.ok.corrected.p99_ms,
            shed_p50_ms: (s.refused.stats.count > 0).then_some(s.refused.stats.corrected.p50_ms),
            refused_share: s.refused_share,
            error_share: s.error_share,
            refusal_codes: s.refused.by_code.clone(),
            error_kinds: s.errors.by_kind.clone(),
            valid: s.audit.valid,
            invalid: s.audit.reasons.clone(),
            limit_mean: busy_limit(&s.server),
            in_flight_mean: series(s, "layers.capacity.in_flight").map(|x| x.mean),
            pool_waiting_mean: series(s, "layers.bulkhead.waiting").map(|x| x.mean),
            rss_max_bytes: series(s, "proc.rss_bytes").map(|x| x.max),
            logical: s.logical.clone(),
            ..Row::default()
        };
        r.goodput_rps = goodput(&r);
        if let Some(t) = series(s, "layers.bulkhead.acquire_timeouts") {
            r.pool_timeouts = Some((t.last - timeouts_before).max(0.0));
            timeouts_before = t.last;
        }
        let edge = ["layers.connections.refused", "layers.connections.reset"]
            .iter()
            .filter_map(|k| series(s, k).map(|x| x.last))
            .reduce(|a, b| a + b);
        if let Some(e) = edge {
            r.edge_refused = Some((e - edge_before).max(0.0));
            edge_before = e;
        }
        if let Some(&end) = run.step_ends.get(i) {
            window(&mut r, &run.samples, end - s.elapsed_s, end);
        }
        if r.api_cpu_cores.is_none() {
            r.api_cpu_cores = series(s, "proc.cpu_cores").map(|x| x.mean);
            r.api_cpu_s = r.api_cpu_cores.map(|c| c * s.elapsed_s);
        }
        out.push(r);
    }
    out
}

/// Fills the figures sampled by `lab` in [start, end]: counters as differences between the last
/// sample at or before each end (so a window shorter than the interval still gets a reading).
fn window(r: &mut Row, samples: &[XSample], start: f64, end: f64) {
    let at = |t: f64| samples.iter().rev().find(|x| x.t_s <= t).or_else(|| samples.first());
    let inside: Vec<&XSample> = samples.iter().filter(|x| x.t_s >= start && x.t_s <= end).collect();
    r.health_probes = inside.len();
    r.health_failures = inside.iter().filter(|x| x.health_ms.is_none()).count();
    r.health_max_ms = inside.iter().filter_map(|x| x.health_ms).reduce(f64::max);
    let active: Vec<f64> = inside.iter().filter_map(|x| x.pg_active).map(|a| a as f64).collect();
    r.pg_active_mean = (!active.is_empty()).then(|| active.iter().sum::<f64>() / active.len() as f64);
    let (Some(a), Some(b)) = (at(start), at(end)) else { return };
    let dt = b.t_s - a.t_s;
    if dt <= 0.0 {
        return;
    }
    if let (Some(ca), Some(cb)) = (a.cgroup, b.cgroup) {
        let periods = cb.nr_periods.saturating_sub(ca.nr_periods);
        if periods > 0 {
            r.throttled_share = Some(cb.nr_throttled.saturating_sub(ca.nr_throttled) as f64 / periods as f64);
        }
        if let (Some(ua), Some(ub)) = (ca.usage_us, cb.usage_us) {
            let cores = ub.saturating_sub(ua) as f64 / 1e6 / dt;
            r.api_cpu_cores = Some(cores);
            r.api_cpu_s = Some(cores * r.elapsed_s);
        }
    }
    if let (Some(pa), Some(pb)) = (&a.postgres_cpu_s, &b.postgres_cpu_s) {
        r.postgres_cpu_cores = Some(cpu_delta(pa, pb) / dt);
    }
    if let (Some((ba, ta)), Some((bb, tb))) = (a.machine, b.machine)
        && tb > ta
    {
        r.machine_busy = Some(bb.saturating_sub(ba) as f64 / (tb - ta) as f64);
    }
}

/// What saturated during a step, strongest evidence first; empty when nothing did.
pub(crate) fn saturated(r: &Row, api_cores: f64) -> Vec<String> {
    let mut out = Vec::new();
    match (r.throttled_share, r.api_cpu_cores) {
        (Some(t), c) if t >= 0.5 => out.push(format!(
            "API CPU quota (throttled in {:.0}% of periods{})",
            t * 100.0,
            c.map_or(String::new(), |c| format!(", {c:.2} cores"))
        )),
        (None, Some(c)) if c >= 0.9 * api_cores => out.push(format!("API CPU ({c:.2} cores of {api_cores})")),
        _ => {}
    }
    let waiting = r.pool_waiting_mean.unwrap_or(0.0);
    let timeouts = r.pool_timeouts.unwrap_or(0.0);
    if waiting >= 1.0 || timeouts > 0.0 {
        // Who held the slots: with few of PostgreSQL's backends active, the holders were requests
        // outside the database (paused by the CPU quota, or serialising), and more slots would
        // only let more of them share the same CPU (docs/ADMISSION.md measured 20 against 10).
        let active = r.pg_active_mean.map_or(String::new(), |a| format!("; {a:.1} PostgreSQL backends active"));
        out.push(format!("DB pool ({waiting:.1} waiting on average, {timeouts:.0} db_saturated{active})"));
    }
    if let Some(e) = r.edge_refused.filter(|e| *e > 0.0) {
        out.push(format!("connection cap ({e:.0} connections refused or reset at accept)"));
    }
    if let Some(p) = r.postgres_cpu_cores.filter(|p| *p >= 0.75) {
        out.push(format!("database CPU ({p:.2} cores)"));
    }
    if let Some(m) = r.machine_busy.filter(|m| *m >= 0.95) {
        out.push(format!("machine CPU ({:.0}% busy)", m * 100.0));
    }
    if let (Some(l), Some(f)) = (r.limit_mean, r.in_flight_mean)
        && l > 0.0
        && f >= 0.9 * l
    {
        out.push(format!("admission limit ({f:.0} in flight of {l:.0})"));
    }
    if !r.valid {
        out.push(format!("load generator ({})", r.invalid.join("; ")));
    }
    out
}

/// The capacity-change run: its three phases, the limit over time and the slowed window.
pub(crate) fn change(run: &PhaseRun) -> Change {
    // The limit of the classes the run used, as in the rows (`busy_limit`).
    let class = |i: usize, what: &str| format!("layers.capacity.classes.{i}.{what}");
    let classes = (0..).take_while(|&i| run.report.samples.iter().any(|s| s.values.contains_key(&class(i, "limit"))));
    let busy: Vec<String> = classes
        .filter(|&i| run.report.samples.iter().any(|s| s.values.get(&class(i, "in_flight")).is_some_and(|f| *f > 0.0)))
        .map(|i| class(i, "limit"))
        .collect();
    let timeline = run
        .report
        .samples
        .iter()
        .filter_map(|s| {
            let in_flight = *s.values.get("layers.capacity.in_flight")?;
            let limit = if busy.is_empty() {
                s.values.get("layers.capacity.limit").copied()
            } else {
                busy.iter().map(|k| s.values.get(k)).sum::<Option<f64>>()
            };
            Some((s.t_s, limit, in_flight))
        })
        .collect();
    let slowed: Vec<f64> = run.report.samples.iter().filter(|s| s.step == Some(1)).map(|s| s.t_s).collect();
    let slowed = slowed.first().zip(slowed.last()).map(|(a, b)| (*a, *b));
    let phases = rows(run, None);
    Change { phases, timeline, slowed, burn: run.burn.clone(), db_cap: run.db_cap.clone() }
}

/// The sampler sees PostgreSQL's CPU as a whole; under the quota of the slowed phase (the second),
/// the quota is the evidence, named first.
fn db_cap_evidence(phases: &mut [Row], cap: Option<&DbCapRecord>) {
    if let (Some(c), Some(row)) = (cap, phases.get_mut(1))
        && c.throttled_share >= 0.5
    {
        row.saturated.insert(
            0,
            format!("database CPU quota (throttled in {:.0}% of periods, {} cores)", c.throttled_share * 100.0, c.cpus),
        );
    }
}

/// CPU seconds spent between two per-pid readings: a process in both counts its growth, one
/// that started in between counts all of it, one that exited in between is lost (its last
/// interval cannot be read any more).
fn cpu_delta(a: &BTreeMap<u32, f64>, b: &BTreeMap<u32, f64>) -> f64 {
    b.iter().map(|(pid, cb)| (cb - a.get(pid).copied().unwrap_or(0.0)).max(0.0)).sum()
}

pub(crate) fn at(rows: &[Row], m: f64) -> Option<&Row> {
    rows.iter().find(|r| r.multiple.is_some_and(|x| (x - m).abs() < 1e-6))
}

/// The step of a sweep with `n` callers.
pub(crate) fn callers(rows: &[Row], n: usize) -> Option<&Row> {
    rows.iter().find(|r| r.callers == Some(n))
}

/// Capacity: the most 2xx/s a ramp step served while meeting the objective (admitted p99 <= 200
/// ms, refusing <= 1%, erring <= 0.1%): what was achieved, not the rate offered.
pub(crate) fn capacity_achieved(ramp: &[Row]) -> Option<f64> {
    ramp.iter().filter(|r| meets_objective(r)).map(|r| r.ok_rps).reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::quarter_core;
    use crate::record::fixtures::lab_with;

    #[test]
    fn database_cpu_survives_backends_coming_and_going() {
        let a = BTreeMap::from([(1, 10.0), (2, 5.0), (3, 7.0)]);
        // 1 grew by 1 s, 2 exited, 3 grew by 0.5 s, 4 started and used 0.25 s.
        let b = BTreeMap::from([(1, 11.0), (3, 7.5), (4, 0.25)]);
        assert!((cpu_delta(&a, &b) - 1.75).abs() < 1e-9);
    }

    #[test]
    fn the_limit_counts_only_the_classes_the_step_used() {
        use breakwater_loadlab::report::SeriesSummary;
        let at = |mean: f64, max: f64| SeriesSummary { mean, max, last: mean };
        let server = BTreeMap::from([
            ("layers.capacity.limit".to_owned(), at(72.0, 72.0)),
            ("layers.capacity.classes.0.limit".to_owned(), at(40.0, 40.0)),
            ("layers.capacity.classes.0.in_flight".to_owned(), at(36.0, 40.0)),
            ("layers.capacity.classes.1.limit".to_owned(), at(22.0, 22.0)),
            ("layers.capacity.classes.1.in_flight".to_owned(), at(0.5, 3.0)),
            ("layers.capacity.classes.2.limit".to_owned(), at(10.0, 10.0)),
            ("layers.capacity.classes.2.in_flight".to_owned(), at(0.0, 0.0)),
        ]);
        assert_eq!(busy_limit(&server), Some(62.0), "the idle third class is left out");
        let old = BTreeMap::from([("layers.capacity.limit".to_owned(), at(72.0, 72.0))]);
        assert_eq!(busy_limit(&old), Some(72.0), "without per-class figures, the process's sum");
        assert_eq!(busy_limit(&BTreeMap::new()), None, "admission off");
    }

    #[test]
    fn saturation_names_each_piece_of_evidence() {
        let mut r = Row { valid: true, ..Row::default() };
        assert!(saturated(&r, quarter_core()).is_empty(), "nothing to report");
        r.throttled_share = Some(0.8);
        r.api_cpu_cores = Some(0.25);
        r.pool_waiting_mean = Some(3.0);
        r.pg_active_mean = Some(0.4);
        r.postgres_cpu_cores = Some(1.1);
        r.limit_mean = Some(20.0);
        r.in_flight_mean = Some(19.0);
        r.valid = false;
        r.invalid = vec!["send lag".into()];
        let s = saturated(&r, quarter_core()).join(" | ");
        for needle in [
            "API CPU quota (throttled in 80%",
            "DB pool (3.0 waiting on average, 0 db_saturated; 0.4 PostgreSQL backends active)",
            "database CPU (1.10",
            "admission limit (19",
            "load generator (send lag)",
        ] {
            assert!(s.contains(needle), "{needle} in {s}");
        }
        // Without the cgroup's counters, the process's CPU against what it could use is the
        // evidence: the quota, or the machine's cores when it ran unpinned.
        let busy = Row { valid: true, api_cpu_cores: Some(0.24), ..Row::default() };
        assert_eq!(saturated(&busy, quarter_core()), vec!["API CPU (0.24 cores of 0.25)".to_owned()]);
        assert!(saturated(&busy, 2.0).is_empty(), "a quarter core of two is not saturation");
        let mut lab = lab_with(vec![busy]);
        recompute(&mut lab);
        assert_eq!(lab.variants[0].ramp[0].saturated, vec!["API CPU (0.24 cores of 0.25)".to_owned()], "pinned");
        lab.machine.unpinned = Some("not root".into());
        recompute(&mut lab);
        assert!(lab.variants[0].ramp[0].saturated.is_empty(), "unpinned, on 2 cores");
    }

    #[test]
    fn recomputing_keeps_the_database_quota_as_the_slowed_phases_evidence() {
        let phase = |waiting: f64| Row { valid: true, pool_waiting_mean: Some(waiting), ..Row::default() };
        let mut lab = lab_with(Vec::new());
        lab.variants[0].change = Change {
            phases: vec![phase(0.0), phase(12.0), phase(0.0)],
            db_cap: Some(DbCapRecord { cpus: 0.15, backends: 10, throttled_share: 0.97, cpu_cores: Some(0.15) }),
            ..Change::default()
        };
        // Twice: a report rendered again from its JSON says the same.
        for _ in 0..2 {
            recompute(&mut lab);
            let slowed = &lab.variants[0].change.phases[1].saturated;
            assert_eq!(slowed.len(), 2, "{slowed:?}");
            assert!(
                slowed[0].starts_with("database CPU quota (throttled in 97% of periods, 0.15 cores)"),
                "{slowed:?}"
            );
            assert!(slowed[1].starts_with("DB pool (12.0 waiting"), "{slowed:?}");
            assert!(lab.variants[0].change.phases[0].saturated.is_empty());
        }
    }
}
