//! Tenant isolation, swept over the OpenAPI document: for every operation the API publishes,
//! tenant A's token on tenant B's ids answers exactly what an unknown id answers (404, the same
//! envelope, no data), in the same timing class, and changes nothing of B's. A new operation
//! without an entry in [`coverage`] fails the sweep, so no route ships unswept.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use breakwater_api::openapi::ApiDoc;
use common::{Reply, Tenant, TestApp, spawn_with, tenant};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use utoipa::OpenApi as _;
use uuid::Uuid;

/// Every row of `tenant` in every table with a `tenant_id` column (found in the catalog, so a
/// new tenant-owned table is covered without touching this test), plus its `tenants` row.
async fn snapshot(pool: &PgPool, tenant: Uuid) -> Value {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.columns
         WHERE table_schema = 'public' AND column_name = 'tenant_id' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("catalog");
    assert!(tables.len() >= 6, "expected the tenant-owned tables, found {tables:?}");
    let mut out = serde_json::Map::new();
    for table in tables.iter().map(String::as_str).chain(["tenants"]) {
        let column = if table == "tenants" { "id" } else { "tenant_id" };
        let sql = format!(
            "SELECT coalesce(json_agg(t ORDER BY t::text), '[]'::json) FROM \"{table}\" t WHERE t.{column} = $1"
        );
        let rows: Value = sqlx::query_scalar(&sql).bind(tenant).fetch_one(pool).await.expect("snapshot");
        out.insert(table.to_owned(), rows);
    }
    Value::Object(out)
}

