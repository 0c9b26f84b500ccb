//! The cases: the subjects (the biggest tenant, and tenants of other sizes), and the list queries
//! the API makes on each, as it makes them (deep pages reached by keyset).

use anyhow::bail;
use breakwater_domain::contacts::{self, ContactSearch};
use breakwater_domain::conversations::{self, AssigneeFilter, ConversationStatus, InboxFilter};
use breakwater_domain::messages::{self, Order};
use breakwater_domain::{Cursor, DEFAULT_PAGE_SIZE, Pool, TenantId};
use uuid::Uuid;

/// One list query, as the API would make it.
#[derive(Debug, Clone)]
pub(super) enum Query {
    Inbox(InboxFilter, Option<Cursor>),
    Messages(Uuid, Order, Option<Cursor>),
    Contacts(ContactSearch, Option<Cursor>),
}

impl Query {
    pub(super) fn with_cursor(&self, cursor: Option<Cursor>) -> Self {
        match self {
            Self::Inbox(f, _) => Self::Inbox(*f, cursor),
            Self::Messages(c, o, _) => Self::Messages(*c, *o, cursor),
            Self::Contacts(s, _) => Self::Contacts(s.clone(), cursor),
        }
    }

    /// Runs it; returns the rows and the next page's cursor.
    pub(super) async fn run(&self, pool: &Pool, tenant: TenantId) -> anyhow::Result<(usize, Option<Cursor>)> {
        let limit = DEFAULT_PAGE_SIZE;
        let (rows, next) = match self {
            Self::Inbox(filter, cursor) => {
                let page = conversations::list(pool, tenant, *filter, cursor.as_ref(), limit).await?;
                (page.items.len(), page.next_cursor)
            }
            Self::Messages(conversation, order, cursor) => {
                let page = messages::list(pool, tenant, *conversation, *order, cursor.as_ref(), limit).await?;
                (page.items.len(), page.next_cursor)
            }
            Self::Contacts(search, cursor) => {
                let page = contacts::list(pool, tenant, search, cursor.as_ref(), limit).await?;
                (page.items.len(), page.next_cursor)
            }
        };
        let next = next.map(|c| Cursor::decode(&c)).transpose().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((rows, next))
    }
}

/// A tenant the cases run on, and what in it they query.
#[derive(Debug, Clone)]
pub(super) struct Subject {
    pub(super) key: &'static str,
    pub(super) label: String,
    pub(super) tenant: TenantId,
    pub(super) conversations: i64,
    pub(super) messages: i64,
    pub(super) contacts: i64,
    pub(super) agent: Uuid,
    pub(super) inbox: Uuid,
    pub(super) long_conversation: (Uuid, i32),
    pub(super) name_prefix: String,
    pub(super) email_prefix: String,
    /// The biggest contacts: (id, conversations, messages), biggest first.
    pub(super) big_contacts: Vec<(Uuid, i64, i64)>,
}

#[derive(Debug, Clone)]
pub(super) struct Case {
    pub(super) key: String,
    pub(super) title: String,
    pub(super) subject: usize,
    pub(super) query: Query,
}

