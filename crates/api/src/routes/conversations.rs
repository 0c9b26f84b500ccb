//! `/v1/conversations`: the inbox, its counts, one conversation, opening and updating one.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Router, response::IntoResponse};
use breakwater_domain::conversations::{
    self, AssigneeFilter, ConversationChanges, ConversationStatus, InboxFilter, NewConversation,
};
use breakwater_domain::counts;
use serde::{Deserialize, Deserializer};
use uuid::Uuid;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult, ErrorEnvelope};
use crate::extract::{Json, Path, Query};
use crate::state::AppState;
use crate::views::{Conversation, ConversationCounts, Page};

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/conversations", get(list).post(create))
        .route("/v1/conversations/counts", get(count))
        .route("/v1/conversations/{id}", get(show).patch(update))
}

/// Query parameters of the inbox.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// Only conversations in this status.
    status: Option<ConversationStatus>,
    /// Only conversations of this inbox.
    inbox_id: Option<Uuid>,
    /// Only conversations assigned to this agent, or `unassigned`.
    #[param(value_type = Option<String>)]
    assignee_id: Option<String>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Page size, 1 to 100 (default 25).
    limit: Option<u32>,
}

/// The inbox: the tenant's conversations, newest activity first, keyset-paginated.
/// Filter by `status`, and by `inbox_id` or `assignee_id` (an agent's id, or `unassigned`).
#[utoipa::path(get, path = "/v1/conversations", tag = "conversations", params(ListParams),
    security(("bearer" = [])),
    responses((status = 200, body = Page<Conversation>), (status = 400, body = ErrorEnvelope),
              (status = 401, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    auth: Auth,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<Page<Conversation>>> {
    let assignee = assignee_filter(params.assignee_id.as_deref())?;
    let filter = InboxFilter { status: params.status, inbox_id: params.inbox_id, assignee };
    let limit = super::page_size(params.limit)?;
    let cursor = super::cursor(&state, params.cursor.as_deref())?;
    let page = conversations::list(&state.pool, auth.tenant, filter, cursor.as_ref(), limit).await?;
    Ok(axum::Json(super::sealed(&state, page)))
}

/// The `assignee_id` filter of the inbox list and the stream: an agent's id or `unassigned`.
pub(crate) fn assignee_filter(raw: Option<&str>) -> ApiResult<AssigneeFilter> {
    Ok(match raw {
        None => AssigneeFilter::Any,
        Some("unassigned") => AssigneeFilter::Unassigned,
        Some(raw) => AssigneeFilter::User(
            Uuid::parse_str(raw)
                .map_err(|_| ApiError::InvalidRequest("assignee_id must be a UUID or `unassigned`".into()))?,
        ),
    })
}

/// Query parameters of the counts.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct CountsParams {
    /// Only conversations of this inbox.
    inbox_id: Option<Uuid>,
}

/// The inbox counts: per status, every conversation, the caller's (`mine`) and the unassigned
/// ones, in the tenant or in one inbox; what the inbox list with the same filters would walk.
/// Exact, and cheap however large the tenant: kept as counters by every write, never counted on
/// request. An inbox that is unknown or another tenant's counts zero, as the list's filter
/// gives an empty page.
#[utoipa::path(get, path = "/v1/conversations/counts", tag = "conversations", params(CountsParams),
    security(("bearer" = [])),
    responses((status = 200, body = ConversationCounts), (status = 400, body = ErrorEnvelope),
              (status = 401, body = ErrorEnvelope)))]
pub(crate) async fn count(
    State(state): State<AppState>,
    auth: Auth,
    Query(params): Query<CountsParams>,
) -> ApiResult<axum::Json<ConversationCounts>> {
    Ok(axum::Json(counts::get(&state.pool, auth.tenant, auth.user, params.inbox_id).await?.into()))
}

/// One conversation.
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "conversations",
    params(("id" = Uuid, Path, description = "Conversation id")), security(("bearer" = [])),
    responses((status = 200, body = Conversation), (status = 404, body = ErrorEnvelope)))]
pub(crate) async fn show(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<Uuid>,
) -> ApiResult<axum::Json<Conversation>> {
    Ok(axum::Json(conversations::get(&state.pool, auth.tenant, id).await?.into()))
}

/// Body of `POST /v1/conversations`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateConversation {
    /// The contact who writes in.
    contact_id: Uuid,
    /// The inbox they write to.
    inbox_id: Uuid,
    /// The agent to assign it to.
    assignee_id: Option<Uuid>,
    /// Initial status (default `open`).
    status: Option<ConversationStatus>,
}

/// Opens a conversation between one of the tenant's contacts and one of its inboxes.
#[utoipa::path(post, path = "/v1/conversations", tag = "conversations", request_body = CreateConversation,
    security(("bearer" = [])),
    responses((status = 201, body = Conversation), (status = 400, body = ErrorEnvelope),
              (status = 422, body = ErrorEnvelope)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    auth: Auth,
    Json(body): Json<CreateConversation>,
) -> ApiResult<impl IntoResponse> {
    let new = NewConversation {
        contact_id: body.contact_id,
        inbox_id: body.inbox_id,
        assignee_id: body.assignee_id,
        status: body.status.unwrap_or(ConversationStatus::Open),
    };
    let created = conversations::create(&state.pool, auth.tenant, new).await?;
    Ok((StatusCode::CREATED, axum::Json(Conversation::from(created))))
}

/// Body of `PATCH /v1/conversations/{id}`: absent fields are left as they are; `"assignee_id":
/// null` unassigns.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateConversation {
    /// The new status.
    status: Option<ConversationStatus>,
    /// The agent to assign it to, or `null` to unassign.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Uuid>)]
    assignee_id: Option<Option<Uuid>>,
}

/// Tells a field set to `null` (`Some(None)`) from an absent one (`None`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Uuid>>, D::Error> {
    Option::<Uuid>::deserialize(d).map(Some)
}

/// Changes a conversation's status and/or assignee.
#[utoipa::path(patch, path = "/v1/conversations/{id}", tag = "conversations", request_body = UpdateConversation,
    params(("id" = Uuid, Path, description = "Conversation id")), security(("bearer" = [])),
    responses((status = 200, body = Conversation), (status = 404, body = ErrorEnvelope),
              (status = 422, body = ErrorEnvelope)))]
pub(crate) async fn update(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<Uuid>,
    Json(body): Json<UpdateConversation>,
) -> ApiResult<axum::Json<Conversation>> {
    if body.status.is_none() && body.assignee_id.is_none() {
        return Err(ApiError::InvalidRequest("nothing to change: give status and/or assignee_id".into()));
    }
    let changes = ConversationChanges { status: body.status, assignee_id: body.assignee_id };
    Ok(axum::Json(conversations::update(&state.pool, auth.tenant, id, changes).await?.into()))
}
