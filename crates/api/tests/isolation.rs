//! Tenant isolation on every endpoint: tenant A's token on tenant B's ids answers exactly what
//! an unknown id answers (404, no data) and changes nothing of B's.

mod common;

use common::{spawn, tenant};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

async fn snapshot(pool: &PgPool, tenant: Uuid) -> Value {
    sqlx::query_scalar::<_, Value>(
        "SELECT json_build_object(
            'contacts', (SELECT json_agg(c ORDER BY c.id) FROM contacts c WHERE c.tenant_id = $1),
            'conversations', (SELECT json_agg(c ORDER BY c.id) FROM conversations c WHERE c.tenant_id = $1),
            'messages', (SELECT json_agg(m ORDER BY m.id) FROM messages m WHERE m.tenant_id = $1),
            'jobs', (SELECT count(*) FROM jobs j WHERE j.tenant_id = $1))",
    )
    .bind(tenant)
    .fetch_one(pool)
    .await
    .expect("snapshot")
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn another_tenants_ids_answer_like_unknown_ids_on_every_endpoint(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let a = tenant(&pool, "Tenant A").await;
    let b = tenant(&pool, "Tenant B").await;
    let b_contact = b.contact(&app, "Bea", "bea@b.example").await;
    let b_conv = b.conversation(&app, b_contact).await;
    b.message(&app, b_conv, "B's secret").await;
    let a_contact = a.contact(&app, "Al", "al@a.example").await;
    let before = snapshot(&pool, b.id.0).await;

    for (label, id_contact, id_conv) in
        [("B's ids", b_contact, b_conv), ("unknown ids", Uuid::now_v7(), Uuid::now_v7())]
    {
        let calls: Vec<(Method, String, Option<Value>)> = vec![
            (Method::GET, format!("/v1/conversations/{id_conv}"), None),
            (Method::PATCH, format!("/v1/conversations/{id_conv}"), Some(json!({"status": "closed"}))),
            (Method::GET, format!("/v1/conversations/{id_conv}/messages"), None),
            (Method::POST, format!("/v1/conversations/{id_conv}/messages"), Some(json!({"body": "injected"}))),
            (Method::GET, format!("/v1/contacts/{id_contact}"), None),
            (Method::DELETE, format!("/v1/contacts/{id_contact}"), None),
        ];
        for (method, path, body) in calls {
            let r = app.call(method.clone(), &path, Some(&a.token), body).await;
            assert_eq!(
                (r.status, r.code()),
                (StatusCode::NOT_FOUND, "not_found"),
                "{label}: {method} {path}: {}",
                r.text
            );
            assert_eq!(
                r.body,
                json!({"error": {"type": "not_found", "code": "not_found", "message": "not found", "recovery": {"retryable": false}}}),
                "{label}: {method} {path} must answer exactly like an unknown id"
            );
        }
        // References in bodies and filters: refused or empty, never B's data.
        let r = app.post("/v1/conversations", &a.token, json!({"contact_id": id_contact, "inbox_id": a.inbox})).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{label}: {}", r.text);
        let r = app.post("/v1/conversations", &a.token, json!({"contact_id": a_contact, "inbox_id": b.inbox})).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{label}: {}", r.text);
        let r = app.get(&format!("/v1/conversations?inbox_id={}", b.inbox), &a.token).await;
        assert_eq!((r.status, r.items().len()), (StatusCode::OK, 0), "{label}");
        let r = app.get(&format!("/v1/conversations?assignee_id={}", b.agent), &a.token).await;
        assert_eq!((r.status, r.items().len()), (StatusCode::OK, 0), "{label}");
    }
    // A's own lists hold none of B's rows.
    let convs = common::walk(&app, "/v1/conversations", &a.token).await;
    assert!(convs.is_empty(), "{convs:?}");
    let contacts = common::walk(&app, "/v1/contacts", &a.token).await;
    assert_eq!(contacts.iter().map(common::id_of).collect::<Vec<_>>(), vec![a_contact]);
    let contacts = common::walk(&app, "/v1/contacts?name=Be", &a.token).await;
    assert!(contacts.is_empty());
    // A cursor made from B's list reads A's data only.
    let r = app.get("/v1/conversations?limit=1", &b.token).await;
    assert_eq!(r.items().len(), 1);

    assert_eq!(snapshot(&pool, b.id.0).await, before, "tenant A changed tenant B's rows");
}