pub(super) async fn subjects(pool: &Pool, erasures: usize) -> anyhow::Result<Vec<Subject>> {
    let sizes = sqlx::query!(
        r#"SELECT tenant_id AS "tenant_id!", count(*) AS "n!" FROM conversations
           GROUP BY tenant_id ORDER BY count(*) DESC, tenant_id"#
    )
    .fetch_all(pool)
    .await?;
    let total: i64 = sizes.iter().map(|s| s.n).sum();
    let (Some(big), Some(small)) = (sizes.first(), sizes.get(sizes.len() / 2)) else {
        bail!("the database has no conversations");
    };
    let mut out = Vec::new();
    for (key, tenant, n) in [("big", big.tenant_id, big.n), ("small", small.tenant_id, small.n)] {
        #[allow(clippy::cast_precision_loss)]
        let share = n as f64 * 100.0 / total.max(1) as f64;
        let label = if key == "big" { format!("{share:.0}% tenant") } else { format!("median tenant ({share:.2}%)") };
        let messages = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM messages WHERE tenant_id = $1"#, tenant)
            .fetch_one(pool)
            .await?;
        let contacts = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM contacts WHERE tenant_id = $1"#, tenant)
            .fetch_one(pool)
            .await?;
        let agent = sqlx::query_scalar!(
            r#"SELECT assignee_id AS "id!" FROM conversations WHERE tenant_id = $1 AND assignee_id IS NOT NULL
               GROUP BY assignee_id ORDER BY count(*) DESC, assignee_id LIMIT 1"#,
            tenant
        )
        .fetch_one(pool)
        .await?;
        let inbox = sqlx::query_scalar!(
            r#"SELECT inbox_id AS "id!" FROM conversations WHERE tenant_id = $1
               GROUP BY inbox_id ORDER BY count(*) DESC, inbox_id LIMIT 1"#,
            tenant
        )
        .fetch_one(pool)
        .await?;
        let long = sqlx::query!(
            "SELECT id, message_count FROM conversations WHERE tenant_id = $1 ORDER BY message_count DESC, id LIMIT 1",
            tenant
        )
        .fetch_one(pool)
        .await?;
        // Prefixes of a contact's name and email from the middle of their lists: as common as a
        // typed prefix is.
        let prefixes = sqlx::query!(
            r#"SELECT
                 (SELECT left(lower(name), 3) FROM contacts WHERE tenant_id = $1
                  ORDER BY lower(name) COLLATE "C", id OFFSET $2 LIMIT 1) AS "name!",
                 (SELECT left(lower(email), 3) FROM contacts WHERE tenant_id = $1 AND email IS NOT NULL
                  ORDER BY lower(email) COLLATE "C", id OFFSET $3 LIMIT 1) AS "email!""#,
            tenant,
            contacts / 2,
            contacts / 3
        )
        .fetch_one(pool)
        .await?;
        let big_contacts = sqlx::query!(
            r#"SELECT contact_id AS "id!", count(*) AS "conversations!", sum(message_count)::int8 AS "messages!"
               FROM conversations WHERE tenant_id = $1
               GROUP BY contact_id ORDER BY count(*) DESC, contact_id LIMIT $2"#,
            tenant,
            i64::try_from(erasures)?
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| (r.id, r.conversations, r.messages))
        .collect();
        out.push(Subject {
            key,
            label,
            tenant: TenantId(tenant),
            conversations: n,
            messages,
            contacts,
            agent,
            inbox,
            long_conversation: (long.id, long.message_count),
            name_prefix: prefixes.name,
            email_prefix: prefixes.email,
            big_contacts,
        });
    }
    Ok(out)
}

