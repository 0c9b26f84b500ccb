//! `loadlab`: the load lab's command line. See docs/LOADLAB.md.
//!
//! Here are its arguments; `commands` does what each subcommand asks.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use breakwater_loadlab::analysis::AnalysisConfig;
use breakwater_loadlab::profiles::parse_duration;
use breakwater_loadlab::runs::Sampling;
use breakwater_loadlab::schedule::Pacer;
use breakwater_loadlab::tokens::{DEV_SECRET, Tokens};
use breakwater_loadlab::{Arrivals, EngineConfig};
use clap::{Args, Parser, Subcommand};

/// glibc's allocator grew and trimmed its per-thread heaps about once per request under
/// bursty open-loop traffic (one `mprotect` each); mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "loadlab", version, about = "Open-loop load generator: finds the knee, the capacity and the refusals")]
struct Cli {
    /// Runtime worker threads (default: one per core). Fewer threads mean fewer wake-ups per
    /// request when the generator shares a small machine with its target.
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Open-loop stepped ramp against fixed URLs; reads the knee, saturation and capacity.
    Ramp(RampArgs),
    /// Closed-loop sweep over caller counts (the congestive-collapse table).
    Sweep(SweepArgs),
    /// A profile from the profiles file (smoke stage first), against the chat API.
    Profile(ProfileArgs),
    /// Only the smoke stage: each journey step's status and body shape.
    Smoke(SmokeArgs),
    /// Compare two reports; exits 1 on a real regression, 0 otherwise.
    Compare(CompareArgs),
    /// Re-print a saved report (and re-read its curve with another objective, or render HTML).
    Report(ReportArgs),
    /// Hold N live-inbox streams open while messages are written: events lost, latency from a
    /// write's transaction to its event, refusals at opening (docs/LOADLAB.md).
    Streams(StreamsArgs),
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

#[derive(Debug, Args)]
struct EngineArgs {
    /// Arrival process of the open loop.
    #[arg(long, value_enum, default_value_t = Arrivals::Constant)]
    arrivals: Arrivals,
    /// What keeps time: a dedicated thread (precise) or the runtime's 1 ms timer (cheaper).
    #[arg(long, value_enum, default_value_t = Pacer::Thread)]
    pacer: Pacer,
    /// Seed of the arrival schedule and of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Whole-request timeout (counted as an error).
    #[arg(long, value_parser = duration, default_value = "10s")]
    timeout: Duration,
    /// Cap on requests (and connections) in flight; 0 for none. Reaching it marks the step
    /// invalid (generator saturation: the loop went partly closed).
    #[arg(long, default_value_t = breakwater_loadlab::engine::DEFAULT_MAX_IN_FLIGHT)]
    max_in_flight: usize,
    /// Send lag p99 above which a step is marked generator-limited.
    #[arg(long, value_parser = duration, default_value = "10ms")]
    max_send_lag: Duration,
    /// Honour Retry-After: after a refusal, a client (a token) sends nothing until the header's
    /// seconds (plus up to 20% jitter) have passed, and retries the refused request as SDK
    /// policies do (three attempts at most, within gRPC's retry budget); each step then reports
    /// attempts per success and the time to success. Without it a refusal ends the request, and
    /// the client sends its next at once.
    #[arg(long)]
    honour_retry_after: bool,
    /// Open a new connection for every request (`Connection: close`) instead of keeping them
    /// alive: what a refusal costs a server that must accept each one.
    #[arg(long)]
    new_connection_per_request: bool,
    /// Keep each step second by second as well (offered, 2xx, refusals by code, errors by kind,
    /// 2xx p50/p99), in the JSON report's `timeline`: for a change inside one step.
    #[arg(long)]
    timeline: bool,
}

impl EngineArgs {
    fn config(&self) -> EngineConfig {
        EngineConfig {
            arrivals: self.arrivals,
            pacer: self.pacer,
            seed: self.seed,
            max_in_flight: (self.max_in_flight > 0).then_some(self.max_in_flight),
            max_send_lag_ms: self.max_send_lag.as_secs_f64() * 1000.0,
            timeout: self.timeout,
            new_connections: self.new_connection_per_request,
            honour: self.honour_retry_after.then(breakwater_loadlab::retry::RetryPolicy::default),
            timeline: self.timeline,
        }
    }
}

#[derive(Debug, Args)]
struct TokenArgs {
    /// JSON lines of {"tenant_id","user_id","token","weight"}; lines without a token are
    /// minted with the secret.
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Mint N synthetic tenants skewed like the seed (55% on the first).
    #[arg(long, conflicts_with = "tokens")]
    mint_tenants: Option<usize>,
    /// HS256 secret shared with the API.
    #[arg(long, env = "JWT_SECRET", default_value = DEV_SECRET, hide_env_values = true)]
    jwt_secret: String,
}

impl TokenArgs {
    fn load(&self, seed: u64) -> anyhow::Result<Tokens> {
        match (&self.tokens, self.mint_tenants) {
            (Some(p), _) => Tokens::from_file(p, &self.jwt_secret),
            (None, Some(n)) => Tokens::synthetic(n, &self.jwt_secret, seed),
            (None, None) => Ok(Tokens::none()),
        }
    }
}

#[derive(Debug, Args)]
struct SamplingArgs {
    /// The target's ops status URL, polled during the run.
    #[arg(long)]
    ops_url: Option<String>,
    /// The target's pid: its CPU and RSS are read from /proc.
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, value_parser = duration, default_value = "1s")]
    sample_interval: Duration,
}

