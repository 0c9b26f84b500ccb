//! `GET /v1/stream`, the live inbox: each change arrives once, as it commits, on its own
//! tenant's streams only; a client that reconnects with `Last-Event-ID` misses nothing, nor
//! does one whose task's listener was cut off; the caps refuse with `Retry-After`; a stream
//! holds no admission slot; an idle stream has heartbeats; shutdown ends streams with a
//! `retry:` hint.

mod common;

use std::time::Duration;

use breakwater_domain::stream;
use common::sse::{self, Frame};
use common::{Tenant, TestApp, spawn_with, tenant};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(10);

/// An app with the throttles out of the way (the tests write in bursts) and `extra` over it.
async fn app(pool: &PgPool, extra: &[&str]) -> TestApp {
    let mut args = common::WITHOUT_USER_AND_TENANT_THROTTLES.to_vec();
    args.extend_from_slice(extra);
    spawn_with(pool.clone(), &args).await
}

/// Opens a stream and waits for its opening `retry:` hint, so the subscription is in place.
async fn open(app: &TestApp, path: &str, token: &str, last: Option<&str>) -> sse::Stream {
    let mut s = sse::open(app, path, token, last).await;
    assert_eq!(s.status, StatusCode::OK, "{path}: {}", s.text);
    assert_eq!(s.headers["content-type"], "text/event-stream");
    let hint = s.next_frame(WAIT).await.expect("the opening hint");
    let retry = hint.retry_ms.expect("the first frame is a retry: hint");
    assert!((2_000..4_000).contains(&retry), "a jittered reconnect delay: {retry}");
    s
}

