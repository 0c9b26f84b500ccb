//! Tenants, their users and inboxes: set-up data (the seeder, tests and the dev stack create it).

use uuid::Uuid;

use crate::webhooks::{self, WebhookUrl};
use crate::{Pool, Result, TenantId, UserId, ids::new_id};

/// A user's role, as carried in the JWT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, sqlx::Type)]
#[sqlx(type_name = "user_role", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Works conversations.
    Agent,
    /// Also manages the tenant.
    Admin,
}

/// Creates a tenant.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db tenants.create_tenant", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn create_tenant(pool: &Pool, name: &str) -> Result<TenantId> {
    let id = new_id();
    sqlx::query!("INSERT INTO tenants (id, name) VALUES ($1, $2)", id, name).execute(pool).await?;
    Ok(TenantId(id))
}

/// Creates a user (agent or admin) of a tenant.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db tenants.create_user", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn create_user(pool: &Pool, tenant: TenantId, name: &str, email: &str, role: Role) -> Result<UserId> {
    let id = new_id();
    sqlx::query!(
        "INSERT INTO users (tenant_id, id, name, email, role) VALUES ($1, $2, $3, $4, $5)",
        tenant.0,
        id,
        name,
        email,
        role as Role
    )
    .execute(pool)
    .await?;
    Ok(UserId(id))
}

/// Creates an inbox of a tenant, optionally with an outbound webhook. The URL must have passed
/// [`WebhookUrl::validate`] (the type says so); a signing secret is generated for it (read it
/// with [`webhook_secret`]).
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db tenants.create_inbox", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn create_inbox(
    pool: &Pool,
    tenant: TenantId,
    name: &str,
    channel: &str,
    webhook: Option<&WebhookUrl>,
) -> Result<Uuid> {
    let id = new_id();
    let secret = webhook.map(|_| webhooks::new_secret());
    sqlx::query!(
        "INSERT INTO inboxes (tenant_id, id, name, channel, webhook_url, webhook_secret)
         VALUES ($1, $2, $3, $4, $5, $6)",
        tenant.0,
        id,
        name,
        channel,
        webhook.map(WebhookUrl::as_str),
        secret
    )
    .execute(pool)
    .await?;
    Ok(id)
}

/// The signing secret of an inbox's webhook, to give to the tenant (who verifies deliveries
/// with it); `None` when the inbox has no webhook.
///
/// # Errors
/// [`crate::DomainError::NotFound`] when the inbox is not the tenant's.
#[tracing::instrument(name = "db tenants.webhook_secret", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn webhook_secret(pool: &Pool, tenant: TenantId, inbox: Uuid) -> Result<Option<String>> {
    let row =
        sqlx::query_scalar!("SELECT webhook_secret FROM inboxes WHERE tenant_id = $1 AND id = $2", tenant.0, inbox)
            .fetch_optional(pool)
            .await?;
    row.ok_or(crate::DomainError::NotFound)
}

/// A user to act as for a development token: an admin (else an agent) of the tenant with the
/// most conversations, so the token sees the largest inbox.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db tenants.any_user", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn any_user(pool: &Pool) -> Result<Option<(TenantId, UserId, Role)>> {
    let row = sqlx::query!(
        r#"WITH biggest AS (
               SELECT t.id FROM tenants t
               ORDER BY (SELECT count(*) FROM users u WHERE u.tenant_id = t.id) = 0,
                        (SELECT count(*) FROM conversations c WHERE c.tenant_id = t.id) DESC, t.id
               LIMIT 1)
           SELECT u.tenant_id, u.id, u.role AS "role: Role"
           FROM users u JOIN biggest b ON u.tenant_id = b.id
           ORDER BY u.role DESC, u.id
           LIMIT 1"#
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (TenantId(r.tenant_id), UserId(r.id), r.role)))
}

/// A tenant's throttle override (rate per second and burst), from its plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleOverride {
    /// The tenant.
    pub tenant: TenantId,
    /// Sustained requests per second.
    pub rate_per_sec: f64,
    /// Requests allowed at once.
    pub burst: u32,
}

/// Every tenant whose plan overrides the default tenant throttle.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db tenants.throttle_overrides", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn throttle_overrides(pool: &Pool) -> Result<Vec<ThrottleOverride>> {
    let rows = sqlx::query!(
        r#"SELECT id, throttle_rate_per_sec AS "rate!", throttle_burst AS "burst!"
           FROM tenants WHERE throttle_rate_per_sec IS NOT NULL AND throttle_burst IS NOT NULL"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| ThrottleOverride {
            tenant: TenantId(r.id),
            rate_per_sec: r.rate,
            burst: u32::try_from(r.burst).unwrap_or(1),
        })
        .collect())
}

/// Sets (or, with `None`, clears) a tenant's throttle override.
///
/// # Errors
/// A database error, or [`crate::DomainError::Invalid`] for a non-positive rate or burst.
#[tracing::instrument(level = "debug", name = "db tenants.set_throttle_override", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn set_throttle_override(pool: &Pool, tenant: TenantId, limit: Option<(f64, u32)>) -> Result<()> {
    let (rate, burst) = match limit {
        Some((r, b)) if r > 0.0 && b > 0 => (Some(r), Some(i32::try_from(b).unwrap_or(i32::MAX))),
        Some(_) => return Err(crate::DomainError::Invalid("rate and burst must be positive".into())),
        None => (None, None),
    };
    sqlx::query!(
        "UPDATE tenants SET throttle_rate_per_sec = $2, throttle_burst = $3 WHERE id = $1",
        tenant.0,
        rate,
        burst
    )
    .execute(pool)
    .await?;
    Ok(())
}
