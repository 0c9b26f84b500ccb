//! The OpenAPI document, generated from the handlers' annotations and served at `/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder, content::ContentBuilder};
use utoipa::{Modify, OpenApi};

use crate::error::ErrorEnvelope;
use crate::routes::{contacts, conversations, health, messages, stream};

/// The API's OpenAPI description.
#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Breakwater", description = "A multi-tenant chat API with built-in overload protection. \
        Every refusal is a typed envelope; 429 and 503 carry Retry-After."),
    paths(
        conversations::list, conversations::count, conversations::show, conversations::create,
        conversations::update,
        messages::list, messages::create,
        contacts::list, contacts::show, contacts::create, contacts::erase,
        stream::open,
        health::health,
    ),
    components(schemas(breakwater_domain::messages::Order, crate::error::ErrorCode, crate::views::StreamEvent)),
    modifiers(&BearerAuth, &Roles, &LayerResponses),
    tags((name = "conversations"), (name = "messages"), (name = "contacts"), (name = "stream"), (name = "ops"))
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()),
        );
    }
}

/// A response whose body is the error envelope.
fn envelope(description: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                    <ErrorEnvelope as utoipa::ToSchema>::name(),
                ))))
                .build(),
        )
        .into()
}

/// Each bearer operation's role, from the permission table (its one owner), as the scope of
/// its `bearer` requirement; an admin-only operation also documents its 403. An operation the
/// table does not list keeps an empty scope, which the document's test refuses.
struct Roles;

impl Modify for Roles {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::SecurityRequirement;
        for (path, item) in &mut openapi.paths.paths {
            let operations = [
                (axum::http::Method::GET, &mut item.get),
                (axum::http::Method::PUT, &mut item.put),
                (axum::http::Method::POST, &mut item.post),
                (axum::http::Method::PATCH, &mut item.patch),
                (axum::http::Method::DELETE, &mut item.delete),
            ];
            for (method, op) in operations {
                let Some(op) = op.as_mut() else { continue };
                if op.security.as_ref().is_none_or(Vec::is_empty) {
                    continue;
                }
                let Some(role) = crate::permissions::required(&method, path) else { continue };
                op.security = Some(vec![SecurityRequirement::new("bearer", [crate::permissions::role_name(role)])]);
                if role != breakwater_domain::tenants::Role::Agent {
                    op.responses
                        .responses
                        .insert("403".to_owned(), envelope("The token's role may not do this (the permission table)"));
                }
            }
        }
    }
}

/// The refusals the layers in front of every tenant route may answer with, whatever the handler
/// does: documented once here rather than on each handler, so the document cannot drift from
/// the layers (the chaos suite's schemathesis run fails on any undocumented status).
struct LayerResponses;

impl Modify for LayerResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.patch,
                &mut item.delete,
                &mut item.head,
                &mut item.options,
                &mut item.trace,
            ];
            for op in operations.into_iter().flatten() {
                // Only the tenant routes (bearer-authenticated) run behind auth, admission,
                // throttles and the bulkhead; health, readiness and ops bypass them.
                if op.security.as_ref().is_none_or(Vec::is_empty) {
                    continue;
                }
                let mut add = |code: &str, description: &str| {
                    op.responses.responses.entry(code.to_owned()).or_insert_with(|| envelope(description));
                };
                add("400", "Malformed input: a bad path id, query parameter, header or body");
                add("401", "Missing, malformed, expired or forged bearer token");
                add("429", "A throttle bucket ran out; Retry-After says when to retry");
                add(
                    "503",
                    "Refused under overload (load_shed, queue_timeout, db_saturated, db_unavailable, request_timeout); Retry-After",
                );
                if op.request_body.is_some() {
                    add("413", "The body exceeds the cap");
                    add("408", "The body did not arrive within the body-read timeout; the connection is closed");
                }
            }
        }
    }
}
