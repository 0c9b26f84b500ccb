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
use bytes::Bytes;
use serde::Serialize;

/// Every `code` the API answers with: the one list of the wire contract's error codes, each with
/// its envelope `type`. The OpenAPI document publishes it as an enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed or unacceptable input (400 or 422).
    InvalidRequest,
    /// No valid token (401).
    Unauthorized,
    /// The token's role may not do this (403).
    Forbidden,
    /// No such resource in the caller's tenant (404).
    NotFound,
    /// The route exists, the method does not (405).
    MethodNotAllowed,
    /// The request conflicts with the current state (409).
    Conflict,
    /// The body is over the cap (413).
    BodyTooLarge,
    /// The body did not arrive within the body-read timeout (408).
    BodyTimeout,
    /// A throttle bucket ran out (429).
    RateLimited,
    /// The tenant has as many streams open on this task as it may (429).
    StreamLimit,
    /// Over capacity: admission's queue was full, or the edge's connection cap was reached (503).
    LoadShed,
    /// No admission slot within the longest wait, or a client deadline that could not be met (503).
    QueueTimeout,
    /// No database connection within the acquire timeout (503).
    DbSaturated,
    /// The database is unreachable or a statement timed out (503).
    DbUnavailable,
    /// The handler ran past the request timeout (503).
    RequestTimeout,
    /// This task holds as many streams as it may, or is starting or shutting down (503).
    StreamsFull,
    /// A bug (500).
    Internal,
}

impl ErrorCode {
    /// Every code, for tests that check the list against the OpenAPI document and the docs.
    pub const ALL: [Self; 17] = [
        Self::InvalidRequest,
        Self::Unauthorized,
        Self::Forbidden,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::Conflict,
        Self::BodyTooLarge,
        Self::BodyTimeout,
        Self::RateLimited,
        Self::StreamLimit,
        Self::LoadShed,
        Self::QueueTimeout,
        Self::DbSaturated,
        Self::DbUnavailable,
        Self::RequestTimeout,
        Self::StreamsFull,
        Self::Internal,
    ];

    /// The code as it appears on the wire.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::Conflict => "conflict",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyTimeout => "body_timeout",
            Self::RateLimited => "rate_limited",
            Self::StreamLimit => "stream_limit",
            Self::LoadShed => "load_shed",
            Self::QueueTimeout => "queue_timeout",
            Self::DbSaturated => "db_saturated",
            Self::DbUnavailable => "db_unavailable",
            Self::RequestTimeout => "request_timeout",
            Self::StreamsFull => "streams_full",
            Self::Internal => "internal",
        }
    }

    /// The envelope's `type`: the class of error.
    #[must_use]
    pub const fn kind(self) -> &'static str {
        match self {
            Self::InvalidRequest | Self::MethodNotAllowed | Self::BodyTooLarge | Self::BodyTimeout => "invalid_request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::RateLimited | Self::StreamLimit => "rate_limited",
            Self::LoadShed
            | Self::QueueTimeout
            | Self::DbSaturated
            | Self::DbUnavailable
            | Self::RequestTimeout
            | Self::StreamsFull => "service_unavailable",
            Self::Internal => "internal",
        }
    }
}

/// The envelope's body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

impl ErrorEnvelope {
    /// The one way an envelope is made: the code decides the `type`, and `Retry-After`'s seconds
    /// (when there are any) make the error retryable.
    #[must_use]
    pub fn new(code: ErrorCode, message: String, retry_after_seconds: Option<u64>) -> Self {
        Self {
            error: ErrorBody {
                kind: code.kind(),
                code,
                message,
                recovery: Recovery { retryable: retry_after_seconds.is_some(), retry_after_seconds },
            },
        }
    }