impl SamplingArgs {
    fn config(&self) -> Sampling {
        Sampling { ops_url: self.ops_url.clone(), pid: self.pid, interval: self.sample_interval }
    }
}

#[derive(Debug, Args)]
struct AnalysisArgs {
    /// The p99 objective for ok responses.
    #[arg(long, value_parser = duration, default_value = "200ms")]
    slo_p99: Duration,
    /// Plan at this fraction of the highest rate meeting the objective.
    #[arg(long, default_value_t = 0.7)]
    headroom: f64,
    /// The server's CPU quota in cores (e.g. 0.25), to judge whether its CPU saturated.
    #[arg(long)]
    server_cpus: Option<f64>,
    /// A percentile has risen (the knee) past this factor of its best earlier value...
    #[arg(long, default_value_t = 1.5)]
    knee_factor: f64,
    /// ...and by at least this much (the noise floor).
    #[arg(long, value_parser = duration, default_value = "5ms")]
    knee_min_rise: Duration,
}

impl AnalysisArgs {
    fn config(&self) -> AnalysisConfig {
        AnalysisConfig {
            slo_p99_ms: self.slo_p99.as_secs_f64() * 1000.0,
            headroom: self.headroom,
            server_cpus: self.server_cpus,
            knee_factor: self.knee_factor,
            knee_min_rise_ms: self.knee_min_rise.as_secs_f64() * 1000.0,
            ..AnalysisConfig::default()
        }
    }
}

#[derive(Debug, Args)]
struct OutArgs {
    /// Write the JSON report here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the self-contained HTML report here.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Print only the final table.
    #[arg(long)]
    quiet: bool,
}

/// What a load run takes besides its shape: the engine, the tokens, the server's sampling.
#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    tokens: TokenArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

impl RunArgs {
    fn tokens(&self) -> anyhow::Result<Tokens> {
        self.tokens.load(self.engine.seed)
    }
}

/// A run whose curve is read (a ramp, a profile): the run's arguments, the reading's, and where
/// its report goes.
#[derive(Debug, Args)]
struct ReadRunArgs {
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    analysis: AnalysisArgs,
    #[command(flatten)]
    out: OutArgs,
}

/// What a ramp or a sweep sends: its fixed URLs, and a body to POST to them.
#[derive(Debug, Args)]
struct UrlArgs {
    /// URL to send to (repeat for several, sent round-robin).
    #[arg(long, required = true)]
    url: Vec<String>,
    /// POST this JSON to the URLs instead of GETting them (e.g. `{"body":"hello"}` to
    /// conversations' `/messages`).
    #[arg(long)]
    body: Option<String>,
}

#[derive(Debug, Args)]
struct RampArgs {
    #[command(flatten)]
    target: UrlArgs,
    /// Offered rates, comma-separated (e.g. 200,400,600).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["from", "to", "steps"])]
    rates: Vec<f64>,
    /// First rate of an evenly spaced ramp (with --to and --steps).
    #[arg(long, requires_all = ["to", "steps"])]
    from: Option<f64>,
    /// Last rate of the ramp.
    #[arg(long)]
    to: Option<f64>,
    /// Number of steps from --from to --to, both included.
    #[arg(long)]
    steps: Option<usize>,
    /// Length of each step.
    #[arg(long, value_parser = duration, default_value = "30s")]
    step: Duration,
    /// Pause between steps, so queues drain.
    #[arg(long, value_parser = duration, default_value = "5s")]
    pause: Duration,
    #[command(flatten)]
    load: ReadRunArgs,
}

