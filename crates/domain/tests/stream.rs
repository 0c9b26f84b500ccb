//! The live inbox's outbox: every write that changes an inbox appends one event in its own
//! transaction; the sequencer numbers them 1, 2, 3... per tenant with no gaps even under
//! concurrent writers and sequencers; an erasure removes the contact's events; retention prunes
//! by age and by count.
#![allow(clippy::unwrap_used)]

use breakwater_domain::contacts::{self, NewContact};
use breakwater_domain::conversations::{self, ConversationChanges, ConversationStatus, NewConversation};
use breakwater_domain::stream::{self, EventKind, Head};
use breakwater_domain::tenants::{self, Role};
use breakwater_domain::{Pool, TenantId, UserId, messages};
use uuid::Uuid;

struct Tenant {
    id: TenantId,
    inbox: Uuid,
    agent: UserId,
}

async fn tenant(pool: &Pool, name: &str) -> Tenant {
    let id = tenants::create_tenant(pool, name).await.unwrap();
    let inbox = tenants::create_inbox(pool, id, "web", "web", None).await.unwrap();
    let agent = tenants::create_user(pool, id, "Agent", &format!("agent@{name}.example"), Role::Agent).await.unwrap();
    Tenant { id, inbox, agent }
}

async fn contact(pool: &Pool, t: &Tenant) -> Uuid {
    contacts::create(pool, t.id, NewContact { name: "Contact".into(), email: None }).await.unwrap().id
}

async fn open(pool: &Pool, t: &Tenant, contact_id: Uuid) -> Uuid {
    let new = NewConversation { contact_id, inbox_id: t.inbox, assignee_id: None, status: ConversationStatus::Open };
    conversations::create(pool, t.id, new).await.unwrap().id
}

