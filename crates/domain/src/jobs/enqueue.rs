//! Writing jobs to the queue: a [`NewJob`] is enqueued inside the transaction of the change
//! that causes it, or many at once for benchmarks and back-fills.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::kind;
use crate::{Result, TenantId, ids::new_id};

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The tenant whose data the job touches.
    pub tenant: Option<TenantId>,
    /// What the worker runs (see [`kind`]).
    pub kind: &'static str,
    /// The job's arguments.
    pub payload: serde_json::Value,
    /// While a job with this key is ready or running, enqueueing another is a no-op.
    pub unique_key: Option<String>,
    /// How many times to try before the job goes dead.
    pub max_attempts: i32,
    /// Higher runs first.
    pub priority: i16,
    /// Not before this time (`None`: now).
    pub run_at: Option<DateTime<Utc>>,
    /// W3C trace context of the request that enqueued the job.
    pub traceparent: Option<String>,
}

impl NewJob {
    /// A job of `kind` with default settings: no tenant, no unique key, 10 attempts, now.
    #[must_use]
    pub fn new(kind: &'static str, payload: serde_json::Value) -> Self {
        Self {
            tenant: None,
            kind,
            payload,
            unique_key: None,
            max_attempts: 10,
            priority: 0,
            run_at: None,
            traceparent: None,
        }
    }

    /// The erasure of a tombstoned contact. Unique per contact.
    #[must_use]
    pub fn erase_contact(tenant: TenantId, contact: Uuid) -> Self {
        Self {
            tenant: Some(tenant),
            unique_key: Some(format!("{}:{tenant}:{contact}", kind::ERASE_CONTACT)),
            max_attempts: 25,
            // Privacy erasure has a legal deadline; deliveries can wait a moment.
            priority: 1,
            ..Self::new(kind::ERASE_CONTACT, json!({ "contact_id": contact }))
        }
    }

    /// The outbound delivery of an agent's message. Unique per message.
    #[must_use]
    pub fn deliver_message(tenant: TenantId, inbox: Uuid, conversation: Uuid, message: Uuid) -> Self {
        Self {
            tenant: Some(tenant),
            unique_key: Some(format!("{}:{tenant}:{message}", kind::DELIVER_MESSAGE)),
            ..Self::new(
                kind::DELIVER_MESSAGE,
                json!({ "inbox_id": inbox, "conversation_id": conversation, "message_id": message }),
            )
        }
    }

    /// Carries the enqueuing request's W3C `traceparent` to the worker.
    #[must_use]
    pub fn with_traceparent(mut self, traceparent: Option<String>) -> Self {
        self.traceparent = traceparent;
        self
    }
}

/// Enqueues a job inside the caller's transaction and returns its id. With a unique key that a
/// live (ready or running) job already holds, returns that job's id instead: the partial unique
/// index makes this race-free, a concurrent enqueue of the same key waits for ours to commit.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db jobs.enqueue", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn enqueue(conn: &mut PgConnection, job: NewJob) -> Result<Uuid> {
    // The live job holding the key can finish between the INSERT and the SELECT below; then the
    // key is free again and the next round inserts.
    loop {
        let id = new_id();
        let inserted = sqlx::query_scalar!(
            "INSERT INTO jobs (id, tenant_id, kind, payload, unique_key, max_attempts, priority, run_at, traceparent)
             VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, now()), $9)
             ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('ready', 'running')
             DO NOTHING
             RETURNING id",
            id,
            job.tenant.map(|t| t.0),
            job.kind,
            job.payload,
            job.unique_key,
            job.max_attempts,
            job.priority,
            job.run_at,
            job.traceparent,
        )
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = inserted {
            return Ok(id);
        }
        let existing = sqlx::query_scalar!(
            "SELECT id FROM jobs WHERE unique_key = $1 AND state IN ('ready', 'running')",
            job.unique_key
        )
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = existing {
            return Ok(id);
        }
    }
}

/// Enqueues many jobs of one kind, without tenant or unique key, in one statement (the
/// benchmark and bulk back-fills). Returns how many were inserted.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.enqueue_many", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn enqueue_many(conn: &mut PgConnection, kind: &'static str, payloads: &[serde_json::Value]) -> Result<u64> {
    let ids: Vec<Uuid> = payloads.iter().map(|_| new_id()).collect();
    let inserted = sqlx::query!(
        "INSERT INTO jobs (id, kind, payload)
         SELECT id, $2, payload FROM unnest($1::uuid[], $3::jsonb[]) AS t(id, payload)",
        &ids,
        kind,
        payloads
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(inserted)
}
