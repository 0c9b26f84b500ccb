//! Whole runs, as the CLI and `cargo xtask lab` call them: a ramp, a sweep, a profile, a
//! smoke check. Each returns a [`Report`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::analysis::{AnalysisConfig, analyze};
use crate::client::Http;
use crate::engine::{Engine, EngineConfig, Workload};
use crate::profiles::{ProfilesFile, ResolvedProfile};
use crate::report::{GeneratorInfo, Report, RunKind, SCHEMA, StepReport};
use crate::sampler::Sampler;
use crate::smoke::{SmokeFailure, smoke};
use crate::tokens::Tokens;
use crate::workload::{AGENT_STEPS, AgentJourney, Readers, Urls};

/// Where server-side figures come from.
#[derive(Debug, Clone, Serialize)]
pub struct Sampling {
    /// e.g. `http://127.0.0.1:8080/v1/ops/status`.
    pub ops_url: Option<String>,
    /// The target's pid, for CPU and RSS from `/proc`.
    pub pid: Option<u32>,
    #[serde(with = "crate::dur")]
    pub interval: Duration,
}

impl Default for Sampling {
    fn default() -> Self {
        Self { ops_url: None, pid: None, interval: Duration::from_secs(1) }
    }
}

/// What a ramp and a sweep share: steps of one length against fixed URLs (sent round-robin, GET
/// or one fixed POST), a pause between them, the engine and the server's sampling. Their configs
/// flatten it, so that a report's `config` keeps these fields at its top level.
#[derive(Debug, Clone, Serialize)]
pub struct UrlSteps {
    pub urls: Vec<String>,
    /// JSON POSTed to the URLs; `None`: they are GET.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(with = "crate::dur")]
    pub step: Duration,
    #[serde(with = "crate::dur")]
    pub pause: Duration,
    #[serde(skip)]
    pub engine: EngineConfig,
    pub sampling: Sampling,
}

impl UrlSteps {
    /// The run's engine (started now), its report (`config`: the whole run's), and the workload
    /// that sends to the URLs.
    fn start(
        &self,
        kind: RunKind,
        name: &str,
        config: serde_json::Value,
        tokens: Tokens,
    ) -> (Engine, Report, Arc<dyn Workload>) {
        let engine = start_engine(self.engine.clone(), &self.sampling, tokens);
        let report = new_report(kind, name, self.urls.first().map_or("", String::as_str), config, &self.engine);
        let body = self.body.clone().map(bytes::Bytes::from);
        (engine, report, Arc::new(Urls { urls: self.urls.clone(), body }))
    }
}

/// An open-loop stepped ramp against fixed URLs.
#[derive(Debug, Clone, Serialize)]
pub struct RampConfig {
    #[serde(flatten)]
    pub run: UrlSteps,
    /// Offered requests per second, one step each, in order.
    pub rates: Vec<f64>,
    pub analysis: AnalysisConfig,
}

/// A closed-loop sweep over caller counts.
#[derive(Debug, Clone, Serialize)]
pub struct SweepConfig {
    #[serde(flatten)]
    pub run: UrlSteps,
    pub concurrency: Vec<usize>,
}

/// A profile from the profiles file, against the chat API at `base`.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileConfig {
    pub base: String,
    /// The API's ops listener (`OPS_ADDR`): readiness and ops status, probed by the smoke stage.
    pub ops_base: Option<String>,
    pub profile: String,
    #[serde(skip)]
    pub profiles: ProfilesFile,
    /// The last measured capacity, for rates given as fractions of it.
    pub capacity_rps: Option<f64>,
    pub time_scale: f64,
    #[serde(skip)]
    pub engine: EngineConfig,
    pub analysis: AnalysisConfig,
    pub sampling: Sampling,
    /// Whether the smoke stage runs first (skipped only for a population started beside another
    /// load, whose path was checked before, and which may make `/ready` fail meanwhile).
    pub smoke: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Smoke(#[from] Box<SmokeFailure>),
}

fn engine_json(e: &EngineConfig) -> serde_json::Value {
    serde_json::json!({
        "arrivals": e.arrivals,
        "pacer": e.pacer,
        "seed": e.seed,
        "max_in_flight": e.max_in_flight,
        "max_send_lag_ms": e.max_send_lag_ms,
        "timeout": humantime::format_duration(e.timeout).to_string(),
    })
}

fn new_report(kind: RunKind, name: &str, target: &str, mut config: serde_json::Value, engine: &EngineConfig) -> Report {
    if let Some(o) = config.as_object_mut() {
        o.insert("engine".into(), engine_json(engine));
    }
    Report {
        schema: SCHEMA.into(),
        kind,
        name: name.into(),
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        target: target.into(),
        config,
        generator: GeneratorInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
        },
        smoke: None,
        steps: Vec::new(),
        analysis: None,
        tenants: Vec::new(),
        fairness: None,
        samples: Vec::new(),
    }
}

fn finish(mut report: Report, engine: &Engine, steps: Vec<StepReport>, analysis: Option<&AnalysisConfig>) -> Report {
    report.samples = engine.sampler.finish();
    report.analysis = analysis.map(|a| analyze(&steps, a));
    report.steps = steps;
    let (tenants, fairness) = engine.tenant_reports();
    report.tenants = tenants;
    report.fairness = fairness;
    report
}

