//! The wire types: what the API serialises, kept apart from the domain's types (as the Rust
//! package registry keeps its `views`). Only what the OpenAPI document promises is here: a field
//! the domain adds for its own use (the contacts list's sort key, say) reaches no client until a
//! view names it. The schema names are the views' (`Conversation`, `Page_Conversation`, ...).
//!
//! Value types whose wire spelling is their meaning (a conversation's status, a message's sender,
//! a list's order) are the domain's own enums; structures are always views.
//!
//! Each view repeats its domain type's fields and doc comments on purpose (the `duplicates` tool
//! lists the pairs): the repetition is the contract, written where a reviewer of the API sees it,
//! and the `From` impls make the compiler report a field the domain renames or drops.

use breakwater_domain::{contacts, conversations, counts, messages};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

pub use breakwater_domain::conversations::ConversationStatus;
pub use breakwater_domain::messages::MessageSender;

/// A page of a keyset-paginated list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    /// The rows of this page.
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The view of a domain page whose cursor has been sealed for the client.
    pub(crate) fn of<D>(items: Vec<D>, next_cursor: Option<String>) -> Self
    where
        T: From<D>,
    {
        Self { items: items.into_iter().map(T::from).collect(), next_cursor }
    }
}

/// A conversation as the inbox shows it: with its contact's name and the last message preview.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Conversation {
    /// The conversation's id.
    pub id: Uuid,
    /// The inbox (channel) it arrived on.
    pub inbox_id: Uuid,
    /// The end customer.
    pub contact_id: Uuid,
    /// The contact's display name.
    pub contact_name: String,
    /// The agent it is assigned to, if any.
    pub assignee_id: Option<Uuid>,
    /// Where it stands.
    pub status: ConversationStatus,
    /// When it was opened.
    pub created_at: DateTime<Utc>,
    /// When its newest message was written (or it was opened); the inbox's sort key.
    pub last_activity_at: DateTime<Utc>,
    /// The start of the newest message.
    pub last_message_preview: Option<String>,
    /// How many messages it holds.
    pub message_count: i32,
}

impl From<conversations::Conversation> for Conversation {
    fn from(c: conversations::Conversation) -> Self {
        Self {
            id: c.id,
            inbox_id: c.inbox_id,
            contact_id: c.contact_id,
            contact_name: c.contact_name,
            assignee_id: c.assignee_id,
            status: c.status,
            created_at: c.created_at,
            last_activity_at: c.last_activity_at,
            last_message_preview: c.last_message_preview,
            message_count: c.message_count,
        }
    }
}

/// One status's counts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatusCounts {
    /// Every conversation in this status.
    pub all: i64,
    /// Those assigned to the caller.
    pub mine: i64,
    /// Those assigned to nobody.
    pub unassigned: i64,
}

impl From<counts::StatusCounts> for StatusCounts {
    fn from(c: counts::StatusCounts) -> Self {
        Self { all: c.all, mine: c.mine, unassigned: c.unassigned }
    }
}

/// The inbox counts of every status.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConversationCounts {
    /// Waiting for an agent.
    pub open: StatusCounts,
    /// Waiting for the contact.
    pub pending: StatusCounts,
    /// Done.
    pub closed: StatusCounts,
}

impl From<counts::Counts> for ConversationCounts {
    fn from(c: counts::Counts) -> Self {
        Self { open: c.open.into(), pending: c.pending.into(), closed: c.closed.into() }
    }
}

/// One message.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Message {
    /// The message's id.
    pub id: Uuid,
    /// The conversation it belongs to.
    pub conversation_id: Uuid,
    /// Who wrote it.
    pub sender: MessageSender,
    /// The agent who wrote it, when `sender` is `agent`.
    pub author_id: Option<Uuid>,
    /// Its text.
    pub body: String,
    /// When it was written.
    pub created_at: DateTime<Utc>,
}

impl From<messages::Message> for Message {
    fn from(m: messages::Message) -> Self {
        Self {
            id: m.id,
            conversation_id: m.conversation_id,
            sender: m.sender,
            author_id: m.author_id,
            body: m.body,
            created_at: m.created_at,
        }
    }
}

/// A contact with their conversation count and newest activity.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Contact {
    /// The contact's id.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// Email address, if known.
    pub email: Option<String>,
    /// When the contact was created.
    pub created_at: DateTime<Utc>,
    /// How many conversations they have.
    pub conversation_count: i64,
    /// The newest activity over their conversations.
    pub last_activity_at: Option<DateTime<Utc>>,
}

impl From<contacts::Contact> for Contact {
    fn from(c: contacts::Contact) -> Self {
        Self {
            id: c.id,
            name: c.name,
            email: c.email,
            created_at: c.created_at,
            conversation_count: c.conversation_count,
            last_activity_at: c.last_activity_at,
        }
    }
}

/// The answer to an erasure request.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErasureAccepted {
    /// The job that deletes the data.
    pub job_id: Uuid,
}

