//! The OpenAPI document, generated from the handlers' annotations and served at `/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes::{contacts, conversations, health, messages, ops};

/// The API's OpenAPI description.
#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Breakwater", description = "A multi-tenant chat API with built-in overload protection. \
        Every refusal is a typed envelope; 429 and 503 carry Retry-After."),
    paths(
        conversations::list, conversations::show, conversations::create, conversations::update,
        messages::list, messages::create,
        contacts::list, contacts::show, contacts::create, contacts::erase,
        health::health, health::ready, ops::status,
    ),
    modifiers(&BearerAuth),
    tags((name = "conversations"), (name = "messages"), (name = "contacts"), (name = "ops"))
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
