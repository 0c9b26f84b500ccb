//! The inbox counts against `COUNT(*)`: random sequences of every write that moves a
//! conversation between buckets (open, change status, assign, unassign, request a contact's
//! erasure, the worker's deletion of its rows), then every caller's counts, in every inbox and
//! in none, compared with a count of the conversations the inbox list shows. Once sequentially
//! (proptest, which shrinks a failing sequence) and once with several writers at once on one
//! tenant (the lock order: a deadlock or a lost update fails it).
#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use breakwater_domain::contacts::{self, NewContact};
use breakwater_domain::conversations::{self, ConversationChanges, ConversationStatus, NewConversation};
use breakwater_domain::counts::{self, Counts, StatusCounts};
use breakwater_domain::tenants::{self, Role};
use breakwater_domain::{DomainError, Pool, TenantId, UserId};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use uuid::Uuid;

/// One write. Indices pick a row of the world modulo how many there are.
#[derive(Debug, Clone)]
enum Op {
    Open {
        contact: usize,
        inbox: usize,
        assignee: Option<usize>,
        status: ConversationStatus,
    },
    SetStatus {
        conversation: usize,
        status: ConversationStatus,
    },
    Assign {
        conversation: usize,
        agent: usize,
    },
    Unassign {
        conversation: usize,
    },
    /// Status and assignee in one change.
    Move {
        conversation: usize,
        status: ConversationStatus,
        agent: Option<usize>,
    },
    RequestErasure {
        contact: usize,
    },
    /// The worker's job: deletes an erased contact's rows (a no-op for a contact not erased).
    DeleteErased {
        contact: usize,
    },
    NewContact,
}

fn status() -> impl Strategy<Value = ConversationStatus> {
    prop_oneof![Just(ConversationStatus::Open), Just(ConversationStatus::Pending), Just(ConversationStatus::Closed)]
}

fn op() -> impl Strategy<Value = Op> {
    // Any index: picked modulo the rows there are, so rows added late are picked as often.
    let i = any::<usize>;
    prop_oneof![
        6 => (i(), i(), proptest::option::of(i()), status())
            .prop_map(|(contact, inbox, assignee, status)| Op::Open { contact, inbox, assignee, status }),
        4 => (i(), status()).prop_map(|(conversation, status)| Op::SetStatus { conversation, status }),
        3 => (i(), i()).prop_map(|(conversation, agent)| Op::Assign { conversation, agent }),
        2 => i().prop_map(|conversation| Op::Unassign { conversation }),
        2 => (i(), status(), proptest::option::of(i()))
            .prop_map(|(conversation, status, agent)| Op::Move { conversation, status, agent }),
        1 => i().prop_map(|contact| Op::RequestErasure { contact }),
        1 => i().prop_map(|contact| Op::DeleteErased { contact }),
        1 => Just(Op::NewContact),
    ]
}

/// A tenant with three inboxes, three agents, an admin and four contacts, and the conversations
/// the operations open.
struct World {
    tenant: TenantId,
    inboxes: Vec<Uuid>,
    users: Vec<UserId>,
    contacts: Mutex<Vec<Uuid>>,
    conversations: Mutex<Vec<Uuid>>,
}

fn pick<T: Copy>(rows: &Mutex<Vec<T>>, i: usize) -> Option<T> {
    let rows = rows.lock().unwrap();
    (!rows.is_empty()).then(|| rows[i % rows.len()])
}

impl World {
    async fn new(pool: &Pool) -> Self {
        let tenant = tenants::create_tenant(pool, "Counted").await.unwrap();
        let mut inboxes = Vec::new();
        for name in ["web", "email", "sms"] {
            inboxes.push(tenants::create_inbox(pool, tenant, name, name, None).await.unwrap());
        }
        let mut users = Vec::new();
        for (n, role) in [Role::Admin, Role::Agent, Role::Agent, Role::Agent].into_iter().enumerate() {
            users.push(tenants::create_user(pool, tenant, "User", &format!("u{n}@x.example"), role).await.unwrap());
        }
        let world =
            Self { tenant, inboxes, users, contacts: Mutex::new(Vec::new()), conversations: Mutex::new(Vec::new()) };
        for _ in 0..4 {
            world.new_contact(pool).await;
        }
        world
    }

    async fn new_contact(&self, pool: &Pool) {
        let new = NewContact { name: "Contact".into(), email: None };
        let contact = contacts::create(pool, self.tenant, new).await.unwrap();
        self.contacts.lock().unwrap().push(contact.id);
    }

    fn user(&self, i: usize) -> Uuid {
        self.users[i % self.users.len()].0
    }