pub(super) async fn cases(pool: &Pool, subjects: &[Subject], deep_pages: usize) -> anyhow::Result<Vec<Case>> {
    let mut out = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        let inbox = |status, inbox_id, assignee| Query::Inbox(InboxFilter { status, inbox_id, assignee }, None);
        let open = Some(ConversationStatus::Open);
        let closed = Some(ConversationStatus::Closed);
        let agent = AssigneeFilter::User(s.agent);
        let mut list = vec![
            ("inbox-all", "inbox: all, page 1".to_owned(), inbox(None, None, AssigneeFilter::Any), false),
            ("inbox-all-deep", "inbox: all, deep page".to_owned(), inbox(None, None, AssigneeFilter::Any), true),
            ("inbox-open", "inbox: status=open".to_owned(), inbox(open, None, AssigneeFilter::Any), false),
            ("inbox-closed", "inbox: status=closed".to_owned(), inbox(closed, None, AssigneeFilter::Any), false),
            (
                "inbox-closed-deep",
                "inbox: status=closed, deep page".to_owned(),
                inbox(closed, None, AssigneeFilter::Any),
                true,
            ),
            ("inbox-assignee", "inbox: assignee".to_owned(), inbox(None, None, agent), false),
            ("inbox-open-assignee", "inbox: status=open + assignee".to_owned(), inbox(open, None, agent), false),
            ("inbox-assignee-deep", "inbox: assignee, deep page".to_owned(), inbox(None, None, agent), true),
            ("inbox-unassigned", "inbox: unassigned".to_owned(), inbox(None, None, AssigneeFilter::Unassigned), false),
            (
                "inbox-open-unassigned",
                "inbox: status=open + unassigned".to_owned(),
                inbox(open, None, AssigneeFilter::Unassigned),
                false,
            ),
            ("inbox-inbox", "inbox: inbox".to_owned(), inbox(None, Some(s.inbox), AssigneeFilter::Any), false),
            (
                "inbox-inbox-open",
                "inbox: inbox + status=open".to_owned(),
                inbox(open, Some(s.inbox), AssigneeFilter::Any),
                false,
            ),
            (
                "inbox-inbox-deep",
                "inbox: inbox, deep page".to_owned(),
                inbox(None, Some(s.inbox), AssigneeFilter::Any),
                true,
            ),
            (
                "messages-first",
                format!("messages: longest conversation ({}), first page", s.long_conversation.1),
                Query::Messages(s.long_conversation.0, Order::Asc, Some(oldest())),
                false,
            ),
            (
                "messages-newest",
                "messages: longest conversation, newest page".to_owned(),
                Query::Messages(s.long_conversation.0, Order::Desc, None),
                false,
            ),
            (
                "messages-deep",
                "messages: longest conversation, deep page".to_owned(),
                Query::Messages(s.long_conversation.0, Order::Asc, Some(oldest())),
                true,
            ),
            ("contacts", "contacts: page 1".to_owned(), Query::Contacts(ContactSearch::All, None), false),
            ("contacts-deep", "contacts: deep page".to_owned(), Query::Contacts(ContactSearch::All, None), true),
            (
                "contacts-name",
                format!("contacts: name prefix '{}'", s.name_prefix),
                Query::Contacts(ContactSearch::NamePrefix(s.name_prefix.clone()), None),
                false,
            ),
            (
                "contacts-email",
                format!("contacts: email prefix '{}'", s.email_prefix),
                Query::Contacts(ContactSearch::EmailPrefix(s.email_prefix.clone()), None),
                false,
            ),
        ];
        for (key, title, query, deep) in list.drain(..) {
            let (query, depth) = if deep { walk(pool, s.tenant, &query, deep_pages).await? } else { (query, 0) };
            let title = if deep { format!("{title} (after {depth} rows)") } else { title };
            out.push(Case { key: format!("{}-{key}", s.key), title, subject: i, query });
        }
    }
    Ok(out)
}

/// The first page of an oldest-first message list, as a cursor before every message.
///
/// `messages::list` starts an oldest-first list at `DateTime::<Utc>::MIN_UTC`, which is outside
/// PostgreSQL's timestamp range: without a cursor that query fails ("timestamp out of range").
/// Until the domain's sentinel is fixed, the bench passes the Unix epoch, which the same
/// statement and plan serve.
pub(super) fn oldest() -> Cursor {
    Cursor::Time(chrono::DateTime::UNIX_EPOCH, Uuid::nil())
}

/// Follows the cursor `pages` pages deep (or to the last page) and returns the query for there.
pub(super) async fn walk(pool: &Pool, tenant: TenantId, query: &Query, pages: usize) -> anyhow::Result<(Query, usize)> {
    let mut at = query.clone();
    let mut depth = 0;
    for _ in 0..pages {
        let (rows, next) = at.run(pool, tenant).await?;
        match next {
            Some(cursor) => {
                depth += rows;
                at = query.with_cursor(Some(cursor));
            }
            None => break,
        }
    }
    Ok((at, depth))
}
