//! `/v1/conversations/{id}/messages`: reading a conversation and replying to it.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use breakwater_domain::messages::{self, Order};
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult, ErrorEnvelope};
use crate::extract::{Json, Path, Query};
use crate::state::AppState;
use crate::views::{Message, Page};

pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/v1/conversations/{id}/messages", get(list).post(create))
}

/// Query parameters of a message list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// `asc` (oldest first, the default) or `desc` (newest first).
    order: Option<Order>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Page size, 1 to 100 (default 25).
    limit: Option<u32>,
}

/// A conversation's messages, keyset-paginated.
#[utoipa::path(get, path = "/v1/conversations/{id}/messages", tag = "messages",
    params(("id" = Uuid, Path, description = "Conversation id"), ListParams), security(("bearer" = [])),
    responses((status = 200, body = Page<Message>), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<Uuid>,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<Page<Message>>> {
    let limit = super::page_size(params.limit)?;
    let cursor = super::cursor(&state, params.cursor.as_deref())?;
    let order = params.order.unwrap_or_default();
    let page = messages::list(&state.pool, auth.tenant, id, order, cursor.as_ref(), limit).await?;
    Ok(axum::Json(super::sealed(&state, page)))
}

/// Body of a new message.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateMessage {
    /// The text, 1 to 10,000 characters.
    body: String,
}

/// The header that makes a POST idempotent.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Appends the caller's message, bumps the conversation's activity and enqueues its delivery.
/// With an `Idempotency-Key` header, a retry returns the first result (with
/// `Idempotent-Replayed: true`) and never writes a duplicate; the same key with another body is
/// a 409.
#[utoipa::path(post, path = "/v1/conversations/{id}/messages", tag = "messages", request_body = CreateMessage,
    params(("id" = Uuid, Path, description = "Conversation id"),
           ("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters")),
    security(("bearer" = [])),
    responses((status = 201, body = Message), (status = 404, body = ErrorEnvelope),
              (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<Uuid>,
    headers: HeaderMap,
    Json(body): Json<CreateMessage>,
) -> ApiResult<impl IntoResponse> {
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(v) => {
            let key = v
                .to_str()
                .ok()
                .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| {
                    ApiError::InvalidRequest("Idempotency-Key must be 1-255 visible ASCII characters".into())
                })?;
            Some(key)
        }
    };
    // The delivery job continues this request's trace in the worker.
    let traceparent = breakwater_telemetry::current_traceparent();
    let posted = messages::post(&state.pool, auth.tenant, auth.user, id, &body.body, key, traceparent).await?;
    let mut response = (StatusCode::CREATED, axum::Json(Message::from(posted.message))).into_response();
    if posted.replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}
