//! The lab's data: the seeded template database (reused while its seed parameters match) and
//! the tokens files the load lab sends with, weighted by each tenant's share of the data; and
//! the commit measured.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use sqlx::postgres::PgPoolOptions;

use super::progress::log;
use crate::rig::services;

/// Seed parameters of each preset; the database is reused while its comment matches.
pub(super) const SEED_FULL: &str = "breakwater-seed full default (50 tenants, 400000 conversations, 2000000 messages, skew 0.55, seed 1; a template, never served)";

pub(super) const SEED_SMALL: &str = "breakwater-seed --small (5 tenants, 2000 conversations, 10000 messages, skew 0.55, seed 1; a template, never served)";

/// Seeds `database` unless its comment says it already holds the same seed.
pub(crate) async fn seed(bin: &Path, server: &str, database: &str, quick: bool) -> anyhow::Result<String> {
    let wanted = if quick { SEED_SMALL } else { SEED_FULL };
    let admin = PgPoolOptions::new().max_connections(1).connect(&services::with_database(server, "postgres")).await?;
    let comment: Option<String> =
        sqlx::query_scalar("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1")
            .bind(database)
            .fetch_optional(&admin)
            .await?
            .flatten();
    if comment.as_deref() == Some(wanted) {
        log(&format!("`{database}` already holds {wanted}: reusing it"));
        return Ok(wanted.into());
    }
    log(&format!("seeding `{database}` with {wanted}"));
    let t = Instant::now();
    let url = services::with_database(server, database);
    let mut cmd = std::process::Command::new(bin.join("breakwater-seed"));
    cmd.args(["--reset", "--quiet"]).env("DATABASE_URL", &url);
    if quick {
        cmd.arg("--small");
    }
    let status = cmd.status().context("running breakwater-seed")?;
    anyhow::ensure!(status.success(), "seeding {database} failed");
    let quoted = format!("\"{}\"", database.replace('"', "\"\""));
    sqlx::raw_sql(&format!("COMMENT ON DATABASE {quoted} IS '{}'", wanted.replace('\'', "''"))).execute(&admin).await?;
    log(&format!("seeded in {:.0} s", t.elapsed().as_secs_f64()));
    Ok(wanted.into())
}

/// The tokens files: every seeded tenant weighted by its share of conversations (the seed's
/// skew), its traffic spread over up to eight of its users; and the same with the heaviest
/// tenant at `noisy_factor` times its share.
#[derive(Debug)]
pub(crate) struct TokenSet {
    pub(crate) path: PathBuf,
    pub(super) noisy_path: PathBuf,
    /// The heaviest tenant's tokens alone: the one-tenant mix, and the flood.
    pub(super) one_path: PathBuf,
    /// Every other tenant's: the tenants beside the flood.
    pub(super) others_path: PathBuf,
    pub(super) tenants: usize,
    pub(super) top_share: f64,
    pub(super) noisy_tenant: String,
}

impl TokenSet {
    /// The total rate of the noisy run: the others at `base_rps` x their share, the noisy tenant
    /// at `factor` x its share of `base_rps`.
    pub(super) fn noisy_rps(&self, base_rps: f64, factor: f64) -> f64 {
        base_rps * (1.0 + (factor - 1.0) * self.top_share)
    }
}

pub(crate) async fn tokens(db_url: &str, runs: &Path, noisy_factor: f64) -> anyhow::Result<TokenSet> {
    let pool = PgPoolOptions::new().max_connections(1).connect(db_url).await?;
    let rows: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT t.id, (SELECT count(*) FROM conversations c WHERE c.tenant_id = t.id) FROM tenants t ORDER BY 2 DESC, 1",
    )
    .fetch_all(&pool)
    .await?;
    let total: i64 = rows.iter().map(|r| r.1).sum();
    anyhow::ensure!(total > 0, "the lab database holds no conversations");
    let mut lines = Vec::new();
    for (tenant, conversations) in &rows {
        let users: Vec<uuid::Uuid> =
            sqlx::query_scalar("SELECT id FROM users WHERE tenant_id = $1 ORDER BY id LIMIT 8")
                .bind(tenant)
                .fetch_all(&pool)
                .await?;
        let share = *conversations as f64 / total as f64;
        for u in &users {
            lines.push(breakwater_loadlab::tokens::TokenLine {
                tenant_id: tenant.to_string(),
                user_id: u.to_string(),
                token: None,
                weight: share / users.len() as f64,
            });
        }
    }
    pool.close().await;
    let top = rows.first().context("no tenants")?;
    let top_share = top.1 as f64 / total as f64;
    let noisy_tenant = top.0.to_string();
    let write = |path: &Path, factor: f64, keep: &dyn Fn(&str) -> bool| -> anyhow::Result<()> {
        let mut text = String::new();
        for l in lines.iter().filter(|l| keep(&l.tenant_id)) {
            let mut l = l.clone();
            if l.tenant_id == noisy_tenant {
                l.weight *= factor;
            }
            text.push_str(&serde_json::to_string(&l)?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    };
    let path = runs.join("tokens.jsonl");
    let noisy_path = runs.join("tokens-noisy.jsonl");
    let one_path = runs.join("tokens-one-tenant.jsonl");
    let others_path = runs.join("tokens-others.jsonl");
    write(&path, 1.0, &|_| true)?;
    write(&noisy_path, noisy_factor, &|_| true)?;
    write(&one_path, 1.0, &|t| t == noisy_tenant)?;
    write(&others_path, 1.0, &|t| t != noisy_tenant)?;
    Ok(TokenSet { path, noisy_path, one_path, others_path, tenants: rows.len(), top_share, noisy_tenant })
}

pub(crate) fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head} (with uncommitted changes)") } else { head }
}