impl From<contacts::ErasureAccepted> for ErasureAccepted {
    fn from(a: contacts::ErasureAccepted) -> Self {
        Self { job_id: a.job_id }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;
    use utoipa::OpenApi as _;

    use super::*;

    fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
    }

    fn domain_contact() -> contacts::Contact {
        contacts::Contact {
            id: Uuid::nil(),
            name: "Ann".into(),
            email: Some("ann@example.com".into()),
            created_at: Utc::now(),
            conversation_count: 2,
            last_activity_at: Some(Utc::now()),
            sort_key: "internal-sort-key".into(),
        }
    }

    #[test]
    fn each_view_serialises_exactly_what_the_document_promises() {
        let doc = serde_json::to_value(crate::openapi::ApiDoc::openapi()).expect("serialises");
        let now = Utc::now();
        let conversation = Conversation::from(conversations::Conversation {
            id: Uuid::nil(),
            inbox_id: Uuid::nil(),
            contact_id: Uuid::nil(),
            contact_name: "Ann".into(),
            assignee_id: Some(Uuid::nil()),
            status: ConversationStatus::Open,
            created_at: now,
            last_activity_at: now,
            last_message_preview: Some("hi".into()),
            message_count: 1,
        });
        let message = Message::from(messages::Message {
            id: Uuid::nil(),
            conversation_id: Uuid::nil(),
            sender: MessageSender::Agent,
            author_id: Some(Uuid::nil()),
            body: "hi".into(),
            created_at: now,
        });
        let tally = counts::StatusCounts { all: 3, mine: 1, unassigned: 1 };
        let counted = ConversationCounts::from(counts::Counts { open: tally, pending: tally, closed: tally });
        let samples = [
            ("Conversation", serde_json::to_value(&conversation)),
            ("ConversationCounts", serde_json::to_value(&counted)),
            ("StatusCounts", serde_json::to_value(&counted.open)),
            ("Message", serde_json::to_value(&message)),
            ("Contact", serde_json::to_value(Contact::from(domain_contact()))),
            ("ErasureAccepted", serde_json::to_value(ErasureAccepted { job_id: Uuid::nil() })),
        ];
        for (name, value) in samples {
            let value = value.expect("serialises");
            let promised = keys(&doc["components"]["schemas"][name]["properties"]);
            assert!(!promised.is_empty(), "{name} is not in the document's schemas");
            assert_eq!(keys(&value), promised, "{name}: what is sent is what the document promises");
        }
    }

    #[test]
    fn a_domain_field_for_internal_use_reaches_no_client() {
        let json = serde_json::to_string(&Contact::from(domain_contact())).expect("serialises");
        assert!(!json.contains("internal-sort-key") && !json.contains("sort_key"), "{json}");
    }
}

/// One event of `GET /v1/stream`, the `data:` of an SSE event whose `event:` is `type` and
/// whose `id:` is `id`. Fields that do not apply to the type are absent.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamEvent {
    /// Its number in the tenant's sequence: send it back as `Last-Event-ID` to resume after it.
    pub id: i64,
    /// `conversation.created`, `conversation.updated`, `message.created` or `contact.erased`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// When the change was made.
    pub at: DateTime<Utc>,
    /// The contact concerned. After `contact.erased`, drop every conversation of theirs.
    pub contact_id: Uuid,
    /// The conversation concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<Uuid>,
    /// Its inbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbox_id: Option<Uuid>,
    /// Its status after the change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ConversationStatus>,
    /// Its assignee after the change (`null`: nobody). Absent from `contact.erased`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assignee_id: Option<Option<Uuid>>,
    /// `conversation.updated`: what it was before, so that a filtered list can drop a
    /// conversation that left it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<StreamPrevious>,
    /// `message.created`: the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<StreamMessage>,
}

/// A conversation's status and assignee before a `conversation.updated`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamPrevious {
    /// The status before.
    pub status: ConversationStatus,
    /// The assignee before (`null`: nobody).
    pub assignee_id: Option<Uuid>,
}

/// The message of a `message.created`: its preview, never its whole body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamMessage {
    /// The message's id.
    pub id: Uuid,
    /// The start of its body (the inbox list's preview).
    pub preview: String,
}

impl From<&breakwater_domain::stream::Event> for StreamEvent {
    fn from(e: &breakwater_domain::stream::Event) -> Self {
        let conversation = e.conversation_id.is_some();
        Self {
            id: e.id,
            kind: e.kind.as_str(),
            at: e.at,
            contact_id: e.contact_id,
            conversation_id: e.conversation_id,
            inbox_id: e.inbox_id,
            status: e.status,
            assignee_id: conversation.then_some(e.assignee_id),
            previous: e.previous_status.map(|status| StreamPrevious { status, assignee_id: e.previous_assignee_id }),
            message: e.message_id.zip(e.preview.clone()).map(|(id, preview)| StreamMessage { id, preview }),
        }
    }
}
