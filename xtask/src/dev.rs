//! `cargo xtask dev`: a served, seeded stack on this machine.

use std::process::{Child, Command, Stdio};

use anyhow::Context as _;

use breakwater_lab::rig::services;

/// Options of `cargo xtask dev`.
#[derive(Debug, clap::Args)]
pub(crate) struct DevArgs {
    /// Address the API listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: String,
    /// Seed preset when the database is empty: `small` (seconds) or `full` (2M messages).
    #[arg(long, default_value = "small")]
    seed: String,
    /// Build and run in release mode.
    #[arg(long)]
    release: bool,
}

pub(crate) async fn run(args: DevArgs) -> anyhow::Result<()> {
    let url = services::ensure_postgres(&services::database_url()).await?;
    services::create_database(&url).await?;
    let redis = services::redis_url();
    services::report_redis(&redis);

    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&url).await?;
    breakwater_domain::migrate(&pool).await.context("migrating")?;
    let tenants: i64 = sqlx::query_scalar("SELECT count(*) FROM tenants").fetch_one(&pool).await?;

    let profile: &[&str] = if args.release { &["--release"] } else { &[] };
    let status = Command::new(services::cargo())
        .args(["build", "-p", "breakwater-api", "-p", "breakwater-worker", "-p", "breakwater-seed"])
        .args(profile)
        .status()?;
    anyhow::ensure!(status.success(), "build failed");
    let bin = services::root().join("target").join(if args.release { "release" } else { "debug" });

    if tenants == 0 {
        let preset = format!("--{}", args.seed);
        eprintln!("seeding ({preset})...");
        let seed_args: Vec<&str> = if args.seed == "full" { vec![] } else { vec![preset.as_str()] };
        let status = Command::new(bin.join("breakwater-seed")).args(&seed_args).env("DATABASE_URL", &url).status()?;
        anyhow::ensure!(status.success(), "seeding failed");
    } else {
        eprintln!("database already holds {tenants} tenants: not seeding (drop it to start over)");
    }

    let (tenant, user, role) =
        breakwater_domain::tenants::any_user(&pool).await?.context("the database has no users to mint a token for")?;
    let role = match role {
        breakwater_domain::tenants::Role::Admin => "admin",
        breakwater_domain::tenants::Role::Agent => "agent",
    };
    let token = Command::new(bin.join("breakwater-api"))
        .args(["token", "--tenant", &tenant.to_string(), "--user", &user.to_string(), "--role", role])
        .output()?;
    anyhow::ensure!(token.status.success(), "minting a token failed");
    let token = String::from_utf8(token.stdout)?.trim().to_owned();

    let mut children = Children(Vec::new());
    children.0.push(
        Command::new(bin.join("breakwater-api"))
            .arg("serve")
            .env("APP_ENV", "development")
            .env("DATABASE_URL", &url)
            .env("REDIS_URL", &redis)
            .env("BIND_ADDR", &args.bind)
            .stdin(Stdio::null())
            .spawn()?,
    );
    children
        .0
        .push(Command::new(bin.join("breakwater-worker")).env("DATABASE_URL", &url).stdin(Stdio::null()).spawn()?);

    println!("\nBreakwater is running at http://{}  (Ctrl-C stops it)\n", args.bind);
    println!("A token for the biggest tenant's {role}:\n\n  export TOKEN={token}\n");
    println!(
        "Try:\n\n  curl -s -H \"Authorization: Bearer $TOKEN\" 'http://{}/v1/conversations?status=open&limit=5'\n",
        args.bind
    );
    println!("OpenAPI: http://{}/openapi.json", args.bind);
    let ops = std::env::var("OPS_ADDR").unwrap_or_else(|_| "127.0.0.1:9090".to_owned());
    println!("Ops listener (OPS_ADDR, never public): http://{ops}/v1/ops/status, /ready, /metrics\n");

    tokio::signal::ctrl_c().await?;
    eprintln!("stopping...");
    Ok(())
}

/// Child processes that are stopped (SIGTERM, then killed) when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        }
        for child in &mut self.0 {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
