//! Roles: every operation of the OpenAPI document declares its least role, the document, the
//! permission table and README.md's table agree, and a sweep over every operation with an
//! agent's token and an admin's shows the table enforced (403 `forbidden`, nothing changed).

mod common;

use std::collections::BTreeMap;

use breakwater_api::openapi::ApiDoc;
use breakwater_api::permissions::{PERMISSIONS, role_name, satisfies};
use breakwater_domain::tenants::Role;
use common::{spawn, tenant};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use utoipa::OpenApi as _;

/// `METHOD /path` -> the role the document declares (the bearer requirement's one scope), for
/// every operation that needs a token. Panics on a bearer operation without exactly one role.
fn documented_roles() -> BTreeMap<String, String> {
    let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let mut roles = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            let Some(security) = op["security"].as_array().filter(|s| !s.is_empty()) else { continue };
            let op_name = format!("{} {path}", method.to_uppercase());
            let scopes = security[0]["bearer"].as_array().unwrap_or_else(|| panic!("{op_name}: no bearer requirement"));
            assert_eq!(scopes.len(), 1, "{op_name} declares no role (add it to the permission table): {security:?}");
            let role = scopes[0].as_str().expect("a scope").to_owned();
            assert!(["agent", "admin"].contains(&role.as_str()), "{op_name}: unknown role {role}");
            roles.insert(op_name, role);
        }
    }
    roles
}

#[test]
fn every_operation_declares_its_role_and_the_table_the_document_and_the_readme_agree() {
    let documented = documented_roles();
    let table: BTreeMap<String, String> =
        PERMISSIONS.iter().map(|p| (format!("{} {}", p.method, p.path), role_name(p.role).to_owned())).collect();
    assert_eq!(documented, table, "the OpenAPI document and the permission table differ");

    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).expect("README");
    let section = readme.split("### Roles").nth(1).expect("README.md has a Roles section");
    let rows: BTreeMap<String, String> = section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let op = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((op.to_owned(), (*cells.get(2)?).to_owned()))
        })
        .collect();
    assert_eq!(rows, table, "README.md's Roles table and the permission table differ");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_operation_is_refused_to_a_role_below_its_own_and_served_to_the_rest(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    for (op, role) in documented_roles() {
        let required = if role == "admin" { Role::Admin } else { Role::Agent };
        for (caller, token) in [(Role::Agent, &t.agent_token), (Role::Admin, &t.token)] {
            // Fresh rows for every call: an erasure or a close must not change the next one.
            let contact = t.contact(&app, "Ann", &format!("ann-{}@example.com", uuid::Uuid::now_v7())).await;
            let conversation = t.conversation(&app, contact).await;
            let (method, template) = op.split_once(' ').expect("METHOD /path");
            let path = if template.starts_with("/v1/contacts/") {
                template.replace("{id}", &contact.to_string())
            } else {
                template.replace("{id}", &conversation.to_string())
            };
            let body: Option<Value> = match op.as_str() {
                "POST /v1/conversations" => Some(json!({"contact_id": contact, "inbox_id": t.inbox})),
                "PATCH /v1/conversations/{id}" => Some(json!({"status": "closed"})),
                "POST /v1/conversations/{id}/messages" => Some(json!({"body": "hello"})),
                "POST /v1/contacts" => Some(json!({"name": "Bo"})),
                _ if method == "GET" || method == "DELETE" => None,
                _ => panic!("{op}: add a body for it to the role sweep"),
            };
            let before = app.get(&format!("/v1/contacts/{contact}"), &t.token).await;
            let method = Method::from_bytes(method.as_bytes()).expect("a method");
            let r = if op == "GET /v1/stream" {
                // A stream's body never ends: its status and headers are the answer.
                let s = common::sse::open(&app, &path, token, None).await;
                common::Reply { status: s.status, headers: s.headers.clone(), body: Value::Null, text: String::new() }
            } else {
                app.call(method, &path, Some(token), body).await
            };
            if satisfies(caller, required) {
                assert!(r.status.is_success(), "{op} as {caller:?}: {} {}", r.status, r.text);
            } else {
                assert_eq!(
                    (r.status, r.code()),
                    (StatusCode::FORBIDDEN, "forbidden"),
                    "{op} as {caller:?}: {}",
                    r.text
                );
                let after = app.get(&format!("/v1/contacts/{contact}"), &t.token).await;
                assert_eq!((after.status, &after.body), (before.status, &before.body), "{op}: a refusal changed data");
                let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = 'erase_contact'")
                    .fetch_one(&pool)
                    .await
                    .expect("jobs");
                assert_eq!(jobs, 0, "{op}: a refused erasure was enqueued");
            }
        }
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_head_request_needs_what_its_get_needs(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let r = app.call(Method::HEAD, "/v1/contacts", Some(&t.agent_token), None).await;
    assert_eq!(r.status, StatusCode::OK, "HEAD of an agent's GET route");
}
