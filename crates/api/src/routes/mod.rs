//! The HTTP routes, one module per resource; [`router`] merges them.

use axum::Router;

use crate::state::AppState;

pub(crate) mod contacts;
pub(crate) mod conversations;
pub(crate) mod health;
pub(crate) mod messages;
pub(crate) mod ops;

/// Every route of the API. The tenant routes run behind the throttles and the database
/// bulkhead; health, readiness and ops never do.
pub(crate) fn router(state: &AppState) -> Router<AppState> {
    let tenant_routes = Router::new()
        .merge(conversations::router())
        .merge(messages::router())
        .merge(contacts::router())
        // The last layer added runs first: throttles, then the bulkhead.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::bulkhead::hold_slot))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::throttle_layer::throttle));
    Router::new().merge(health::router()).merge(ops::router()).merge(tenant_routes)
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