/// The tenant's events, once the sequencer has numbered what is committed.
async fn all_events(pool: &Pool, t: &Tenant) -> Vec<stream::Event> {
    let mut conn = pool.acquire().await.unwrap();
    stream::sequence(&mut *conn).await.unwrap();
    stream::range(pool, t.id, 0, i64::MAX, 10_000).await.unwrap()
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_write_appends_its_event_with_the_tenants_next_id(pool: Pool) {
    let a = tenant(&pool, "a").await;
    let b = tenant(&pool, "b").await;
    let c = contact(&pool, &a).await;
    let conversation = open(&pool, &a, c).await;
    // Another tenant's writes take its own numbers.
    let other = contact(&pool, &b).await;
    open(&pool, &b, other).await;

    let assign = ConversationChanges { status: Some(ConversationStatus::Pending), assignee_id: Some(Some(a.agent.0)) };
    conversations::update(&pool, a.id, conversation, assign).await.unwrap();
    // A change that changes nothing appends nothing.
    conversations::update(&pool, a.id, conversation, assign).await.unwrap();
    let body = "a long message, ".repeat(20);
    let body = body.as_str();
    let posted = messages::post(&pool, a.id, a.agent, conversation, body, Some("k1"), None).await.unwrap();
    // The replay of an idempotent post writes nothing, so no event either.
    messages::post(&pool, a.id, a.agent, conversation, body, Some("k1"), None).await.unwrap();

    let events = all_events(&pool, &a).await;
    let kinds: Vec<(i64, EventKind)> = events.iter().map(|e| (e.id, e.kind)).collect();
    assert_eq!(
        kinds,
        [(1, EventKind::ConversationCreated), (2, EventKind::ConversationUpdated), (3, EventKind::MessageCreated)]
    );
    let updated = &events[1];
    assert_eq!(
        (updated.status, updated.assignee_id, updated.previous_status, updated.previous_assignee_id),
        (Some(ConversationStatus::Pending), Some(a.agent.0), Some(ConversationStatus::Open), None)
    );
    let message = &events[2];
    assert_eq!(message.message_id, Some(posted.message.id));
    assert_eq!((message.conversation_id, message.inbox_id, message.contact_id), (Some(conversation), Some(a.inbox), c));
    assert_eq!(message.status, Some(ConversationStatus::Pending), "the conversation's state travels with it");
    let preview = message.preview.as_deref().unwrap();
    assert!(body.starts_with(preview), "{preview:?}");
    assert_eq!(preview.chars().count(), messages::PREVIEW_CHARS, "a preview, not the body");
    // Unnumbered events are nobody's yet: a write since the last sequencing is not in the head.
    conversations::update(
        &pool,
        a.id,
        conversation,
        ConversationChanges { status: Some(ConversationStatus::Closed), assignee_id: None },
    )
    .await
    .unwrap();
    assert_eq!(stream::head(&pool, a.id).await.unwrap(), Head { last_id: 3, pruned_through: 0 });
    assert_eq!(stream::range(&pool, a.id, 0, i64::MAX, 100).await.unwrap().len(), 3);
    assert_eq!(stream::head(&pool, b.id).await.unwrap(), Head { last_id: 1, pruned_through: 0 });
    assert!(all_events(&pool, &b).await.iter().all(|e| e.tenant_id == b.id.0));
    let heads = stream::heads(&pool).await.unwrap();
    // Reading b's events sequenced a's pending one too.
    assert!(heads.contains(&(a.id, 4)) && heads.contains(&(b.id, 1)), "{heads:?}");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn an_erasure_takes_the_contacts_events_with_it_and_says_so(pool: Pool) {
    let t = tenant(&pool, "t").await;
    let (erased, kept) = (contact(&pool, &t).await, contact(&pool, &t).await);
    let gone = open(&pool, &t, erased).await;
    messages::post(&pool, t.id, t.agent, gone, "private words", None, None).await.unwrap();
    open(&pool, &t, kept).await;
    contacts::request_erasure(&pool, t.id, erased).await.unwrap();

    let events = all_events(&pool, &t).await;
    let left: Vec<(i64, EventKind, Uuid)> = events.iter().map(|e| (e.id, e.kind, e.contact_id)).collect();
    // Deleted before the sequencer came by, the erased contact's events never took a number.
    assert_eq!(left, [(1, EventKind::ConversationCreated, kept), (2, EventKind::ContactErased, erased)]);
    assert!(events.iter().all(|e| e.preview.is_none()), "no word of the erased contact's is left");
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn concurrent_writers_and_sequencers_number_every_event_once(pool: Pool) {
    let t = tenant(&pool, "busy").await;
    let c = contact(&pool, &t).await;
    let mut conversations = Vec::new();
    for _ in 0..8 {
        conversations.push(open(&pool, &t, c).await);
    }
    let writers: Vec<_> = conversations
        .iter()
        .map(|&conversation| {
            let (pool, tenant, agent) = (pool.clone(), t.id, t.agent);
            tokio::spawn(async move {
                for n in 0..25 {
                    messages::post(&pool, tenant, agent, conversation, &format!("m{n}"), None, None).await.unwrap();
                }
            })
        })
        .collect();
    // Three sequencers (three API tasks' listeners) numbering while the writers write.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sequencers: Vec<_> = (0..3)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    stream::sequence(&mut *conn).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in sequencers {
        s.await.unwrap();
    }
    let ids: Vec<i64> = all_events(&pool, &t).await.iter().map(|e| e.id).collect();
    assert_eq!(ids, (1..=8 + 8 * 25).collect::<Vec<_>>(), "no gap, no duplicate");
    // Within one conversation the messages appear in the order they were written.
    for conversation in conversations {
        let previews: Vec<String> = all_events(&pool, &t)
            .await
            .into_iter()
            .filter(|e| e.kind == EventKind::MessageCreated && e.conversation_id == Some(conversation))
            .map(|e| e.preview.unwrap())
            .collect();
        assert_eq!(previews, (0..25).map(|n| format!("m{n}")).collect::<Vec<_>>());
    }
}

#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn retention_prunes_by_count_and_by_age_and_moves_the_floor(pool: Pool) {
    let (a, b) = (tenant(&pool, "a").await, tenant(&pool, "b").await);
    let (ca, cb) = (contact(&pool, &a).await, contact(&pool, &b).await);
    for _ in 0..10 {
        open(&pool, &a, ca).await;
    }
    for _ in 0..3 {
        open(&pool, &b, cb).await;
    }
    stream::sequence(&mut *pool.acquire().await.unwrap()).await.unwrap();
    // By count: a keeps its newest four (batches of three, so the loop runs more than once).
    let pruned = stream::prune(&pool, 3600.0, 4, 3).await.unwrap();
    assert_eq!(pruned, stream::Pruned { by_age: 0, by_count: 6 });
    let ids: Vec<i64> = all_events(&pool, &a).await.iter().map(|e| e.id).collect();
    assert_eq!(ids, [7, 8, 9, 10]);
    assert_eq!(stream::head(&pool, a.id).await.unwrap(), Head { last_id: 10, pruned_through: 6 });
    assert_eq!(stream::head(&pool, b.id).await.unwrap(), Head { last_id: 3, pruned_through: 0 });
    // By age: everything is older than zero seconds.
    let pruned = stream::prune(&pool, 0.0, 100, 2).await.unwrap();
    assert_eq!(pruned, stream::Pruned { by_age: 7, by_count: 0 });
    assert_eq!(stream::head(&pool, a.id).await.unwrap(), Head { last_id: 10, pruned_through: 10 });
    assert_eq!(stream::head(&pool, b.id).await.unwrap(), Head { last_id: 3, pruned_through: 3 });
    // The sequence goes on from where it was.
    open(&pool, &a, ca).await;
    assert_eq!(all_events(&pool, &a).await.iter().map(|e| e.id).collect::<Vec<_>>(), [11]);
}

#[test]
fn notifications_parse_and_strangers_do_not() {
    let tenant = Uuid::now_v7();
    assert_eq!(stream::parse_notification(&format!("{tenant}:42")).unwrap(), (TenantId(tenant), 42));
    for bad in ["", "42", &format!("{tenant}:"), &format!("{tenant}:x"), "nope:1"] {
        assert!(stream::parse_notification(bad).is_err(), "{bad:?}");
    }
}

/// The two spellings of a kind agree: what sqlx writes to the `stream_event_kind` column (its
/// `rename`) is the name the stream sends (`as_str`), and the database's labels are exactly the
/// kinds listed here, so a kind added to one and not the others fails.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_event_kind_is_spelt_the_same_in_the_database_and_on_the_wire(pool: Pool) {
    let kinds = [
        EventKind::ConversationCreated,
        EventKind::ConversationUpdated,
        EventKind::MessageCreated,
        EventKind::ContactErased,
    ];
    for kind in kinds {
        let stored: String =
            sqlx::query_scalar("SELECT $1::stream_event_kind::text").bind(kind).fetch_one(&pool).await.unwrap();
        assert_eq!(stored, kind.as_str());
        let read: EventKind = sqlx::query_scalar("SELECT $1::text::stream_event_kind")
            .bind(kind.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(read, kind);
    }
    let mut labels: Vec<String> =
        sqlx::query_scalar("SELECT unnest(enum_range(NULL::stream_event_kind))::text").fetch_all(&pool).await.unwrap();
    let mut listed: Vec<String> = kinds.iter().map(|k| k.as_str().to_owned()).collect();
    labels.sort();
    listed.sort();
    assert_eq!(labels, listed);
}
