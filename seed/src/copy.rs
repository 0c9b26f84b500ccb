//! PostgreSQL's binary `COPY` format, and the encoding of each table's rows in it.
//!
//! Binary rather than text: the server does no parsing of UUIDs and timestamps and no escaping,
//! which is most of what a text `COPY` of these tables costs it. The format: a signature, flags
//! and header extension; per row a 16-bit field count, then per field a 32-bit length (-1 for
//! NULL) and the value in the type's `send` representation; a 16-bit -1 trailer.

use std::ops::Range;

use uuid::Uuid;

use crate::plan::Plan;

/// Seconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800 * 1_000_000;

/// Rows per chunk sent to the server: large enough to amortise the per-message overhead, small
/// enough to keep the encoder and the server working at once.
pub(crate) const CHUNK_ROWS: usize = 8_192;

/// A buffer of binary `COPY` data.
pub(crate) struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self { buf: Vec::with_capacity(bytes) }
    }

    /// The stream's header: signature, no flags, no extension.
    pub(crate) fn header() -> Vec<u8> {
        let mut buf = b"PGCOPY\n\xff\r\n\0".to_vec();
        buf.extend_from_slice(&0i32.to_be_bytes());
        buf.extend_from_slice(&0i32.to_be_bytes());
        buf
    }

    /// The stream's trailer.
    pub(crate) fn trailer() -> Vec<u8> {
        (-1i16).to_be_bytes().to_vec()
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    fn row(&mut self, fields: i16) {
        self.buf.extend_from_slice(&fields.to_be_bytes());
    }

    fn len(&mut self, n: usize) {
        let n = i32::try_from(n).expect("a field under 2 GiB");
        self.buf.extend_from_slice(&n.to_be_bytes());
    }

    fn null(&mut self) {
        self.buf.extend_from_slice(&(-1i32).to_be_bytes());
    }

    fn uuid(&mut self, id: Uuid) {
        self.len(16);
        self.buf.extend_from_slice(id.as_bytes());
    }

    fn opt_uuid(&mut self, id: Option<Uuid>) {
        match id {
            Some(id) => self.uuid(id),
            None => self.null(),
        }
    }

    /// `text`, and enum labels (an enum's binary form is its label).
    fn text(&mut self, s: &str) {
        self.len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn opt_text(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.text(s),
            None => self.null(),
        }
    }

    /// `timestamptz` from Unix microseconds.
    fn timestamp(&mut self, unix_micros: i64) {
        self.len(8);
        self.buf.extend_from_slice(&(unix_micros - PG_EPOCH_OFFSET_MICROS).to_be_bytes());
    }

    fn int4(&mut self, n: u32) {
        self.len(4);
        let n = i32::try_from(n).expect("a count under 2^31");
        self.buf.extend_from_slice(&n.to_be_bytes());
    }
}

/// The tables the seeder writes, in the order their rows depend on each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `tenants`
    Tenants,
    /// `users`
    Users,
    /// `inboxes`
    Inboxes,
    /// `contacts`
    Contacts,
    /// `conversations`
    Conversations,
    /// `messages`
    Messages,
}

impl Table {
    /// All of them.
    pub const ALL: [Self; 6] =
        [Self::Tenants, Self::Users, Self::Inboxes, Self::Contacts, Self::Conversations, Self::Messages];

    /// The table's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Tenants => "tenants",
            Self::Users => "users",
            Self::Inboxes => "inboxes",
            Self::Contacts => "contacts",
            Self::Conversations => "conversations",
            Self::Messages => "messages",
        }
    }

    /// The columns the seeder writes (the others keep their defaults: NULL).
    pub(crate) fn columns(self) -> &'static str {
        match self {
            Self::Tenants => "id, name, created_at",
            Self::Users => "tenant_id, id, name, email, role, created_at",
            Self::Inboxes => "tenant_id, id, name, channel, created_at",
            Self::Contacts => "tenant_id, id, name, email, created_at",
            Self::Conversations => {
                "tenant_id, id, inbox_id, contact_id, assignee_id, status, created_at, last_activity_at, \
                 last_message_preview, message_count"
            }
            Self::Messages => "tenant_id, id, conversation_id, sender, author_id, body, created_at",
        }
    }

    /// How many rows the plan has for the table.
    pub(crate) fn rows(self, plan: &Plan) -> usize {
        match self {
            Self::Tenants => plan.tenants.len(),
            Self::Users => plan.users.len(),
            Self::Inboxes => plan.inboxes.len(),
            Self::Contacts => plan.contacts.len(),
            Self::Conversations => plan.conversations.len(),
            Self::Messages => plan.messages.len(),
        }
    }

    /// Encodes the rows `range` of the table (no header or trailer).
    pub(crate) fn encode(self, plan: &Plan, range: Range<usize>) -> Vec<u8> {
        let mut e = Encoder::with_capacity(range.len() * self.row_bytes_hint());
        match self {
            Self::Tenants => {
                for t in &plan.tenants[range] {
                    e.row(3);
                    e.uuid(t.id);
                    e.text(&t.name);
                    e.timestamp(t.created_at);
                }
            }
            Self::Users => {
                for u in &plan.users[range] {
                    e.row(6);
                    e.uuid(u.tenant_id);
                    e.uuid(u.id);
                    e.text(&u.name);
                    e.text(&u.email);
                    e.text(if u.admin { "admin" } else { "agent" });
                    e.timestamp(u.created_at);
                }
            }
            Self::Inboxes => {
                for i in &plan.inboxes[range] {
                    e.row(5);
                    e.uuid(i.tenant_id);
                    e.uuid(i.id);
                    e.text(&i.name);
                    e.text(i.channel);
                    e.timestamp(i.created_at);
                }
            }
            Self::Contacts => {
                for c in &plan.contacts[range] {
                    e.row(5);
                    e.uuid(c.tenant_id);
                    e.uuid(c.id);
                    e.text(&c.name);
                    e.opt_text(c.email.as_deref());
                    e.timestamp(c.created_at);
                }
            }
            Self::Conversations => {
                for c in &plan.conversations[range] {
                    e.row(10);
                    e.uuid(c.tenant_id);
                    e.uuid(c.id);
                    e.uuid(c.inbox_id);
                    e.uuid(c.contact_id);
                    e.opt_uuid(c.assignee_id);
                    e.text(c.status.label());
                    e.timestamp(c.created_at);
                    e.timestamp(c.last_activity_at);
                    e.opt_text(c.preview.as_deref());
                    e.int4(c.message_count);
                }
            }
            Self::Messages => {
                let mut body = String::with_capacity(512);
                for m in &plan.messages[range] {
                    e.row(7);
                    e.uuid(m.tenant_id);
                    e.uuid(m.id);
                    e.uuid(m.conversation_id);
                    e.text(m.sender.label());
                    e.opt_uuid(m.author_id);
                    plan.body(m, &mut body);
                    e.text(&body);
                    e.timestamp(m.created_at);
                }
            }
        }
        e.into_bytes()
    }

    fn row_bytes_hint(self) -> usize {
        match self {
            Self::Tenants | Self::Inboxes | Self::Contacts => 120,
            Self::Users => 140,
            Self::Conversations => 320,
            Self::Messages => 200,
        }
    }
}
