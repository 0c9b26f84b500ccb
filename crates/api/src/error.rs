//! The API's one error type, rendered as the typed envelope every refusal and failure shares:
//!
//! ```json
//! {"error": {"type": "service_unavailable", "code": "db_saturated",
//!            "message": "...", "recovery": {"retryable": true, "retry_after_seconds": 1}}}
//! ```
//!
//! Database and unexpected errors become a logged 500 that leaks nothing.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use breakwater_domain::DomainError;
use serde::Serialize;

/// The envelope's body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

/// What went wrong and what the client can do about it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The class of error (`invalid_request`, `unauthorized`, `forbidden`, `not_found`, `conflict`,
    /// `rate_limited`, `service_unavailable`, `internal`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The specific reason, stable for machines (`load_shed`, `db_saturated`, ...).
    pub code: &'static str,
    /// For humans.
    pub message: String,
    /// Whether and when to retry.
    pub recovery: Recovery,
}

/// Retry advice, mirrored by the `Retry-After` header.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Recovery {
    /// Whether the same request may succeed later.
    pub retryable: bool,
    /// When to retry, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// Every way a request can fail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed input: bad JSON, wrong types, unknown fields, bad ids, bad query parameters.
    #[error("{0}")]
    InvalidRequest(String),
    /// Well-formed input the domain does not accept (a reference to an unknown row).
    #[error("{0}")]
    Unprocessable(String),
    /// Missing, malformed, expired or forged token; or a token whose user does not exist.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// A valid token whose role may not do this (the permission table).
    #[error("this operation needs the {0} role")]
    Forbidden(&'static str),
    /// No such resource for this tenant (also: another tenant's resource).
    #[error("not found")]
    NotFound,
    /// The route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The request conflicts with the current state.
    #[error("{0}")]
    Conflict(String),
    /// The body exceeds the cap.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The cap, in bytes.
        limit: usize,
    },
    /// The client did not send its whole body within the body-read timeout.
    #[error("the request body did not arrive within {} ms", timeout.as_millis())]
    BodyTimeout {
        /// The body-read timeout.
        timeout: std::time::Duration,
    },
    /// A throttle bucket ran out.
    #[error("rate limit exceeded for this {kind}")]
    RateLimited {
        /// Which bucket: `tenant`, `user` or `ip`.
        kind: &'static str,
        /// Seconds until a retry is admitted.
        retry_after: u64,
    },
    /// No database connection within the acquire timeout (the pool bulkhead).
    #[error("database busy: no connection within the acquire timeout")]
    DbSaturated,
    /// The database is unreachable or a statement timed out.
    #[error("database unavailable")]
    DbUnavailable,
    /// The handler ran past the request timeout.
    #[error("request timed out")]
    Timeout,
    /// A bug. Logged with its cause; the client learns nothing of it.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    /// The HTTP status, envelope type and code of this error.
    #[must_use]
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request", "invalid_request"),
            Self::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", "invalid_request"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized", "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "forbidden"),
            Self::NotFound => (StatusCode::NOT_FOUND, "not_found", "not_found"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "invalid_request", "method_not_allowed"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict", "conflict"),
            Self::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request", "body_too_large"),
            Self::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "invalid_request", "body_timeout"),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited", "rate_limited"),
            Self::DbSaturated => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "db_saturated"),
            Self::DbUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "db_unavailable"),
            Self::Timeout => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "request_timeout"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal"),
        }
    }

    /// Whether the server failed (a bug, an unreachable database, a handler out of time) rather
    /// than refused on purpose. A 503 is either: `db_unavailable` and `request_timeout` are
    /// failures, `db_saturated` is a refusal (metrics count them apart).
    #[must_use]
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Internal(_) | Self::DbUnavailable | Self::Timeout)
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after, .. } => Some(*retry_after),
            Self::DbSaturated | Self::Timeout | Self::BodyTimeout { .. } => Some(1),
            Self::DbUnavailable => Some(2),
            _ => None,
        }
    }

    /// Builds the envelope.
    #[must_use]
    pub fn envelope(&self) -> ErrorEnvelope {
        let (_, kind, code) = self.parts();
        let retry_after_seconds = self.retry_after();
        ErrorEnvelope {
            error: ErrorBody {
                kind,
                code,
                message: self.to_string(),
                recovery: Recovery { retryable: retry_after_seconds.is_some(), retry_after_seconds },
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _, code) = self.parts();
        match &self {
            Self::Internal(err) => tracing::error!(error = ?err, "internal error"),
            Self::DbUnavailable => tracing::warn!(code, "database unavailable"),
            _ => tracing::debug!(code, status = status.as_u16(), "request refused"),
        }
        let retry_after = self.retry_after();
        let mut response = (status, Json(self.envelope())).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.is_failure() {
            response.extensions_mut().insert(Failure);
        }
        response
    }
}

/// Marks a response the server failed to give (see [`ApiError::is_failure`]), whatever its status:
/// the metrics count it as an error, not a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure;

impl From<DomainError> for ApiError {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::NotFound => Self::NotFound,
            DomainError::BadQuery(msg) => Self::InvalidRequest(msg),
            DomainError::Invalid(msg) => Self::Unprocessable(msg),
            DomainError::Conflict(msg) => Self::Conflict(msg),
            DomainError::UnknownPrincipal => Self::Unauthorized("the token's user does not exist in its tenant"),
            DomainError::PoolSaturated => Self::DbSaturated,
            DomainError::Unavailable(err) => {
                tracing::warn!(error = %err, "database unavailable");
                Self::DbUnavailable
            }
            DomainError::Database(err) => Self::Internal(err.into()),
        }
    }
}

/// Handlers return this.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_the_documented_shape() {
        let json = serde_json::to_value(ApiError::DbSaturated.envelope()).expect("serialises");
        assert_eq!(
            json,
            serde_json::json!({"error": {"type": "service_unavailable", "code": "db_saturated",
                "message": "database busy: no connection within the acquire timeout",
                "recovery": {"retryable": true, "retry_after_seconds": 1}}})
        );
        let json = serde_json::to_value(ApiError::NotFound.envelope()).expect("serialises");
        assert_eq!(json["error"]["recovery"], serde_json::json!({"retryable": false}));
    }

    #[test]
    fn internal_errors_leak_nothing() {
        let err = ApiError::Internal(anyhow::anyhow!("relation \"secret_table\" does not exist"));
        let json = serde_json::to_string(&err.envelope()).expect("serialises");
        assert!(!json.contains("secret_table"), "{json}");
    }

    proptest::proptest! {
        #[test]
        fn any_message_renders_valid_json(msg in ".*") {
            let json = serde_json::to_string(&ApiError::InvalidRequest(msg.clone()).envelope()).expect("serialises");
            let back: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
            proptest::prop_assert_eq!(back["error"]["message"].as_str(), Some(msg.as_str()));
        }
    }
}
