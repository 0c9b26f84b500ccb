//! Extractors whose rejections use our envelope instead of axum's plain-text bodies.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// `axum::Json`, rejecting with the envelope (400, or 413 past the body cap).
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = req.extensions().get::<crate::body::BodyLimit>().map(|l| l.0);
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_rejection(&rejection, limit)),
        }
    }
}

fn json_rejection(rejection: &JsonRejection, limit: Option<usize>) -> ApiError {
    match rejection {
        JsonRejection::BytesRejection(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::BodyTooLarge { limit: limit.unwrap_or_default() }
        }
        JsonRejection::MissingJsonContentType(_) => {
            ApiError::InvalidRequest("expected a request body with content-type: application/json".into())
        }
        // serde's messages name the field and the expected type, never server internals.
        other => ApiError::InvalidRequest(other.body_text()),
    }
}

/// `axum::extract::Path`, rejecting with the envelope: a malformed id is a 400 naming it.
#[derive(Debug, Clone, Copy, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        match rejection {
            PathRejection::FailedToDeserializePathParams(e) => Self::InvalidRequest(e.body_text()),
            other => Self::Internal(anyhow::anyhow!("path extraction: {other}")),
        }
    }
}

/// `axum::extract::Query`, rejecting with the envelope (400 naming the bad parameter).
#[derive(Debug, Clone, Copy, Default, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::InvalidRequest(rejection.body_text())
    }
}