/// Waits until the sequencer has numbered the tenant's events through `id` (it polls every
/// 10 ms; a write's event is numbered a moment after its commit).
async fn numbered_through(pool: &PgPool, t: &Tenant, id: i64) {
    let started = std::time::Instant::now();
    while stream::head(pool, t.id).await.expect("head").last_id < id {
        assert!(started.elapsed() < WAIT, "the sequencer did not number event {id}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn kinds(frames: &[Frame]) -> Vec<&str> {
    frames.iter().map(|f| f.event.as_deref().unwrap_or("")).collect()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_stream_carries_each_change_of_its_tenant_as_it_commits(pool: PgPool) {
    let app = app(&pool, &[]).await;
    let t = tenant(&pool, "Acme").await;
    let mut s = open(&app, "/v1/stream", &t.agent_token, None).await;

    let contact = t.contact(&app, "Cleo", "cleo@example.com").await;
    let conversation = t.conversation(&app, contact).await;
    let r = app
        .patch(
            &format!("/v1/conversations/{conversation}"),
            &t.token,
            json!({"assignee_id": t.agent, "status": "pending"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let message = t.message(&app, conversation, &"words ".repeat(100)).await;
    let mut events = s.events_until(WAIT, |f| f.event.as_deref() == Some("message.created")).await;
    // (Erased before the sequencer numbered them, a contact's events would never be sent: an
    // erasure takes its events with it, numbered or not.)
    assert_eq!(app.delete(&format!("/v1/contacts/{contact}"), &t.token).await.status, StatusCode::ACCEPTED);
    events.extend(s.events_until(WAIT, |f| f.event.as_deref() == Some("contact.erased")).await);
    assert_eq!(kinds(&events), ["conversation.created", "conversation.updated", "message.created", "contact.erased"]);
    let ids: Vec<i64> = events.iter().map(Frame::number).collect();
    assert_eq!(ids, [1, 2, 3, 4], "the tenant's sequence");
    for e in &events {
        let data = e.json();
        assert_eq!(data["id"], e.number(), "{data}");
        assert_eq!(data["type"], e.event.as_deref().unwrap_or(""), "{data}");
        assert_eq!(data["contact_id"], contact.to_string(), "{data}");
    }
    let created = events[0].json();
    assert_eq!(
        (created["conversation_id"].as_str(), created["status"].as_str()),
        (Some(&*conversation.to_string()), Some("open"))
    );
    assert_eq!(created["assignee_id"], serde_json::Value::Null);
    let updated = events[1].json();
    assert_eq!(updated["status"], "pending");
    assert_eq!(updated["assignee_id"], t.agent.0.to_string());
    assert_eq!(updated["previous"], json!({"status": "open", "assignee_id": null}));
    let posted = events[2].json();
    assert_eq!(posted["message"]["id"], message.to_string());
    let preview = posted["message"]["preview"].as_str().expect("a preview");
    assert_eq!(preview.chars().count(), breakwater_domain::messages::PREVIEW_CHARS, "a preview, not the body");
    let erased = events[3].json();
    assert!(erased.get("conversation_id").is_none() && erased.get("message").is_none(), "{erased}");

    let status = app.ops("/v1/ops/status").await;
    let streams = &status.body["layers"]["streams"];
    assert_eq!(streams["open"], 1, "{streams}");
    assert_eq!(streams["listener_connected"], true, "{streams}");
    drop(s);
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn two_tenants_writing_at_once_never_see_each_others_events(pool: PgPool) {
    let app = app(&pool, &[]).await;
    let (a, b) = (tenant(&pool, "A").await, tenant(&pool, "B").await);
    let mut streams = Vec::new();
    for (t, other) in [(&a, &b), (&b, &a)] {
        // The unfiltered stream, and ones whose filters name the other tenant's rows.
        let paths = [
            "/v1/stream".to_owned(),
            format!("/v1/stream?inbox_id={}", other.inbox),
            format!("/v1/stream?assignee_id={}", other.agent),
        ];
        let mut own = Vec::new();
        for p in paths {
            own.push(open(&app, &p, &t.agent_token, None).await);
        }
        streams.push(own);
    }
    const EACH: usize = 15;
    async fn write(app: &TestApp, t: &Tenant) -> Vec<Uuid> {
        let contact = t.contact(app, "C", "c@example.com").await;
        let mut conversations = Vec::new();
        for n in 0..EACH {
            let c = t.conversation(app, contact).await;
            t.message(app, c, &format!("message {n}")).await;
            conversations.push(c);
        }
        conversations
    }
    let (a_conversations, b_conversations) = tokio::join!(write(&app, &a), write(&app, &b));
    let expected = [(&a_conversations, &b_conversations, b.id.0), (&b_conversations, &a_conversations, a.id.0)];
    for (own, (mine, theirs, other_tenant)) in streams.iter_mut().zip(expected) {
        let whole = &mut own[0];
        let events = whole.events_until(WAIT, |f| f.number() == 2 * EACH as i64).await;
        assert_eq!(events.len(), 2 * EACH, "every event of its own, once");
        for e in &events {
            let c: Uuid = e.json()["conversation_id"].as_str().and_then(|s| s.parse().ok()).expect("a conversation");
            assert!(mine.contains(&c) && !theirs.contains(&c), "{e:?}");
        }
        for foreign in &mut own[1..] {
            assert!(
                foreign.next_event(Duration::from_millis(500)).await.is_none(),
                "a filter naming another tenant's rows"
            );
        }
        assert!(!own.iter().any(|s| s.text.contains(&other_tenant.to_string())));
        assert!(!own.iter().any(|s| theirs.iter().any(|c| s.text.contains(&c.to_string()))));
    }
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_client_that_resumes_with_last_event_id_misses_nothing(pool: PgPool) {
    let app = app(&pool, &["--stream-replay-max", "20"]).await;
    let t = tenant(&pool, "Acme").await;
    let contact = t.contact(&app, "Cleo", "cleo@example.com").await;
    let conversation = t.conversation(&app, contact).await;
    let mut s = open(&app, "/v1/stream", &t.agent_token, None).await;
    t.message(&app, conversation, "one").await;
    // (The conversation's event, written before the stream opened, may come first: a stream
    // gets every event numbered after it opened, and the sequencer may number it a moment late.)
    let seen = s.events_until(WAIT, |f| f.event.as_deref() == Some("message.created")).await;
    assert_eq!(seen.last().map(Frame::number), Some(2));
    drop(s);
    // Written while the client is away.
    for body in ["two", "three", "four"] {
        t.message(&app, conversation, body).await;
    }
    let mut again = open(&app, "/v1/stream", &t.agent_token, Some("2")).await;
    let replayed = again.events_until(WAIT, |f| f.number() == 5).await;
    let previews: Vec<String> =
        replayed.iter().map(|f| f.json()["message"]["preview"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(previews, ["two", "three", "four"]);
    // Then live, with no repeat of what was replayed.
    t.message(&app, conversation, "five").await;
    let live = again.next_event(WAIT).await.expect("live after the replay");
    assert_eq!((live.number(), live.json()["message"]["preview"].as_str()), (6, Some("five")));

    // Bad ids get the envelope: malformed, and from the future.
    for bad in ["abc", "-1", "7"] {
        let r = sse::open(&app, "/v1/stream", &t.agent_token, Some(bad)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "Last-Event-ID {bad}");
        let body = r.res_text().await;
        assert!(body.contains(r#""code":"invalid_request""#), "{body}");
    }
    // Further behind than the replay cap: resync, carrying the newest id, then live.
    for n in 0..25 {
        t.message(&app, conversation, &format!("more {n}")).await;
    }
    numbered_through(&pool, &t, 31).await;
    let mut behind = open(&app, "/v1/stream", &t.agent_token, Some("6")).await;
    let resync = behind.next_event(WAIT).await.expect("resync");
    assert_eq!((resync.event.as_deref(), resync.number()), (Some("resync"), 31));
    assert_eq!(resync.json(), json!({"reason": "behind"}));
    // Past the retention: resync too.
    stream::prune(&pool, 3600.0, 5, 100).await.expect("prunes");
    let mut pruned = open(&app, "/v1/stream", &t.agent_token, Some("25")).await;
    assert_eq!(pruned.next_event(WAIT).await.and_then(|f| f.event), Some("resync".into()));
    let mut kept = open(&app, "/v1/stream", &t.agent_token, Some("28")).await;
    let rest = kept.events_until(WAIT, |f| f.number() == 31).await;
    assert_eq!(rest.iter().map(Frame::number).collect::<Vec<_>>(), [29, 30, 31]);
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn a_listener_cut_off_from_the_database_loses_no_event(pool: PgPool) {
    let app = app(&pool, &[]).await;
    let t = tenant(&pool, "Acme").await;
    let contact = t.contact(&app, "Cleo", "cleo@example.com").await;
    let conversation = t.conversation(&app, contact).await;
    let mut s = open(&app, "/v1/stream", &t.agent_token, None).await;
    t.message(&app, conversation, "before").await;
    let seen = s.events_until(WAIT, |f| f.event.as_deref() == Some("message.created")).await;
    assert_eq!(seen.last().map(Frame::number), Some(2));

    for round in 0..3 {
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(breakwater_api::stream::listener::APPLICATION_NAME)
        .fetch_one(&pool)
        .await
        .expect("terminates");
        assert!(killed >= 1 || round > 0, "the listener's connection was found");
        // Written while the listener may be down: notifications sent now reach nobody.
        for n in 0..5 {
            t.message(&app, conversation, &format!("round {round} message {n}")).await;
        }
    }
    let events = s.events_until(WAIT, |f| f.number() == 17).await;
    assert_eq!(events.iter().map(Frame::number).collect::<Vec<_>>(), (3..=17).collect::<Vec<_>>());
    let status = app.ops("/v1/ops/status").await;
    let connects = status.body["layers"]["streams"]["listener_connects"].as_u64().expect("a count");
    assert!(connects >= 2, "it reconnected: {}", status.body["layers"]["streams"]);
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn past_the_caps_streams_are_refused_with_a_jittered_retry_after(pool: PgPool) {
    let app = app(&pool, &["--stream-max", "2", "--stream-max-per-tenant", "1"]).await;
    let (a, b, c) = (tenant(&pool, "A").await, tenant(&pool, "B").await, tenant(&pool, "C").await);
    let _first = open(&app, "/v1/stream", &a.agent_token, None).await;
    let refused = sse::open(&app, "/v1/stream", &a.token, None).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers["retry-after"].to_str().ok().and_then(|s| s.parse().ok()).expect("Retry-After");
    assert!((1..=4).contains(&retry), "{retry}");
    assert!(refused.res_text().await.contains(r#""code":"stream_limit""#));
    let _second = open(&app, "/v1/stream", &b.agent_token, None).await;
    let full = sse::open(&app, "/v1/stream", &c.agent_token, None).await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(full.headers.contains_key("retry-after"));
    assert!(full.res_text().await.contains(r#""code":"streams_full""#));
    let status = app.ops("/v1/ops/status").await;
    let streams = &status.body["layers"]["streams"];
    assert_eq!((streams["open"].as_u64(), streams["tenant_highest"].as_u64()), (Some(2), Some(1)), "{streams}");
    assert_eq!((streams["refused_tenant"].as_u64(), streams["refused_task"].as_u64()), (Some(1), Some(1)));
    // Bad filters are refused before anything is held.
    for bad in ["?assignee_id=nobody", "?status=gone", "?colour=blue"] {
        let r = app.get(&format!("/v1/stream{bad}"), &c.agent_token).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.text);
    }
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn open_streams_hold_no_admission_slot(pool: PgPool) {
    // One request at a time, and a queue of none: a stream that held its slot would refuse
    // every request after it.
    let app = app(&pool, &["--admission", "static", "--admission-static-limit", "1", "--admission-queue", "0"]).await;
    let t = tenant(&pool, "Acme").await;
    let mut open_streams = Vec::new();
    for _ in 0..4 {
        open_streams.push(open(&app, "/v1/stream", &t.agent_token, None).await);
    }
    for _ in 0..3 {
        let r = app.get("/v1/conversations", &t.agent_token).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["streams"]["open"], 4);
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn an_idle_stream_has_heartbeats_outlives_the_keep_alive_timeout_and_ends_at_shutdown_with_a_retry_hint(
    pool: PgPool,
) {
    // A keep-alive timeout of 3 s: a stream is a response in progress, not an idle connection,
    // so it outlives it.
    let app = app(
        &pool,
        &[
            "--stream-heartbeat-secs",
            "1",
            "--stream-retry-ms",
            "500",
            "--keep-alive-timeout-secs",
            "3",
            "--request-timeout-secs",
            "2",
        ],
    )
    .await;
    let t = tenant(&pool, "Acme").await;
    let mut s = sse::open(&app, "/v1/stream", &t.agent_token, None).await;
    assert_eq!(s.status, StatusCode::OK);
    let hint = s.next_frame(WAIT).await.expect("the opening hint");
    assert!(hint.retry_ms.is_some_and(|ms| (500..1000).contains(&ms)), "{hint:?}");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let beat = s.next_frame(Duration::from_millis(2_500)).await.expect("a heartbeat within two intervals");
        assert!(beat.comment.is_some() && !beat.is_event(), "{beat:?}");
    }

    let stopping = tokio::spawn(async move { app.running.shutdown(Duration::ZERO).await });
    assert!(s.ends_within(WAIT).await, "the stream ends at shutdown");
    let last = s.seen.last().expect("a last frame");
    assert!(last.retry_ms.is_some_and(|ms| (500..1000).contains(&ms)), "a jittered retry: hint: {:?}", s.seen);
    stopping.await.expect("joins").expect("shuts down");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn no_stream_opens_before_the_listener_has_connected(pool: PgPool) {
    // A listener that cannot connect (nothing listens on port 1): the task serves everything but
    // streams, which it refuses rather than open one that could miss events.
    let app = app(&pool, &["--stream-database-url", "postgres://postgres@127.0.0.1:1/nowhere"]).await;
    let t = tenant(&pool, "Acme").await;
    let r = sse::open(&app, "/v1/stream", &t.agent_token, None).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers.contains_key("retry-after"));
    assert!(r.res_text().await.contains(r#""code":"streams_full""#));
    assert_eq!(app.get("/v1/conversations", &t.agent_token).await.status, StatusCode::OK);
    let status = app.ops("/v1/ops/status").await;
    assert_eq!(status.body["layers"]["streams"]["listener_connected"], false);
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}