/// The operations of the document, as `METHOD /path/{template}`.
fn documented_operations() -> BTreeSet<String> {
    let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in ["get", "put", "post", "patch", "delete", "head", "options", "trace"] {
            if item.get(method).is_some() {
                ops.insert(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    ops
}

/// The kind of row a path's `{id}` names.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Conversation,
    Contact,
}

/// How one operation is swept.
#[derive(Debug)]
enum Sweep {
    /// The path's `{id}` names a row. With B's id and with an unknown id it must answer the
    /// not-found envelope; with A's own id and the same body it must answer `ok` (so the 404
    /// comes from the tenant filter, not from a bad body).
    ById { kind: Kind, body: Option<Value>, ok: StatusCode },
    /// A list: with each query (B's ids in filters, B's cursors) A's token reads none of B's rows.
    List { queries: Vec<String> },
    /// Counts: with each query naming B's rows, A's token gets exactly what an unknown id in
    /// the same place gets; and each tenant's unfiltered counts are its own conversations.
    Counts { foreign: Vec<String> },
    /// A create: each body naming B's rows is refused with 422; `own` (A's rows only) succeeds.
    Create { foreign: Vec<Value>, own: Value },
    /// The live stream: opened by A with each query (B's ids in filters) and each
    /// `Last-Event-ID` (B's newest), it carries A's own events and nothing of B's. (Both tenants
    /// writing at once is `tests/stream.rs`'s.)
    Stream { queries: Vec<String>, last_event_ids: Vec<String> },
    /// No tenant data at all: answers 200 and nothing of B's.
    TenantNeutral,
}

/// The sweep of every documented operation. Adding an operation to the document without adding
/// it here fails the test (the swept set must equal the documented set).
fn coverage(op: &str, a: &World, b: &World) -> Option<Sweep> {
    let sweep = match op {
        "GET /v1/conversations/{id}" => Sweep::ById { kind: Kind::Conversation, body: None, ok: StatusCode::OK },
        "PATCH /v1/conversations/{id}" => {
            Sweep::ById { kind: Kind::Conversation, body: Some(json!({"status": "closed"})), ok: StatusCode::OK }
        }
        "GET /v1/conversations/{id}/messages" => {
            Sweep::ById { kind: Kind::Conversation, body: None, ok: StatusCode::OK }
        }
        "POST /v1/conversations/{id}/messages" => Sweep::ById {
            kind: Kind::Conversation,
            body: Some(json!({"body": "injected by A"})),
            ok: StatusCode::CREATED,
        },
        "GET /v1/contacts/{id}" => Sweep::ById { kind: Kind::Contact, body: None, ok: StatusCode::OK },
        "DELETE /v1/contacts/{id}" => Sweep::ById { kind: Kind::Contact, body: None, ok: StatusCode::ACCEPTED },
        "GET /v1/conversations" => Sweep::List {
            queries: vec![
                String::new(),
                "?status=open".into(),
                format!("?inbox_id={}", b.t.inbox),
                format!("?inbox_id={}", b.t.other_inbox),
                format!("?assignee_id={}", b.t.agent),
                format!("?assignee_id={}", b.t.admin),
                format!("?cursor={}", b.conversation_cursor),
            ],
        },
        "GET /v1/conversations/counts" => Sweep::Counts {
            foreign: vec![format!("?inbox_id={}", b.t.inbox), format!("?inbox_id={}", b.t.other_inbox)],
        },
        "GET /v1/contacts" => Sweep::List {
            queries: vec![
                String::new(),
                "?name=Be".into(),
                "?email=bea".into(),
                "?email=b".into(),
                format!("?cursor={}", b.contact_cursor),
            ],
        },
        "POST /v1/conversations" => Sweep::Create {
            foreign: vec![
                json!({"contact_id": b.contacts[0], "inbox_id": a.t.inbox}),
                json!({"contact_id": a.contacts[0], "inbox_id": b.t.inbox}),
                json!({"contact_id": a.contacts[0], "inbox_id": a.t.inbox, "assignee_id": b.t.agent}),
                json!({"contact_id": b.contacts[0], "inbox_id": b.t.inbox}),
            ],
            own: json!({"contact_id": a.contacts[0], "inbox_id": a.t.inbox}),
        },
        "POST /v1/contacts" => Sweep::Create { foreign: vec![], own: json!({"name": "Ana", "email": "ana@a.example"}) },
        "GET /v1/stream" => Sweep::Stream {
            queries: vec![
                String::new(),
                format!("?inbox_id={}", b.t.inbox),
                format!("?assignee_id={}", b.t.agent),
                "?status=open".into(),
            ],
            last_event_ids: vec!["1".into(), b.last_event_id.clone()],
        },
        "GET /health" => Sweep::TenantNeutral,
        _ => return None,
    };
    Some(sweep)
}

/// A tenant with two contacts, two conversations and two messages in each.
struct World {
    t: Tenant,
    contacts: Vec<Uuid>,
    conversations: Vec<Uuid>,
    messages: Vec<Uuid>,
    /// A `next_cursor` of this tenant's inbox and contacts lists.
    conversation_cursor: String,
    contact_cursor: String,
    /// Strings only this tenant's rows hold.
    secrets: Vec<String>,
    /// The id of this tenant's newest stream event.
    last_event_id: String,
}

impl World {
    async fn build(app: &TestApp, pool: &PgPool, name: &str, initial: char) -> Self {
        let t = tenant(pool, name).await;
        let lower = initial.to_ascii_lowercase();
        let mut secrets = Vec::new();
        let mut contacts = Vec::new();
        let mut conversations = Vec::new();
        let mut messages = Vec::new();
        for n in 0..2 {
            let cname = format!("{initial}ea{n}");
            let email = format!("{lower}ea{n}@{lower}.example");
            let c = t.contact(app, &cname, &email).await;
            let conv = t.conversation(app, c).await;
            for m in 0..2 {
                let body = format!("{name} secret {n}.{m} {}", Uuid::now_v7());
                messages.push(t.message(app, conv, &body).await);
                secrets.push(body);
            }
            secrets.extend([cname, email]);
            contacts.push(c);
            conversations.push(conv);
        }
        let cursor = |r: Reply| r.body["next_cursor"].as_str().expect("a second page").to_owned();
        let conversation_cursor = cursor(app.get("/v1/conversations?limit=1", &t.token).await);
        let contact_cursor = cursor(app.get("/v1/contacts?limit=1", &t.token).await);
        let head = breakwater_domain::stream::head(pool, t.id).await.expect("the stream's head");
        let last_event_id = head.last_id.to_string();
        Self { t, contacts, conversations, messages, conversation_cursor, contact_cursor, secrets, last_event_id }
    }

    /// Every id of this tenant: its own, its users', inboxes' and rows'.
    fn ids(&self) -> Vec<Uuid> {
        let t = &self.t;
        let mut ids = vec![t.id.0, t.admin.0, t.agent.0, t.inbox, t.other_inbox];
        ids.extend(self.contacts.iter().chain(&self.conversations).chain(&self.messages).copied());
        ids
    }
}

fn not_found_envelope() -> Value {
    json!({"error": {"type": "not_found", "code": "not_found", "message": "not found", "recovery": {"retryable": false}}})
}

fn path_with(template: &str, id: Uuid) -> String {
    assert!(template.contains("{id}"), "{template}");
    template.replace("{id}", &id.to_string())
}

fn split(op: &str) -> (Method, &str) {
    let (method, path) = op.split_once(' ').expect("METHOD path");
    (method.parse().expect("a method"), path)
}

/// Fails when a response to A holds any id or text of B's.
fn assert_no_trace_of(b: &World, what: &str, r: &Reply) {
    assert_text_has_no_trace_of(b, what, &r.text);
}

fn assert_text_has_no_trace_of(b: &World, what: &str, text: &str) {
    for id in b.ids() {
        assert!(!text.contains(&id.to_string()), "{what}: B's id {id} leaked: {text}");
    }
    for s in &b.secrets {
        assert!(!text.contains(s.as_str()), "{what}: B's data {s:?} leaked: {text}");
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_documented_operation_keeps_tenants_apart(pool: PgPool) {
    // The timing rounds send a few hundred requests from one user: keep the throttles out of the way.
    let app = spawn_with(pool.clone(), &common::WITHOUT_USER_AND_TENANT_THROTTLES).await;
    let a = World::build(&app, &pool, "Tenant A", 'A').await;
    let b = World::build(&app, &pool, "Tenant B", 'B').await;
    // Rows of A's that the control calls may change or erase, apart from the ones probes read.
    let a_spare_contact = a.t.contact(&app, "Aspare", "spare@a.example").await;
    let before = snapshot(&pool, b.t.id.0).await;

    let documented = documented_operations();
    let covered: BTreeSet<String> = documented.iter().filter(|op| coverage(op, &a, &b).is_some()).cloned().collect();
    let missing: Vec<_> = documented.difference(&covered).collect();
    assert!(missing.is_empty(), "operations in the OpenAPI document with no isolation sweep: {missing:?}");

    let mut swept = BTreeSet::new();
    let mut by_id_ops = Vec::new();
    for op in &documented {
        let (method, template) = split(op);
        let sweep = coverage(op, &a, &b).expect("covered");
        match &sweep {
            Sweep::ById { kind, body, .. } => {
                let b_id = match kind {
                    Kind::Conversation => b.conversations[0],
                    Kind::Contact => b.contacts[0],
                };
                for (label, id) in [("B's id", b_id), ("an unknown id", Uuid::now_v7())] {
                    let path = path_with(template, id);
                    let r = app.call(method.clone(), &path, Some(&a.t.token), body.clone()).await;
                    assert_eq!(r.status, StatusCode::NOT_FOUND, "{op} with {label}: {}", r.text);
                    assert_eq!(r.body, not_found_envelope(), "{op} with {label}: not the not-found envelope");
                    assert_no_trace_of(&b, op, &r);
                }
                by_id_ops.push((op.clone(), *kind, body.clone()));
            }
            Sweep::List { queries } => {
                for q in queries {
                    let items = common::walk(&app, &format!("{template}{q}"), &a.t.token).await;
                    let page = app.get(&format!("{template}{q}"), &a.t.token).await;
                    assert_no_trace_of(&b, &format!("{op}{q}"), &page);
                    for item in &items {
                        let id = common::id_of(item);
                        assert!(!b.ids().contains(&id), "{op}{q}: A's token listed B's row {item}");
                    }
                }
                // And the list does serve A's own rows, so "empty" is not how it passes.
                let own = common::walk(&app, template, &a.t.token).await;
                assert!(!own.is_empty(), "{op}: A's own list is empty");
            }
            Sweep::Counts { foreign } => {
                let unknown = app.get(&format!("{template}?inbox_id={}", Uuid::now_v7()), &a.t.token).await;
                assert_eq!(unknown.status, StatusCode::OK, "{op} with an unknown inbox: {}", unknown.text);
                for q in foreign {
                    let r = app.get(&format!("{template}{q}"), &a.t.token).await;
                    assert_eq!(r.status, StatusCode::OK, "{op}{q}: {}", r.text);
                    assert_eq!(r.body, unknown.body, "{op}{q}: B's inbox answers unlike an unknown one");
                    assert_no_trace_of(&b, &format!("{op}{q}"), &r);
                }
                // Each tenant counts its own conversations, all of them and no more, while
                // both hold some: A's counts include nothing of B's, nor B's of A's.
                for (who, token) in [("A", &a.t.token), ("B", &b.t.token)] {
                    let counted = app.get(template, token).await;
                    assert_eq!(counted.status, StatusCode::OK, "{op} as {who}: {}", counted.text);
                    let all: i64 = ["open", "pending", "closed"]
                        .iter()
                        .map(|s| counted.body[s]["all"].as_i64().expect("a count"))
                        .sum();
                    let listed = common::walk(&app, "/v1/conversations", token).await.len();
                    assert!(listed > 0, "{who} has conversations");
                    assert_eq!(all, i64::try_from(listed).expect("small"), "{op} as {who}: {}", counted.text);
                }
            }
            Sweep::Create { foreign, own } => {
                for body in foreign {
                    let r = app.call(method.clone(), template, Some(&a.t.token), Some(body.clone())).await;
                    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{op} naming B's rows {body}: {}", r.text);
                    assert_no_trace_of(&b, op, &r);
                }
                let r = app.call(method.clone(), template, Some(&a.t.token), Some(own.clone())).await;
                assert_eq!(r.status, StatusCode::CREATED, "{op} with A's own rows: {}", r.text);
            }
            Sweep::Stream { queries, last_event_ids } => {
                let resumes = last_event_ids.iter().map(Some).chain([None]);
                for (q, last) in queries.iter().flat_map(|q| resumes.clone().map(move |l| (q, l))) {
                    let what = format!("{op}{q} after {last:?}");
                    let mut s =
                        common::sse::open(&app, &format!("{template}{q}"), &a.t.token, last.map(String::as_str)).await;
                    assert_eq!(s.status, StatusCode::OK, "{what}: {}", s.text);
                    s.next_frame(Duration::from_secs(10)).await.expect("the opening hint");
                    // A marker of A's own, which every filter here but B's rows lets through,
                    // ends the read: whatever B's could have leaked is before it.
                    let marker = format!("marker {}", Uuid::now_v7());
                    a.t.message(&app, a.conversations[0], &marker).await;
                    let shows_a = q.is_empty() || q == "?status=open";
                    if shows_a {
                        s.events_until(Duration::from_secs(10), |f| {
                            f.data.as_deref().is_some_and(|d| d.contains(&marker))
                        })
                        .await;
                    } else {
                        assert!(s.next_event(Duration::from_millis(300)).await.is_none(), "{what}: {}", s.text);
                    }
                    assert_text_has_no_trace_of(&b, &what, &s.text);
                }
            }
            Sweep::TenantNeutral => {
                let r = app.call(method.clone(), template, Some(&a.t.token), None).await;
                assert_eq!(r.status, StatusCode::OK, "{op}: {}", r.text);
                assert_no_trace_of(&b, op, &r);
            }
        }
        swept.insert(op.clone());
    }
    assert_eq!(swept, documented, "the sweep must call every documented operation");

    // A's token cannot reassign A's conversation to B's agent either.
    let own_conversation = format!("/v1/conversations/{}", a.conversations[0]);
    let r = app.patch(&own_conversation, &a.t.token, json!({"assignee_id": b.t.agent})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "assigning B's agent: {}", r.text);

    // Timing class: B's ids and unknown ids, interleaved, on every by-id operation. Both are one
    // index probe on (tenant_id, id) that finds nothing, so their medians must be alike. The
    // bound is generous (a shared 2-core machine is noisy); the figures are printed.
    const ROUNDS: usize = 25;
    for (op, kind, body) in &by_id_ops {
        let (method, template) = split(op);
        let b_id = match kind {
            Kind::Conversation => b.conversations[1],
            Kind::Contact => b.contacts[1],
        };
        let (mut known, mut unknown) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let mut order = [(b_id, true), (Uuid::now_v7(), false)];
            if round % 2 == 1 {
                order.reverse();
            }
            for (id, is_b) in order {
                let started = Instant::now();
                let r = app.call(method.clone(), &path_with(template, id), Some(&a.t.token), body.clone()).await;
                let took = started.elapsed();
                assert_eq!(r.status, StatusCode::NOT_FOUND, "{op}: {}", r.text);
                if is_b { known.push(took) } else { unknown.push(took) }
            }
        }
        let (mk, mu) = (median(known), median(unknown));
        eprintln!("timing {op}: median B's id {mk:?}, unknown id {mu:?} over {ROUNDS} rounds");
        let slack = Duration::from_millis(5);
        assert!(mk <= mu * 3 + slack && mu <= mk * 3 + slack, "{op}: 404 timing differs: B's {mk:?} vs unknown {mu:?}");
    }

    // The control calls: A's own ids with the same bodies succeed, so every 404 above came from
    // the tenant filter. Erasure goes last, on a spare contact.
    for (op, kind, body) in &by_id_ops {
        let (method, template) = split(op);
        let ok = match coverage(op, &a, &b) {
            Some(Sweep::ById { ok, .. }) => ok,
            other => panic!("{op}: {other:?}"),
        };
        let own = match (kind, method == Method::DELETE) {
            (Kind::Contact, true) => a_spare_contact,
            (Kind::Contact, false) => a.contacts[1],
            (Kind::Conversation, _) => a.conversations[1],
        };
        let r = app.call(method.clone(), &path_with(template, own), Some(&a.t.token), body.clone()).await;
        assert_eq!(r.status, ok, "{op} on A's own row: {}", r.text);
    }

    assert_eq!(snapshot(&pool, b.t.id.0).await, before, "tenant A's calls changed tenant B's rows");
    // B still reads all of its own data.
    let convs = common::walk(&app, "/v1/conversations", &b.t.token).await;
    assert_eq!(convs.len(), b.conversations.len());
    app.running.shutdown(Duration::ZERO).await.expect("shuts down");
}
