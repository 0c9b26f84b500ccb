//! Every kind of bad input gets a typed envelope with the right status: never a 500, never a
//! panic, never a leak of SQL or internals.

mod common;

use common::{spawn, tenant};
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn bad_input_is_refused_with_the_envelope(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let conv = t.conversation(&app, ann).await;
    let msgs = format!("/v1/conversations/{conv}/messages");

    let raw = |method: Method, path: &str, body: &'static str| {
        app.http
            .request(method, app.url(path))
            .bearer_auth(&t.token)
            .header("content-type", "application/json")
            .body(body)
    };
    // Each outcome once, with the requests that must get it.
    let cases = vec![
        (
            StatusCode::BAD_REQUEST,
            "invalid_request",
            vec![
                ("malformed JSON", raw(Method::POST, &msgs, "{\"body\": ")),
                ("wrong type", raw(Method::POST, &msgs, "{\"body\": 42}")),
                ("unknown field", raw(Method::POST, &msgs, "{\"body\": \"x\", \"admin\": true}")),
                ("missing field", raw(Method::POST, "/v1/contacts", "{}")),
                ("not JSON at all", raw(Method::POST, "/v1/contacts", "\u{0}\u{1}")),
                (
                    "no content type",
                    app.http.post(app.url("/v1/contacts")).bearer_auth(&t.token).body("{\"name\":\"x\"}"),
                ),
                (
                    "bad status value",
                    raw(Method::PATCH, &format!("/v1/conversations/{conv}"), "{\"status\": \"deleted\"}"),
                ),
                ("bad uuid in path", raw(Method::GET, "/v1/conversations/not-a-uuid", "")),
                ("bad uuid in query", raw(Method::GET, "/v1/conversations?inbox_id=nope", "")),
                ("bad assignee", raw(Method::GET, "/v1/conversations?assignee_id=nobody", "")),
                ("bad status filter", raw(Method::GET, "/v1/conversations?status=deleted", "")),
                ("unknown query parameter", raw(Method::GET, "/v1/conversations?statuss=open", "")),
                ("bad cursor", raw(Method::GET, "/v1/conversations?cursor=garbage", "")),
                ("tampered cursor", raw(Method::GET, "/v1/conversations?cursor=dDoxMjM0OmFiYw", "")),
                ("limit 0", raw(Method::GET, "/v1/contacts?limit=0", "")),
                ("limit 101", raw(Method::GET, "/v1/contacts?limit=101", "")),
                ("negative limit", raw(Method::GET, "/v1/contacts?limit=-1", "")),
                ("huge limit", raw(Method::GET, "/v1/contacts?limit=99999999999999999999", "")),
                ("bad order", raw(Method::GET, &format!("{msgs}?order=sideways"), "")),
            ],
        ),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            vec![
                ("NUL in a search", raw(Method::GET, "/v1/contacts?name=a%00b", "")),
                ("NUL in a name", raw(Method::POST, "/v1/contacts", "{\"name\": \"a\\u0000b\"}")),
            ],
        ),
        (
            StatusCode::NOT_FOUND,
            "not_found",
            vec![
                ("unknown route", raw(Method::GET, "/v1/nothing-here", "")),
                ("unknown id", raw(Method::GET, &format!("/v1/contacts/{}", Uuid::now_v7()), "")),
            ],
        ),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            vec![
                ("wrong method", raw(Method::PUT, "/v1/contacts", "{}")),
                ("wrong method on an item", raw(Method::POST, &format!("/v1/contacts/{ann}"), "{}")),
            ],
        ),
        (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            vec![
                ("no token", app.http.get(app.url("/v1/contacts"))),
                ("garbage token", app.http.get(app.url("/v1/contacts")).bearer_auth("x.y.z")),
                ("basic auth", app.http.get(app.url("/v1/contacts")).basic_auth("a", Some("b"))),
            ],
        ),
    ];
    for (status, code, requests) in cases {
        for (name, req) in requests {
            let r = app.send(req).await;
            assert_eq!((r.status, r.code()), (status, code), "{name}: {}", r.text);
            assert!(r.body["error"]["message"].is_string(), "{name}: no message");
            assert_eq!(r.body["error"]["recovery"]["retryable"], false, "{name}");
            let lower = r.text.to_lowercase();
            for leak in ["sqlx", "postgres", "select ", "panicked", "relation"] {
                assert!(!lower.contains(leak), "{name} leaks `{leak}`: {}", r.text);
            }
        }
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn oversized_bodies_get_413_declared_or_streamed(pool: PgPool) {
    let app = common::spawn_with(pool.clone(), &["--body-limit-bytes", "1024"]).await;
    let t = tenant(&pool, "Acme").await;
    let big = json!({"name": "x".repeat(5000)}).to_string();

    // Declared with Content-Length: refused before auth runs (no token needed to see it).
    let r = app
        .send(app.http.post(app.url("/v1/contacts")).header("content-type", "application/json").body(big.clone()))
        .await;
    assert_eq!((r.status, r.code()), (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"), "{}", r.text);

    // Streamed (chunked, no Content-Length): cut at the cap as it is read.
    let chunks: Vec<Result<String, std::io::Error>> =
        big.as_bytes().chunks(512).map(|c| Ok(String::from_utf8_lossy(c).into_owned())).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let r = app
        .send(
            app.http
                .post(app.url("/v1/contacts"))
                .bearer_auth(&t.token)
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
    assert_eq!((r.status, r.code()), (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"), "{}", r.text);

    let r = app.post("/v1/contacts", &t.token, json!({"name": "small"})).await;
    assert_eq!(r.status, StatusCode::CREATED);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_token_for_a_user_that_does_not_exist_cannot_write(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let conv = t.conversation(&app, ann).await;
    let ghost =
        common::token_for(t.id, breakwater_domain::UserId(Uuid::now_v7()), breakwater_domain::tenants::Role::Agent);
    let r = app.post(&format!("/v1/conversations/{conv}/messages"), &ghost, json!({"body": "boo"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::UNAUTHORIZED, "unauthorized"), "{}", r.text);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM messages").fetch_one(&pool).await.expect("count");
    assert_eq!(count, 0);
}
