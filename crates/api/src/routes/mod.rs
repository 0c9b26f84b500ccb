//! The HTTP routes, one module per resource; [`router`] merges them.

use axum::Router;

use crate::ops_listener::OpsState;
use crate::state::AppState;

pub(crate) mod contacts;
pub(crate) mod conversations;
pub(crate) mod health;
pub(crate) mod messages;
pub(crate) mod ops;
pub(crate) mod stream;

/// The public routes: the tenant routes, behind the throttles and the database bulkhead, and
/// `/health`. Readiness, metrics and ops status are on the ops listener ([`ops_router`]).
pub(crate) fn router(state: &AppState) -> Router<AppState> {
    let tenant_routes = Router::new()
        .merge(conversations::router())
        .merge(messages::router())
        .merge(contacts::router())
        .merge(stream::router())
        // The last layer added runs first: throttles, then the bulkhead.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::bulkhead::hold_slot))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::throttle_layer::throttle));
    Router::new().merge(health::router()).merge(tenant_routes)
}

/// The ops listener's routes (`OPS_ADDR`, served on its own thread by `ops_listener`):
/// liveness and readiness there, every limit live and the Prometheus metrics on the request
/// runtime. Never routed from the internet (docs/OPERATIONS.md).
pub(crate) fn ops_router() -> Router<OpsState> {
    use axum::extract::State;
    Router::new().merge(health::router()).merge(health::ready_router()).merge(ops::router()).route(
        "/metrics",
        axum::routing::get(|State(s): State<OpsState>| async move {
            s.on_requests(crate::metrics::scrape(State(s.app.clone()))).await
        }),
    )
}

/// Parses the `limit` query parameter into a page size.
pub(crate) fn page_size(limit: Option<u32>) -> crate::error::ApiResult<u32> {
    breakwater_domain::page_size(limit).map_err(|e| crate::error::ApiError::InvalidRequest(e.to_string()))
}

/// Opens and parses an optional `cursor` query parameter (a sealed cursor, `cursor_seal.rs`).
pub(crate) fn cursor(
    state: &AppState,
    raw: Option<&str>,
) -> crate::error::ApiResult<Option<breakwater_domain::Cursor>> {
    let bad = |e: &dyn std::fmt::Display| crate::error::ApiError::InvalidRequest(e.to_string());
    raw.map(|c| {
        let plain = state.cursors.open(c).map_err(|e| bad(&e))?;
        breakwater_domain::Cursor::decode(&plain).map_err(|e| bad(&e))
    })
    .transpose()
}

/// The view of a domain page, its `next_cursor` sealed.
pub(crate) fn sealed<D, T: From<D>>(state: &AppState, page: breakwater_domain::Page<D>) -> crate::views::Page<T> {
    crate::views::Page::of(page.items, page.next_cursor.map(|c| state.cursors.seal(&c)))
}
