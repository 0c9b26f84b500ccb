//! `/v1/contacts`: the contacts list, one contact, creating one, and privacy erasure.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use breakwater_domain::contacts::{self, ContactSearch, NewContact};
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult, ErrorEnvelope};
use crate::extract::{Json, Path, Query};
use crate::state::AppState;
use crate::views::{Contact, ErasureAccepted, Page};

pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/v1/contacts", get(list).post(create)).route("/v1/contacts/{id}", get(show).delete(erase))
}

/// Query parameters of the contacts list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// Only contacts whose name starts with this (case-insensitive); sorted by name.
    name: Option<String>,
    /// Only contacts whose email starts with this (case-insensitive); sorted by email.
    email: Option<String>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Page size, 1 to 100 (default 25).
    limit: Option<u32>,
}

const MAX_PREFIX_CHARS: usize = 200;

/// The tenant's contacts by name, each with their conversation count and newest activity;
/// search by `name` or `email` prefix.
#[utoipa::path(get, path = "/v1/contacts", tag = "contacts", params(ListParams), security(("bearer" = [])),
    responses((status = 200, body = Page<Contact>), (status = 400, body = ErrorEnvelope),
              (status = 422, body = ErrorEnvelope)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    auth: Auth,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<Page<Contact>>> {
    let search = match (params.name, params.email) {
        (None, None) => ContactSearch::All,
        (Some(p), None) => ContactSearch::NamePrefix(p),
        (None, Some(p)) => ContactSearch::EmailPrefix(p),
        (Some(_), Some(_)) => return Err(ApiError::InvalidRequest("search by name or by email, not both".into())),
    };
    if let ContactSearch::NamePrefix(p) | ContactSearch::EmailPrefix(p) = &search
        && p.chars().count() > MAX_PREFIX_CHARS
    {
        return Err(ApiError::InvalidRequest(format!("a search prefix is at most {MAX_PREFIX_CHARS} characters")));
    }
    let limit = super::page_size(params.limit)?;
    let cursor = super::cursor(&state, params.cursor.as_deref())?;
    let page = contacts::list(&state.pool, auth.tenant, &search, cursor.as_ref(), limit).await?;
    Ok(axum::Json(super::sealed(&state, page)))
}

/// One contact.
#[utoipa::path(get, path = "/v1/contacts/{id}", tag = "contacts",
    params(("id" = Uuid, Path, description = "Contact id")), security(("bearer" = [])),
    responses((status = 200, body = Contact), (status = 404, body = ErrorEnvelope)))]
pub(crate) async fn show(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<Uuid>,
) -> ApiResult<axum::Json<Contact>> {
    Ok(axum::Json(contacts::get(&state.pool, auth.tenant, id).await?.into()))
}

/// Body of `POST /v1/contacts`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateContact {
    /// Display name, 1 to 200 characters.
    name: String,
    /// Email address.
    email: Option<String>,
}

/// Creates a contact.
#[utoipa::path(post, path = "/v1/contacts", tag = "contacts", request_body = CreateContact,
    security(("bearer" = [])),
    responses((status = 201, body = Contact), (status = 400, body = ErrorEnvelope),
              (status = 422, body = ErrorEnvelope)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    auth: Auth,
    Json(body): Json<CreateContact>,
) -> ApiResult<impl IntoResponse> {
    let contact = contacts::create(&state.pool, auth.tenant, NewContact { name: body.name, email: body.email }).await?;
    Ok((StatusCode::CREATED, axum::Json(Contact::from(contact))))
}

/// Privacy erasure (PDPA/GDPR): from this response on, the contact and all of their
/// conversations answer 404; a job deletes their messages, conversations and the contact.
#[utoipa::path(delete, path = "/v1/contacts/{id}", tag = "contacts",
    params(("id" = Uuid, Path, description = "Contact id")), security(("bearer" = [])),
    responses((status = 202, body = ErasureAccepted), (status = 404, body = ErrorEnvelope)))]
pub(crate) async fn erase(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<Uuid>,
) -> ApiResult<impl IntoResponse> {
    // The erasure job continues this request's trace in the worker.
    let traceparent = breakwater_telemetry::current_traceparent();
    let accepted = contacts::request_erasure_traced(&state.pool, auth.tenant, id, traceparent).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(ErasureAccepted::from(accepted))))
}
