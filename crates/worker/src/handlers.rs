//! What each kind of job does.

use std::time::Duration;

use breakwater_domain::jobs::{ClaimedJob, kind};
use breakwater_domain::webhooks::{self, ATTEMPT_HEADER, IDEMPOTENCY_HEADER, SIGNATURE_HEADER, WebhookUrl};
use breakwater_domain::{Pool, TenantId};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde::Deserialize;
use uuid::Uuid;

use crate::client::{SendError, WebhookClient};

/// Why a job failed, and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// Kept on the job as `last_error`.
    pub message: String,
    /// `true`: retrying cannot help, the job goes dead now.
    pub permanent: bool,
    /// The server asked for this delay (`Retry-After`).
    pub retry_after: Option<Duration>,
}

impl JobError {
    /// A failure that retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: true, retry_after: None }
    }

    /// A failure worth retrying after a backoff.
    pub fn transient(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: false, retry_after: None }
    }
}

/// Everything a job may need.
#[derive(Debug, Clone)]
pub struct Handlers {
    /// The database.
    pub pool: Pool,
    /// The pooled webhook client.
    pub client: WebhookClient,
    /// Rows deleted per statement by an erasure.
    pub erase_batch: i64,
}

impl Handlers {
    /// Runs one job.
    ///
    /// # Errors
    /// The job's failure, to be recorded on it.
    pub async fn execute(&self, job: &ClaimedJob) -> Result<(), JobError> {
        match job.kind.as_str() {
            kind::ERASE_CONTACT => self.erase_contact(job).await,
            kind::DELIVER_MESSAGE => self.deliver_message(job).await,
            kind::NOOP => Ok(()),
            other => Err(JobError::permanent(format!("no handler for job kind `{other}` in this worker"))),
        }
    }

    async fn erase_contact(&self, job: &ClaimedJob) -> Result<(), JobError> {
        #[derive(Deserialize)]
        struct Args {
            contact_id: Uuid,
        }
        let args: Args = payload(job)?;
        let tenant = tenant(job)?;
        let (messages, conversations) =
            breakwater_domain::contacts::erase(&self.pool, tenant, args.contact_id, self.erase_batch)
                .await
                .map_err(|e| JobError::transient(format!("erasure: {e}")))?;
        tracing::info!(job = %job.id, messages, conversations, "contact erased");
        Ok(())
    }

    /// POSTs the message to its inbox's webhook, signed, with the message id as idempotency
    /// key. The body is rebuilt from the database on every attempt, so retries send the same
    /// bytes; only the signature's timestamp and the attempt header change.
    async fn deliver_message(&self, job: &ClaimedJob) -> Result<(), JobError> {
        #[derive(Deserialize)]
        struct Args {
            message_id: Uuid,
        }
        let args: Args = payload(job)?;
        let tenant = tenant(job)?;
        let outbound = webhooks::outbound(&self.pool, tenant, args.message_id)
            .await
            .map_err(|e| JobError::transient(format!("loading the message: {e}")))?;
        let Some(outbound) = outbound else {
            tracing::info!(job = %job.id, "nothing to deliver: message, contact or webhook gone");
            return Ok(());
        };
        // The stored URL is checked again against this worker's policy: it may predate it.
        let url = WebhookUrl::parse(&outbound.url, &self.client.options().policy)
            .map_err(|e| JobError::permanent(e.to_string()))?;
        let secret = outbound.secret.ok_or_else(|| JobError::permanent("the inbox's webhook has no signing secret"))?;
        let body = serde_json::to_vec(&outbound.event).map_err(|e| JobError::permanent(e.to_string()))?;

        let mut headers = HeaderMap::new();
        let signature = webhooks::sign(&secret, chrono::Utc::now().timestamp(), &body);
        let header = |v: String| HeaderValue::try_from(v).map_err(|e| JobError::permanent(e.to_string()));
        headers.insert(SIGNATURE_HEADER, header(signature)?);
        headers.insert(IDEMPOTENCY_HEADER, header(args.message_id.to_string())?);
        headers.insert(ATTEMPT_HEADER, header(job.attempts.to_string())?);

        match self.client.post(&url, headers, Bytes::from(body)).await {
            Ok(reply) => {
                let status = reply.status;
                let failure = format!("webhook answered {status}");
                match status.as_u16() {
                    200..=299 => Ok(()),
                    408 | 429 | 500..=599 => {
                        Err(JobError { message: failure, permanent: false, retry_after: reply.retry_after })
                    }
                    300..=399 => Err(JobError::permanent(format!("{failure}; redirects are not followed"))),
                    _ => Err(JobError::permanent(failure)),
                }
            }
            Err(e @ SendError::Forbidden(_)) => Err(JobError::permanent(e.to_string())),
            Err(e) => Err(JobError::transient(e.to_string())),
        }
    }
}

fn payload<T: for<'de> Deserialize<'de>>(job: &ClaimedJob) -> Result<T, JobError> {
    T::deserialize(&job.payload).map_err(|e| JobError::permanent(format!("bad payload: {e}")))
}

fn tenant(job: &ClaimedJob) -> Result<TenantId, JobError> {
    job.tenant_id.map(TenantId).ok_or_else(|| JobError::permanent("job without a tenant"))
}