    /// Runs one operation. The refusals a concurrent erasure can cause (a conversation or
    /// contact that is gone) are expected; any other error fails the test.
    async fn apply(&self, pool: &Pool, op: &Op) {
        let t = self.tenant;
        let change = |status, assignee_id| ConversationChanges { status, assignee_id };
        let result = match *op {
            Op::Open { contact, inbox, assignee, status } => {
                let Some(contact_id) = pick(&self.contacts, contact) else { return };
                let new = NewConversation {
                    contact_id,
                    inbox_id: self.inboxes[inbox % self.inboxes.len()],
                    assignee_id: assignee.map(|a| self.user(a)),
                    status,
                };
                conversations::create(pool, t, new).await.map(|c| self.conversations.lock().unwrap().push(c.id))
            }
            Op::SetStatus { conversation, status } => self.update(pool, conversation, change(Some(status), None)).await,
            Op::Assign { conversation, agent } => {
                self.update(pool, conversation, change(None, Some(Some(self.user(agent))))).await
            }
            Op::Unassign { conversation } => self.update(pool, conversation, change(None, Some(None))).await,
            Op::Move { conversation, status, agent } => {
                let assignee = agent.map(|a| self.user(a));
                self.update(pool, conversation, change(Some(status), Some(assignee))).await
            }
            Op::RequestErasure { contact } => {
                let Some(id) = pick(&self.contacts, contact) else { return };
                contacts::request_erasure(pool, t, id).await.map(|_| ())
            }
            Op::DeleteErased { contact } => {
                let Some(id) = pick(&self.contacts, contact) else { return };
                let erased: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM contacts WHERE tenant_id = $1 AND id = $2 AND erased_at IS NOT NULL)",
                )
                .bind(t.0)
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
                // As the worker does: only after the erasure was requested.
                if !erased {
                    return;
                }
                contacts::erase(pool, t, id, 3).await.map(|_| ())
            }
            Op::NewContact => {
                self.new_contact(pool).await;
                Ok(())
            }
        };
        match result {
            Ok(()) | Err(DomainError::NotFound) => {}
            // Opening a conversation for a contact whose erasure was requested.
            Err(DomainError::Invalid(why)) if why.starts_with("contact_id") => {}
            Err(e) => panic!("{op:?}: {e:?}"),
        }
    }

    async fn update(&self, pool: &Pool, conversation: usize, changes: ConversationChanges) -> Result<(), DomainError> {
        let Some(id) = pick(&self.conversations, conversation) else { return Ok(()) };
        conversations::update(pool, self.tenant, id, changes).await.map(|_| ())
    }

    /// Every user's counts, in every inbox, in none and in an unknown one, against `COUNT(*)`
    /// of what the inbox list shows; and no counter row below zero.
    async fn check(&self, pool: &Pool) -> Result<(), String> {
        let inboxes = std::iter::once(None).chain(self.inboxes.iter().copied().map(Some)).chain([Some(Uuid::now_v7())]);
        for inbox in inboxes {
            for &user in &self.users {
                let counted = counts::get(pool, self.tenant, user, inbox).await.map_err(|e| e.to_string())?;
                let expected = count_star(pool, self.tenant, user, inbox).await;
                if counted != expected {
                    return Err(format!("user {user}, inbox {inbox:?}: counters {counted:?}, COUNT(*) {expected:?}"));
                }
            }
        }
        let negative: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM conversation_counts
                     WHERE tenant_id = $1 AND (unassigned < 0 OR total < unassigned))
                  + (SELECT count(*) FROM conversation_assignee_counts WHERE tenant_id = $1 AND n < 0)",
        )
        .bind(self.tenant.0)
        .fetch_one(pool)
        .await
        .unwrap();
        if negative != 0 {
            return Err(format!("{negative} counter rows below zero (a conversation counted outside its shard)"));
        }
        Ok(())
    }
}

/// The counts by brute force: the conversations whose contact is not erased.
async fn count_star(pool: &Pool, tenant: TenantId, user: UserId, inbox: Option<Uuid>) -> Counts {
    let rows: Vec<(ConversationStatus, i64, i64, i64)> = sqlx::query_as(
        "SELECT c.status, count(*), count(*) FILTER (WHERE c.assignee_id = $2),
                count(*) FILTER (WHERE c.assignee_id IS NULL)
         FROM conversations c
         JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
         WHERE c.tenant_id = $1 AND ct.erased_at IS NULL AND ($3::uuid IS NULL OR c.inbox_id = $3)
         GROUP BY c.status",
    )
    .bind(tenant.0)
    .bind(user.0)
    .bind(inbox)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut counts = Counts::default();
    for (status, all, mine, unassigned) in rows {
        let slot = match status {
            ConversationStatus::Open => &mut counts.open,
            ConversationStatus::Pending => &mut counts.pending,
            ConversationStatus::Closed => &mut counts.closed,
        };
        *slot = StatusCounts { all, mine, unassigned };
    }
    counts
}

/// Each case is a fresh tenant in the test's database; proptest shrinks a failing sequence.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn counters_equal_count_star_after_any_sequence_of_writes(pool: Pool) {
    let handle = tokio::runtime::Handle::current();
    // The runner is synchronous: run it on a blocking thread, each case's I/O on the runtime.
    let result = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(Config { cases: 32, ..Config::default() });
        runner.run(&proptest::collection::vec(op(), 1..60), |ops| {
            handle.block_on(async {
                let world = World::new(&pool).await;
                for op in &ops {
                    world.apply(&pool, op).await;
                }
                world.check(&pool).await.map_err(TestCaseError::fail)
            })
        })
    })
    .await
    .unwrap();
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Several writers on one tenant at once, erasures among them, then the same comparison. The
/// sequences are random but fixed (proptest's deterministic runner); `COUNTS_OPS` sets the
/// total number of operations (default 2,000).
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn counters_stay_exact_under_concurrent_writers(pool: Pool) {
    const WRITERS: usize = 8;
    let total: usize = std::env::var("COUNTS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let world = std::sync::Arc::new(World::new(&pool).await);
    let mut runner = TestRunner::deterministic();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let ops = proptest::collection::vec(op(), total / WRITERS).new_tree(&mut runner).unwrap().current();
        let (pool, world) = (pool.clone(), world.clone());
        tasks.push(tokio::spawn(async move {
            for op in &ops {
                world.apply(&pool, op).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let opened = world.conversations.lock().unwrap().len();
    eprintln!("{total} operations by {WRITERS} writers: {opened} conversations opened");
    assert!(opened > total / 10, "only {opened} conversations opened: the operations did not exercise the counters");
    world.check(&pool).await.unwrap();
}
