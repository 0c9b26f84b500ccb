//! The HTTP routes, one module per resource; [`router`] merges them.

use axum::Router;

use crate::state::AppState;

pub(crate) mod contacts;
pub(crate) mod conversations;
pub(crate) mod health;
pub(crate) mod messages;
pub(crate) mod ops;

/// Every route of the API.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .merge(health::router())
        .merge(ops::router())
        .merge(conversations::router())
        .merge(messages::router())
        .merge(contacts::router())
}

/// Parses the `limit` query parameter into a page size.
pub(crate) fn page_size(limit: Option<u32>) -> crate::error::ApiResult<u32> {
    breakwater_domain::page_size(limit).map_err(|e| crate::error::ApiError::InvalidRequest(e.to_string()))
}

/// Parses an optional `cursor` query parameter.
pub(crate) fn cursor(raw: Option<&str>) -> crate::error::ApiResult<Option<breakwater_domain::Cursor>> {
    raw.map(|c| breakwater_domain::Cursor::decode(c).map_err(|e| crate::error::ApiError::InvalidRequest(e.to_string())))
        .transpose()
}