/// Told of each step as it ends (the CLI prints it).
pub type Progress<'a> = Option<&'a (dyn Fn(&StepReport) + Sync)>;

/// A run's engine, started now, with its server sampler.
fn start_engine(engine: EngineConfig, sampling: &Sampling, tokens: Tokens) -> Engine {
    let start = Instant::now();
    let sampler = Sampler::start(sampling.ops_url.clone(), sampling.pid, sampling.interval, start);
    Engine::new(engine, tokens, sampler, start)
}

/// A step per item, one after the other with `pause` between them, each told to `progress` as
/// it ends.
async fn in_turn<'i, T, F>(
    items: &'i [T],
    pause: Duration,
    progress: Progress<'_>,
    mut step: impl FnMut(usize, &'i T) -> F,
) -> Vec<StepReport>
where
    F: Future<Output = StepReport>,
{
    let mut steps = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let s = step(i, item).await;
        if let Some(p) = progress {
            p(&s);
        }
        steps.push(s);
    }
    steps
}

/// Runs an open-loop ramp and reads its curve. Prints each step as it ends when `progress`.
pub async fn ramp(cfg: &RampConfig, tokens: Tokens, progress: Progress<'_>) -> Report {
    let (engine, report, workload) =
        cfg.run.start(RunKind::Ramp, "ramp", serde_json::to_value(cfg).unwrap_or_default(), tokens);
    let steps = in_turn(&cfg.rates, cfg.run.pause, progress, |i, rate| {
        engine.open_step(i, format!("{rate:.0}/s"), *rate, cfg.run.step, vec![(*rate, Arc::clone(&workload))])
    })
    .await;
    finish(report, &engine, steps, Some(&cfg.analysis))
}

/// Runs a closed-loop sweep: throughput, p50 and p99 per caller count.
pub async fn sweep(cfg: &SweepConfig, tokens: Tokens, progress: Progress<'_>) -> Report {
    let (engine, report, workload) =
        cfg.run.start(RunKind::Sweep, "sweep", serde_json::to_value(cfg).unwrap_or_default(), tokens);
    let steps = in_turn(&cfg.concurrency, cfg.run.pause, progress, |i, c| {
        engine.closed_step(i, format!("{c} callers"), *c, cfg.run.step, Arc::clone(&workload))
    })
    .await;
    finish(report, &engine, steps, None)
}

/// Only the smoke stage.
pub async fn smoke_only(
    base: &str,
    ops: Option<&str>,
    tokens: &Tokens,
    timeout: Duration,
) -> Result<crate::report::SmokeReport, Box<SmokeFailure>> {
    smoke(&Http::new(timeout), base, ops, tokens).await.map_err(Box::new)
}

/// Runs a profile: the smoke stage, then each stage of agent journeys and readers, open loop.
pub async fn profile(cfg: &ProfileConfig, tokens: Tokens, progress: Progress<'_>) -> Result<Report, RunError> {
    let resolved: ResolvedProfile =
        cfg.profiles.resolve(&cfg.profile, cfg.capacity_rps, cfg.time_scale).map_err(RunError::Config)?;
    let smoke_report = if cfg.smoke {
        Some(
            smoke(&Http::new(cfg.engine.timeout), &cfg.base, cfg.ops_base.as_deref(), &tokens)
                .await
                .map_err(Box::new)?,
        )
    } else {
        None
    };

    let mut engine_cfg = cfg.engine.clone();
    engine_cfg.arrivals = resolved.arrivals;
    let engine = start_engine(engine_cfg.clone(), &cfg.sampling, tokens);
    let mut config = serde_json::to_value(cfg).unwrap_or_default();
    if let Some(o) = config.as_object_mut() {
        o.insert(
            "stages".into(),
            serde_json::json!(
                resolved
                    .stages
                    .iter()
                    .map(|s| serde_json::json!({
                        "label": s.label, "rps": s.rps, "duration": humantime::format_duration(s.duration).to_string()
                    }))
                    .collect::<Vec<_>>()
            ),
        );
        o.insert("reader_share".into(), resolved.reader_share.into());
        o.insert("think_time".into(), humantime::format_duration(resolved.think_time).to_string().into());
    }
    let mut report = new_report(RunKind::Profile, &cfg.profile, &cfg.base, config, &engine_cfg);
    report.smoke = smoke_report;

    let readers: Arc<dyn Workload> = Arc::new(Readers { base: cfg.base.clone() });
    let agents: Arc<dyn Workload> = Arc::new(AgentJourney { base: cfg.base.clone(), think: resolved.think_time });
    let steps = in_turn(&resolved.stages, resolved.pause, progress, |i, st| {
        let reader_rate = st.rps * resolved.reader_share;
        let journey_rate = st.rps * (1.0 - resolved.reader_share) / AGENT_STEPS as f64;
        let streams = vec![(reader_rate, Arc::clone(&readers)), (journey_rate, Arc::clone(&agents))];
        engine.open_step(i, st.label.clone(), st.rps, st.duration, streams)
    })
    .await;
    Ok(finish(report, &engine, steps, Some(&cfg.analysis)))
}
