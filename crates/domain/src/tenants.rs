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
pub async fn create_tenant(pool: &Pool, name: &str) -> Result<TenantId> {
    let id = new_id();
    sqlx::query!("INSERT INTO tenants (id, name) VALUES ($1, $2)", id, name).execute(pool).await?;
    Ok(TenantId(id))
}

/// Creates a user (agent or admin) of a tenant.
///
/// # Errors
/// A database error.
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