    /// The envelope as JSON bytes.
    #[must_use]
    pub fn to_bytes(&self) -> Bytes {
        // Serialising plain strings, numbers and an enum cannot fail.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// What went wrong and what the client can do about it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The class of error (`invalid_request`, `unauthorized`, `forbidden`, `not_found`, `conflict`,
    /// `rate_limited`, `service_unavailable`, `internal`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The specific reason, stable for machines.
    pub code: ErrorCode,
    /// For humans.
    pub message: String,
    /// Whether and when to retry.
    pub recovery: Recovery,
}

/// A 503 carrying `envelope`, with `retry_after` (the envelope's own seconds, as a header): the
/// one shape of a refusal written before the app runs (the unanswered cap's; admission writes
/// the same bytes with its own renderer, `Refusal::default_response`, which a test holds to this
/// envelope).
#[must_use]
pub fn unavailable(envelope: &ErrorEnvelope, retry_after: HeaderValue) -> http::Response<Bytes> {
    let mut res = http::Response::new(envelope.to_bytes());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = res.headers_mut();
    headers.reserve(2);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::RETRY_AFTER, retry_after);
    res
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
    /// The tenant has `STREAM_MAX_PER_TENANT` streams open on this task.
    #[error("this tenant has as many streams open on this task as it may")]
    StreamLimit {
        /// Seconds to wait before opening another (jittered).
        retry_after: u64,
    },
    /// This task holds `STREAM_MAX` streams, is shutting down, or is starting (its listener has
    /// not connected yet).
    #[error("this task holds as many streams as it may, or is starting or shutting down")]
    StreamsFull {
        /// Seconds to wait before reconnecting (jittered).
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
    /// The HTTP status and the code of this error.
    #[must_use]
    pub fn parts(&self) -> (StatusCode, ErrorCode) {
        match self {
            Self::InvalidRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest),
            Self::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidRequest),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
            Self::NotFound => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, ErrorCode::MethodNotAllowed),
            Self::Conflict(_) => (StatusCode::CONFLICT, ErrorCode::Conflict),
            Self::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::BodyTooLarge),
            Self::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, ErrorCode::BodyTimeout),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, ErrorCode::RateLimited),
            Self::StreamLimit { .. } => (StatusCode::TOO_MANY_REQUESTS, ErrorCode::StreamLimit),
            Self::StreamsFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::StreamsFull),
            Self::DbSaturated => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::DbSaturated),
            Self::DbUnavailable => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::DbUnavailable),
            Self::Timeout => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::RequestTimeout),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
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
            Self::RateLimited { retry_after, .. }
            | Self::StreamLimit { retry_after }
            | Self::StreamsFull { retry_after } => Some(*retry_after),
            Self::DbSaturated | Self::Timeout | Self::BodyTimeout { .. } => Some(1),
            Self::DbUnavailable => Some(2),
            _ => None,
        }
    }

    /// Builds the envelope.
    #[must_use]
    pub fn envelope(&self) -> ErrorEnvelope {
        ErrorEnvelope::new(self.parts().1, self.to_string(), self.retry_after())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        let code = code.as_str();
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
    fn every_code_is_in_the_openapi_document_and_renders_as_it_is_published() {
        use utoipa::OpenApi as _;
        let doc = serde_json::to_value(crate::openapi::ApiDoc::openapi()).expect("serialises");
        let published: Vec<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("no ErrorCode enum in {:#}", doc["components"]["schemas"]))
            .iter()
            .filter_map(serde_json::Value::as_str)
            .collect();
        let ours: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(published, ours, "the document's codes are the enum's, in order");
        for code in ErrorCode::ALL {
            let json = serde_json::to_value(ErrorEnvelope::new(code, "m".into(), None)).expect("serialises");
            assert_eq!(json["error"]["code"], code.as_str());
            assert_eq!(json["error"]["type"], code.kind());
        }
    }

    #[test]
    fn admissions_own_renderer_writes_this_envelope_byte_for_byte() {
        // The API answers admission's refusals with admission's hand-written renderer, which
        // spares every refusal the serialiser (docs/ADMISSION.md, "Refusals"): this envelope
        // stays the one owner of the shape, and this test holds the renderer to it.
        use breakwater_admission::RefusalReason;
        for reason in [RefusalReason::QueueFull, RefusalReason::QueueTimeout, RefusalReason::Deadline] {
            for (in_flight, limit, retry_after_seconds) in [(5, 5, 3), (0, usize::MAX, 1), (1_234, 980, 60)] {
                let refusal = breakwater_admission::Refusal {
                    reason,
                    class: breakwater_admission::ClassId::DEFAULT,
                    in_flight,
                    limit,
                    queued: 16,
                    queue_capacity: 16,
                    retry_after_seconds,
                    wait_ms: 120,
                    client_timeout_ms: 80,
                };
                // Admission owns which code each reason answers with; it must be one of ours.
                let code = ErrorCode::ALL
                    .into_iter()
                    .find(|c| c.as_str() == reason.code())
                    .expect("admission's refusal codes are in the API's list");
                let envelope = ErrorEnvelope::new(code, refusal.message(), Some(u64::from(retry_after_seconds)));
                let ours = unavailable(&envelope, refusal.retry_after_header());
                let theirs = refusal.default_response();
                assert_eq!(ours.status(), theirs.status());
                assert_eq!(ours.headers(), theirs.headers());
                assert_eq!(ours.body(), theirs.body(), "{reason:?}: the envelope's bytes");
                let json: serde_json::Value = serde_json::from_slice(theirs.body()).expect("JSON");
                assert_eq!(json["error"]["code"], code.as_str());
                assert_eq!(json["error"]["recovery"]["retry_after_seconds"], retry_after_seconds);
            }
        }
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
