//! `breakwater-api`: serve (the default), migrate, or mint a development token.

use breakwater_api::auth::{Claims, JwtKeys};
use breakwater_api::config::{Config, DatabaseConfig};
use breakwater_domain::tenants::Role;
use clap::{Parser, Subcommand};
use secrecy::SecretString;
use uuid::Uuid;

#[derive(Debug, Parser)]
#[command(name = "breakwater-api", version, about = "Breakwater's multi-tenant chat API")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve(Box<Config>),
    /// Apply the database migrations and exit.
    Migrate {
        #[command(flatten)]
        db: DatabaseConfig,
        #[command(flatten)]
        log: breakwater_api::telemetry::LogArgs,
    },
    /// Print a JWT for a tenant's user (development and load tests).
    Token {
        /// The tenant id.
        #[arg(long)]
        tenant: Uuid,
        /// The user id (a `users.id` of that tenant).
        #[arg(long)]
        user: Uuid,
        /// The role.
        #[arg(long, value_enum, default_value = "agent")]
        role: RoleArg,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 86_400)]
        ttl: u64,
        /// The `iss` claim (the API checks it when it has `JWT_ISSUER`).
        #[arg(long, env = "JWT_ISSUER")]
        issuer: Option<String>,
        /// The `aud` claim (the API checks it when it has `JWT_AUDIENCE`).
        #[arg(long, env = "JWT_AUDIENCE")]
        audience: Option<String>,
        /// The HS256 secret (defaults to the development one).
        #[arg(long, env = "JWT_SECRET", default_value = breakwater_api::config::DEV_JWT_SECRET,
              hide_env_values = true, hide_default_value = true)]
        jwt_secret: SecretString,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RoleArg {
    Agent,
    Admin,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = match cli.command {
        Some(c) => c,
        // No subcommand: serve with the environment's configuration.
        None => Command::Serve(Box::new(Config::from_env()?)),
    };
    match command {
        Command::Serve(config) => {
            let telemetry = breakwater_api::telemetry::init(&config.log)?;
            let result = breakwater_api::run(*config).await;
            // The spans of the last requests are still in the batch processor's buffer.
            telemetry.shutdown(std::time::Duration::from_secs(3));
            result
        }
        Command::Migrate { db, log } => {
            let _telemetry = breakwater_api::telemetry::init(&log)?;
            let pool = db.pool()?;
            breakwater_domain::migrate(&pool).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Token { tenant, user, role, ttl, issuer, audience, jwt_secret } => {
            let exp = u64::try_from(chrono::Utc::now().timestamp())? + ttl;
            let role = match role {
                RoleArg::Agent => Role::Agent,
                RoleArg::Admin => Role::Admin,
            };
            let token = JwtKeys::new(&jwt_secret).mint(&Claims {
                iss: issuer,
                aud: audience,
                ..Claims::new(tenant, user, role, exp)
            })?;
            println!("{token}");
            Ok(())
        }
    }
}
