//! Extractors whose rejections use our envelope instead of axum's plain-text bodies.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
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
#[derive(Debug, Clone, Copy)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => Err(ApiError::InvalidRequest(e.body_text())),
            Err(other) => Err(ApiError::Internal(anyhow::anyhow!("path extraction: {other}"))),
        }
    }
}

// `Json`, `Path` and `Query` share a shape, not logic: each wraps its own axum extractor (of
// the body or of the parts) and maps its own rejections; a macro over three short impls would
// hide exactly what differs.

/// `axum::extract::Query`, rejecting with the envelope (400 naming the bad parameter).
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(ApiError::InvalidRequest(e.body_text())),
            Err(other) => Err(ApiError::InvalidRequest(other.body_text())),
        }
    }
}
