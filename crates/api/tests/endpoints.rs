//! The chat endpoints end to end: the real app, a real PostgreSQL, a fresh database per test.

mod common;

use std::collections::HashSet;

use common::{Reply, Tenant, TestApp, id_of, spawn, tenant, walk};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn health_ready_ops_and_openapi_answer(pool: PgPool) {
    let app = spawn(pool).await;
    let r = app.call(reqwest::Method::GET, "/health", None, None).await;
    assert_eq!((r.status, r.body.clone()), (StatusCode::OK, json!({"status": "ok"})));
    assert!(r.headers.contains_key("x-request-id"));

    let r = app.ops("/ready").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["database"], "ok");

    let r = app.ops("/v1/ops/status").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["layers"]["body"]["limit_bytes"], 65536);
    assert_eq!(r.body["layers"]["pool"]["max"], 10);
    assert_eq!(r.body["layers"]["connections"]["keep_alive_timeout_seconds"], 75);

    let r = app.call(reqwest::Method::GET, "/openapi.json", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    for path in [
        "/v1/conversations",
        "/v1/conversations/{id}",
        "/v1/conversations/{id}/messages",
        "/v1/contacts",
        "/v1/contacts/{id}",
    ] {
        assert!(r.body["paths"][path].is_object(), "{path} missing from the OpenAPI document");
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_client_request_id_is_echoed(pool: PgPool) {
    let app = spawn(pool).await;
    let r = app.send(app.http.get(app.url("/health")).header("x-request-id", "abc-123")).await;
    assert_eq!(r.headers["x-request-id"], "abc-123");
}

/// Ann's and Bob's conversations: Ann's opened with the defaults (`c1`: open, unassigned, the
/// first inbox), Bob's with every field (pending, the agent's, the other inbox). Returns Ann, Bob,
/// `c1` and the reply that opened Bob's.
async fn ann_and_bob(app: &TestApp, t: &Tenant) -> (Uuid, Uuid, Uuid, Reply) {
    let ann = t.contact(app, "Ann", "ann@example.com").await;
    let bob = t.contact(app, "Bob", "bob@example.com").await;
    let c1 = t.conversation(app, ann).await;
    let r = app
        .post(
            "/v1/conversations",
            &t.token,
            json!({"contact_id": bob, "inbox_id": t.other_inbox, "assignee_id": t.agent.0, "status": "pending"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    (ann, bob, c1, r)
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn conversations_open_show_update_and_filter(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let (ann, _bob, c1, r) = ann_and_bob(&app, &t).await;
    let c2 = id_of(&r.body);
    assert_eq!(r.body["contact_name"], "Bob");
    assert_eq!(r.body["status"], "pending");

    let r = app.get(&format!("/v1/conversations/{c1}"), &t.token).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["contact_name"], "Ann");
    assert_eq!(r.body["assignee_id"], serde_json::Value::Null);

    // Filters: each shape answers exactly its conversations.
    let ids = |r: &Reply| r.items().iter().map(id_of).collect::<Vec<_>>();
    assert_eq!(ids(&app.get("/v1/conversations", &t.token).await), vec![c2, c1], "newest first");
    assert_eq!(ids(&app.get("/v1/conversations?status=open", &t.token).await), vec![c1]);
    assert_eq!(ids(&app.get("/v1/conversations?status=pending", &t.token).await), vec![c2]);
    assert_eq!(ids(&app.get(&format!("/v1/conversations?inbox_id={}", t.inbox), &t.token).await), vec![c1]);
    assert_eq!(
        ids(&app.get(&format!("/v1/conversations?inbox_id={}&status=pending", t.other_inbox), &t.token).await),
        vec![c2]
    );
    assert_eq!(ids(&app.get(&format!("/v1/conversations?assignee_id={}", t.agent), &t.token).await), vec![c2]);
    assert_eq!(
        ids(&app.get(&format!("/v1/conversations?assignee_id={}&status=open", t.agent), &t.token).await),
        Vec::<Uuid>::new()
    );
    assert_eq!(ids(&app.get("/v1/conversations?assignee_id=unassigned", &t.token).await), vec![c1]);
    assert_eq!(ids(&app.get("/v1/conversations?assignee_id=unassigned&status=open", &t.token).await), vec![c1]);

    // PATCH: status, assign, unassign; absent fields untouched.
    let r = app
        .patch(&format!("/v1/conversations/{c1}"), &t.token, json!({"status": "closed", "assignee_id": t.admin.0}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (r.body["status"].as_str(), r.body["assignee_id"].as_str()),
        (Some("closed"), Some(t.admin.0.to_string().as_str()))
    );
    let r = app.patch(&format!("/v1/conversations/{c1}"), &t.token, json!({"assignee_id": null})).await;
    assert_eq!((r.body["status"].as_str(), &r.body["assignee_id"]), (Some("closed"), &serde_json::Value::Null));
    let r = app.patch(&format!("/v1/conversations/{c1}"), &t.token, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"));

    // References to things that are not the tenant's: 422, naming the field.
    let r = app.post("/v1/conversations", &t.token, json!({"contact_id": ann, "inbox_id": Uuid::now_v7()})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.body["error"]["message"].as_str().unwrap_or("").contains("inbox_id"));
    let r = app.patch(&format!("/v1/conversations/{c1}"), &t.token, json!({"assignee_id": Uuid::now_v7()})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = app.post("/v1/conversations", &t.token, json!({"contact_id": Uuid::now_v7(), "inbox_id": t.inbox})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);

    // inbox_id and assignee_id together: no index serves it; refused clearly.
    let r = app.get(&format!("/v1/conversations?inbox_id={}&assignee_id=unassigned", t.inbox), &t.token).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
}

/// `GET /v1/conversations/counts` as `(all, mine, unassigned)` per status, open/pending/closed.
async fn counts(app: &TestApp, token: &str, query: &str) -> [(i64, i64, i64); 3] {
    let r = app.get(&format!("/v1/conversations/counts{query}"), token).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    ["open", "pending", "closed"].map(|s| {
        let n = |k: &str| r.body[s][k].as_i64().unwrap_or_else(|| panic!("{s}.{k} in {}", r.text));
        (n("all"), n("mine"), n("unassigned"))
    })
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn counts_follow_opens_changes_and_erasures(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let (_ann, bob, c1, _) = ann_and_bob(&app, &t).await;
    assert_eq!(counts(&app, &t.agent_token, "").await, [(1, 0, 1), (1, 1, 0), (0, 0, 0)]);
    // "mine" is the caller's: the admin holds none.
    assert_eq!(counts(&app, &t.token, "").await, [(1, 0, 1), (1, 0, 0), (0, 0, 0)]);
    assert_eq!(
        counts(&app, &t.agent_token, &format!("?inbox_id={}", t.inbox)).await,
        [(1, 0, 1), (0, 0, 0), (0, 0, 0)]
    );

    let r = app.patch(&format!("/v1/conversations/{c1}"), &t.token, json!({"assignee_id": t.agent.0})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(counts(&app, &t.agent_token, "").await, [(1, 1, 0), (1, 1, 0), (0, 0, 0)]);
    let r =
        app.patch(&format!("/v1/conversations/{c1}"), &t.token, json!({"status": "closed", "assignee_id": null})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(counts(&app, &t.agent_token, "").await, [(0, 0, 0), (1, 1, 0), (1, 0, 1)]);

    // An erasure request takes the contact's conversations out at once, as the list hides them.
    let r = app.call(reqwest::Method::DELETE, &format!("/v1/contacts/{bob}"), Some(&t.token), None).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(counts(&app, &t.agent_token, "").await, [(0, 0, 0), (0, 0, 0), (1, 0, 1)]);

    // Bad input gets the envelope.
    let r = app.get("/v1/conversations/counts?inbox_id=nope", &t.token).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{}", r.text);
    let r = app.get("/v1/conversations/counts?status=open", &t.token).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "an unknown filter: {}", r.text);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn messages_append_bump_the_inbox_and_paginate_both_ways(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let c1 = t.conversation(&app, ann).await;
    let c2 = t.conversation(&app, ann).await;
    assert_eq!(id_of(&app.get("/v1/conversations", &t.token).await.items()[0]), c2);

    let mut sent = Vec::new();
    for i in 0..7 {
        sent.push(t.message(&app, c1, &format!("message {i} {}", "x".repeat(200))).await);
    }
    // The older conversation moved to the top, with its preview and count.
    let r = app.get("/v1/conversations", &t.token).await;
    assert_eq!(id_of(&r.items()[0]), c1);
    assert_eq!(r.items()[0]["message_count"], 7);
    let preview = r.items()[0]["last_message_preview"].as_str().expect("preview");
    assert!(preview.starts_with("message 6 ") && preview.chars().count() == 140, "{preview}");

    let asc: Vec<Uuid> =
        walk(&app, &format!("/v1/conversations/{c1}/messages?limit=3"), &t.token).await.iter().map(id_of).collect();
    assert_eq!(asc, sent);
    let desc: Vec<Uuid> = walk(&app, &format!("/v1/conversations/{c1}/messages?limit=2&order=desc"), &t.token)
        .await
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(desc, sent.iter().rev().copied().collect::<Vec<_>>());
    let r = app.get(&format!("/v1/conversations/{c1}/messages?limit=1"), &t.token).await;
    assert_eq!(r.items()[0]["sender"], "agent");
    assert_eq!(r.items()[0]["author_id"].as_str(), Some(t.admin.0.to_string().as_str()));

    let r = app.get(&format!("/v1/conversations/{}/messages", Uuid::now_v7()), &t.token).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"));
    let r = app.post(&format!("/v1/conversations/{c1}/messages"), &t.token, json!({"body": "   "})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = app.post(&format!("/v1/conversations/{c1}/messages"), &t.token, json!({"body": "y".repeat(10_001)})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn an_idempotency_key_never_writes_twice(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let c = t.conversation(&app, ann).await;
    let path = format!("/v1/conversations/{c}/messages");
    let post = |key: &'static str, body: &'static str| {
        app.http.post(app.url(&path)).bearer_auth(&t.token).header("idempotency-key", key).json(&json!({"body": body}))
    };

    let first = app.send(post("k-1", "hello")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.headers.contains_key("idempotent-replayed"));
    let again = app.send(post("k-1", "hello")).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body, "a retry returns the first result");

    let other = app.send(post("k-1", "a different body")).await;
    assert_eq!((other.status, other.code()), (StatusCode::CONFLICT, "conflict"));

    // Ten concurrent retries of one new key: one message.
    let replies = futures_util::future::join_all((0..10).map(|_| app.send(post("k-2", "burst")))).await;
    let ids: HashSet<Uuid> = replies
        .iter()
        .map(|r| {
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
            id_of(&r.body)
        })
        .collect();
    assert_eq!(ids.len(), 1, "concurrent retries created {} messages", ids.len());

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM messages").fetch_one(&pool).await.expect("count");
    assert_eq!(count, 2);
    let r = app.get(&format!("/v1/conversations/{c}"), &t.token).await;
    assert_eq!(r.body["message_count"], 2);

    let bad = app
        .send(
            app.http
                .post(app.url(&path))
                .bearer_auth(&t.token)
                .header("idempotency-key", "")
                .json(&json!({"body": "x"})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_replay_after_the_contacts_erasure_was_requested_is_a_404(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let c = t.conversation(&app, ann).await;
    let path = format!("/v1/conversations/{c}/messages");
    let post = || {
        app.http.post(app.url(&path)).bearer_auth(&t.token).header("idempotency-key", "k").json(&json!({"body": "hi"}))
    };
    assert_eq!(app.send(post()).await.status, StatusCode::CREATED);
    assert_eq!(app.send(post()).await.headers["idempotent-replayed"], "true");
    let erased = app.delete(&format!("/v1/contacts/{ann}"), &t.token).await;
    assert_eq!(erased.status, StatusCode::ACCEPTED, "{}", erased.text);
    // The erasure is requested, its job not yet run: the message still exists, and the replay
    // must not return it.
    let replay = app.send(post()).await;
    assert_eq!((replay.status, replay.code()), (StatusCode::NOT_FOUND, "not_found"), "{}", replay.text);
    assert!(!replay.text.contains("hi\""), "{}", replay.text);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn walking_the_inbox_while_messages_arrive_sees_each_conversation_at_most_once(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let contact = t.contact(&app, "Ann", "ann@example.com").await;
    let mut all = Vec::new();
    for _ in 0..40 {
        all.push(t.conversation(&app, contact).await);
    }
    // Walk page by page; between pages, new messages bump some conversations to the top.
    let mut seen = Vec::new();
    let mut bumped = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut round = 0usize;
    loop {
        let url = match &cursor {
            Some(c) => format!("/v1/conversations?limit=7&cursor={c}"),
            None => "/v1/conversations?limit=7".to_owned(),
        };
        let r = app.get(&url, &t.token).await;
        seen.extend(r.items().iter().map(id_of));
        // Bump one already seen and one not yet seen.
        for pick in [all[round % all.len()], all[(round * 7 + 3) % all.len()]] {
            t.message(&app, pick, "bump").await;
            bumped.insert(pick);
        }
        round += 1;
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let unique: HashSet<Uuid> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a conversation appeared twice in one walk");
    for id in &all {
        if !bumped.contains(id) {
            assert!(unique.contains(id), "{id} did not change during the walk but was skipped");
        }
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn contacts_list_with_activity_search_and_pages(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let names = ["zoe", "Adam", "adele", "Bert", "Ümit", "100% real", "under_score", "Carla", "cara"];
    let mut ids = Vec::new();
    for (i, n) in names.iter().enumerate() {
        ids.push(t.contact(&app, n, &format!("{}{i}@example.com", n.to_lowercase().replace([' ', '%'], ""))).await);
    }
    let adam = ids[1];
    let c = t.conversation(&app, adam).await;
    t.conversation(&app, adam).await;
    t.message(&app, c, "hi").await;

    let all = walk(&app, "/v1/contacts?limit=2", &t.token).await;
    let listed: Vec<&str> = all.iter().map(|c| c["name"].as_str().unwrap_or("")).collect();
    let mut expected: Vec<&str> = names.to_vec();
    expected.sort_by_key(|n| n.to_lowercase());
    assert_eq!(listed, expected, "by lower(name), bytewise");
    let adam_row = all.iter().find(|c| id_of(c) == adam).expect("adam");
    assert_eq!(adam_row["conversation_count"], 2);
    assert!(adam_row["last_activity_at"].is_string());
    let zoe_row = all.iter().find(|c| c["name"] == "zoe").expect("zoe");
    assert_eq!(
        (zoe_row["conversation_count"].as_i64(), &zoe_row["last_activity_at"]),
        (Some(0), &serde_json::Value::Null)
    );

    let names_of =
        |v: Vec<serde_json::Value>| v.iter().map(|c| c["name"].as_str().unwrap_or("").to_owned()).collect::<Vec<_>>();
    assert_eq!(names_of(walk(&app, "/v1/contacts?name=AD&limit=1", &t.token).await), vec!["Adam", "adele"]);
    assert_eq!(names_of(walk(&app, "/v1/contacts?name=car", &t.token).await), vec!["cara", "Carla"]);
    // LIKE metacharacters match literally.
    assert_eq!(names_of(walk(&app, "/v1/contacts?name=100%25", &t.token).await), vec!["100% real"]);
    assert_eq!(names_of(walk(&app, "/v1/contacts?name=under_", &t.token).await), vec!["under_score"]);
    assert_eq!(names_of(walk(&app, "/v1/contacts?name=_", &t.token).await), Vec::<String>::new());
    assert_eq!(names_of(walk(&app, "/v1/contacts?email=BERT", &t.token).await), vec!["Bert"]);

    let r = app.get(&format!("/v1/contacts/{adam}"), &t.token).await;
    assert_eq!((r.status, r.body["conversation_count"].as_i64()), (StatusCode::OK, Some(2)));
    let r = app.get("/v1/contacts?name=a&email=b", &t.token).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = app.post("/v1/contacts", &t.token, json!({"name": ""})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = app.post("/v1/contacts", &t.token, json!({"name": "x", "email": "not-an-email"})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    // A time cursor on a name-sorted list is refused, not misread.
    let conv_cursor = {
        t.conversation(&app, adam).await;
        let r = app.get("/v1/conversations?limit=1", &t.token).await;
        r.body["next_cursor"].as_str().expect("more").to_owned()
    };
    let r = app.get(&format!("/v1/contacts?cursor={conv_cursor}"), &t.token).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn erasure_hides_at_once_and_the_worker_deletes_everything(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    let t = tenant(&pool, "Acme").await;
    let ann = t.contact(&app, "Ann", "ann@example.com").await;
    let keep = t.contact(&app, "Keep", "keep@example.com").await;
    let mut convs = Vec::new();
    for _ in 0..3 {
        let c = t.conversation(&app, ann).await;
        for i in 0..5 {
            t.message(&app, c, &format!("m{i}")).await;
        }
        convs.push(c);
    }
    let kept_conv = t.conversation(&app, keep).await;
    t.message(&app, kept_conv, "stays").await;

    let r = app.delete(&format!("/v1/contacts/{ann}"), &t.token).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let job: Uuid = r.body["job_id"].as_str().and_then(|s| s.parse().ok()).expect("job id");

    // From this moment: 404 everywhere, and gone from every list.
    assert_eq!(app.get(&format!("/v1/contacts/{ann}"), &t.token).await.status, StatusCode::NOT_FOUND);
    for c in &convs {
        assert_eq!(app.get(&format!("/v1/conversations/{c}"), &t.token).await.status, StatusCode::NOT_FOUND);
        assert_eq!(app.get(&format!("/v1/conversations/{c}/messages"), &t.token).await.status, StatusCode::NOT_FOUND);
        let r = app.post(&format!("/v1/conversations/{c}/messages"), &t.token, json!({"body": "late"})).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        let r = app.patch(&format!("/v1/conversations/{c}"), &t.token, json!({"status": "closed"})).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
    }
    let listed: Vec<Uuid> = walk(&app, "/v1/conversations", &t.token).await.iter().map(id_of).collect();
    assert_eq!(listed, vec![kept_conv]);
    let listed: Vec<Uuid> = walk(&app, "/v1/contacts", &t.token).await.iter().map(id_of).collect();
    assert_eq!(listed, vec![keep]);
    let r = app.post("/v1/conversations", &t.token, json!({"contact_id": ann, "inbox_id": t.inbox})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.delete(&format!("/v1/contacts/{ann}"), &t.token).await.status, StatusCode::NOT_FOUND);

    // The worker deletes the rows; the other contact's stay.
    let worker = breakwater_worker::Worker::new(pool.clone(), breakwater_worker::WorkerOptions::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let state: String = sqlx::query_scalar("SELECT state::text FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .expect("job");
        if state == "completed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the erasure job is still {state}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    stop.cancel();
    running.await.expect("task").expect("worker stops cleanly");
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM contacts), (SELECT count(*) FROM conversations), (SELECT count(*) FROM messages)",
    )
    .fetch_one(&pool)
    .await
    .expect("counts");
    assert_eq!(counts, (1, 1, 1));
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_public_listener_serves_no_internal_path_and_the_ops_listener_serves_them(pool: PgPool) {
    let app = spawn(pool.clone()).await;
    assert_ne!(app.running.addr.port(), app.running.ops_addr.port());
    for path in ["/ready", "/metrics", "/v1/ops/status"] {
        let public = app.call(reqwest::Method::GET, path, None, None).await;
        assert_eq!(
            (public.status, public.code()),
            (StatusCode::NOT_FOUND, "not_found"),
            "{path} is public: {}",
            public.text
        );
        assert_eq!(app.ops(path).await.status, StatusCode::OK, "{path} on the ops listener");
    }
    // Liveness is on both; the API's description is public only.
    assert_eq!(app.call(reqwest::Method::GET, "/health", None, None).await.status, StatusCode::OK);
    assert_eq!(app.ops("/health").await.status, StatusCode::OK);
    assert_eq!(app.call(reqwest::Method::GET, "/openapi.json", None, None).await.status, StatusCode::OK);
    assert_eq!(app.ops("/openapi.json").await.status, StatusCode::NOT_FOUND);
}
