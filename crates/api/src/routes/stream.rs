//! `/v1/stream`: the tenant's live inbox events as Server-Sent Events (`crate::stream`).

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use breakwater_domain::conversations::ConversationStatus;
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult, ErrorEnvelope};
use crate::extract::Query;
use crate::state::AppState;
use crate::stream::{self, Filter, Refused, Resume, ResumePlan};

/// The header a reconnecting client sends: the `id` of the last event it received.
pub(crate) const LAST_EVENT_ID: &str = "last-event-id";

/// The stream's path: the router serves it, admission's classifier gives it the `streams` class
/// (`crate::admission`). (The OpenAPI attribute below needs it as a literal.)
pub(crate) const PATH: &str = "/v1/stream";

pub(crate) fn router() -> Router<AppState> {
    Router::new().route(PATH, get(open))
}

/// Query parameters of the stream: the inbox list's filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StreamParams {
    /// Only events of conversations in this status (an update shows where it was as well).
    status: Option<ConversationStatus>,
    /// Only events of this inbox's conversations.
    inbox_id: Option<Uuid>,
    /// Only events of conversations assigned to this agent, or `unassigned`.
    #[param(value_type = Option<String>)]
    assignee_id: Option<String>,
}

/// The live inbox: the tenant's events as Server-Sent Events (`text/event-stream`), each with
/// an `id:`, an `event:` (`conversation.created`, `conversation.updated`, `message.created`,
/// `contact.erased`, or `resync`) and a JSON `data:` (`StreamEvent`).
///
/// Reconnect with `Last-Event-ID` to replay what was missed; a client further behind than the
/// retention or the replay cap gets one `resync` event (re-read the lists) and live events
/// after it. An idle stream gets a comment line every `STREAM_HEARTBEAT_SECS`. At shutdown,
/// and to a client too slow to keep up (after `resync`), the stream ends with a `retry:` hint;
/// reconnect after it. Past the caps: 503 `streams_full` (this task) or 429 `stream_limit`
/// (the tenant), both with a jittered `Retry-After`.
#[utoipa::path(get, path = "/v1/stream", tag = "stream", params(StreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received: resume after it.")),
    security(("bearer" = [])),
    responses((status = 200, description = "The event stream; each event's `data` is a `StreamEvent`.",
                content_type = "text/event-stream", body = String),
              (status = 400, body = ErrorEnvelope), (status = 401, body = ErrorEnvelope),
              (status = 429, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)))]
pub(crate) async fn open(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    Query(params): Query<StreamParams>,
) -> ApiResult<Response> {
    let assignee = super::conversations::assignee_filter(params.assignee_id.as_deref())?;
    let filter = Filter { inbox_id: params.inbox_id, assignee, status: params.status };
    let last_event_id = headers
        .get(LAST_EVENT_ID)
        .map(|v| stream::parse_last_event_id(v.as_bytes()))
        .transpose()
        .map_err(ApiError::InvalidRequest)?;
    // Subscribed before the head is read: an event committed meanwhile is replayed, delivered
    // live, or both (the stream drops the repeat), never neither.
    let subscription = state.streams.subscribe(auth.tenant).map_err(|refused| {
        let retry_after = stream::jittered(state.streams.settings().retry).as_secs().max(1);
        match refused {
            Refused::TaskFull => ApiError::StreamsFull { retry_after },
            Refused::TenantFull => ApiError::StreamLimit { retry_after },
        }
    })?;
    let resume = match last_event_id {
        None => Resume::Live,
        Some(id) => {
            let replay_max = state.streams.settings().replay_max;
            let head = breakwater_domain::stream::head(&state.pool, auth.tenant).await?;
            match Resume::plan(id, head, replay_max).map_err(ApiError::InvalidRequest)? {
                ResumePlan::Replay { after, through } => {
                    let events =
                        breakwater_domain::stream::range(&state.pool, auth.tenant, after, through, replay_max).await?;
                    Resume::Replay { after, events }
                }
                ResumePlan::Resync => Resume::Resync { head: head.last_id },
            }
        }
    };
    let mut response = stream::respond(subscription, state.streams.clone(), filter, resume).into_response();
    // Its head is the request's end as far as admission is concerned: the stream holds no slot.
    response.extensions_mut().insert(breakwater_admission::LongLived);
    Ok(response)
}