#[derive(Debug, Args)]
struct SweepArgs {
    #[command(flatten)]
    target: UrlArgs,
    /// Caller counts, comma-separated (e.g. 4,16,32,192).
    #[arg(long, value_delimiter = ',', required = true)]
    concurrency: Vec<usize>,
    #[arg(long, value_parser = duration, default_value = "30s")]
    step: Duration,
    #[arg(long, value_parser = duration, default_value = "5s")]
    pause: Duration,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Debug, Args)]
struct ProfileArgs {
    /// smoke, load, stress, spike, soak, breakpoint (or any name in the profiles file).
    name: String,
    /// The API's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// The API's ops listener (`OPS_ADDR`): the smoke stage probes its `/ready` and
    /// `/v1/ops/status`, and the run samples the latter unless --ops-url says otherwise.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    ops_base: String,
    /// Profiles file (defaults to the one built in: crates/loadlab/profiles.toml).
    #[arg(long)]
    profiles: Option<PathBuf>,
    /// The last measured capacity in req/s, for rates given as fractions of it.
    #[arg(long, conflicts_with = "capacity_from")]
    capacity: Option<f64>,
    /// Read the capacity from a ramp's JSON report.
    #[arg(long)]
    capacity_from: Option<PathBuf>,
    /// Multiply every duration (0.1 = a ten-times-shorter rehearsal).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Skip the smoke stage: for a population started beside another load (whose path was
    /// checked before, and which may make `/ready` fail meanwhile).
    #[arg(long)]
    no_smoke: bool,
    #[command(flatten)]
    load: ReadRunArgs,
}

#[derive(Debug, Args)]
struct SmokeArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// The API's ops listener (`OPS_ADDR`), for the `/ready` and `/v1/ops/status` probes.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    ops_base: String,
    #[arg(long, value_parser = duration, default_value = "10s")]
    timeout: Duration,
    #[command(flatten)]
    tokens: TokenArgs,
}

#[derive(Debug, Args)]
struct StreamsArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    /// Streams to hold open, spread evenly over the tenants.
    #[arg(long, default_value_t = 100)]
    streams: usize,
    /// Streams opened a second; 0 opens them all at once (a reconnect storm).
    #[arg(long, default_value_t = 500.0)]
    open_rate: f64,
    /// How long the streams are held once opened.
    #[arg(long, value_parser = duration, default_value = "30s")]
    hold: Duration,
    /// Messages written a second while they are held (round-robin over the tenants, one
    /// conversation each); 0 for idle streams.
    #[arg(long, default_value_t = 0.0)]
    writes_per_sec: f64,
    /// Write the report here as JSON (it is printed either way).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    tokens: TokenArgs,
}

#[derive(Debug, Args)]
struct CompareArgs {
    baseline: PathBuf,
    current: PathBuf,
    /// A step's p95/p99 regresses when it grows by this factor...
    #[arg(long, default_value_t = 2.0)]
    latency_factor: f64,
    /// ...and by at least this much.
    #[arg(long, value_parser = duration, default_value = "5ms")]
    min_latency_rise: Duration,
    /// Capacity, saturation, knee or goodput regress when they drop by this fraction.
    #[arg(long, default_value_t = 1.0 / 3.0)]
    throughput_drop: f64,
    /// Error share regresses when it rises by this much (0.01 = one point).
    #[arg(long, default_value_t = 0.01)]
    error_rise: f64,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ReportArgs {
    report: PathBuf,
    /// Re-read the curve with this objective (otherwise the saved reading is shown).
    #[arg(long, value_parser = duration)]
    slo_p99: Option<Duration>,
    #[arg(long, default_value_t = 0.7)]
    headroom: f64,
    #[arg(long)]
    html: Option<PathBuf>,
}
async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Ramp(a) => commands::ramp(&a).await,
        Cmd::Sweep(a) => commands::sweep(&a).await,
        Cmd::Profile(a) => commands::profile(&a).await,
        Cmd::Streams(a) => commands::streams(&a).await,
        Cmd::Smoke(a) => commands::smoke(&a).await,
        Cmd::Compare(a) => commands::compare(&a),
        Cmd::Report(a) => commands::report(&a),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.threads {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadlab: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("loadlab: {e:#}");
            ExitCode::from(2)
        }
    }
}
