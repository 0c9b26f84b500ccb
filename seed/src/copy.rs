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

    /// One row: its field count, then each field.
    fn row(&mut self, fields: &[Field<'_>]) {
        let count = i16::try_from(fields.len()).expect("a row under 2^15 fields");
        self.buf.extend_from_slice(&count.to_be_bytes());
        for field in fields {
            self.field(*field);
        }
    }

    fn field(&mut self, field: Field<'_>) {
        match field {
            Field::Uuid(id) => self.value(id.as_bytes()),
            Field::Text(s) => self.value(s.as_bytes()),
            Field::Timestamp(unix_micros) => self.value(&(unix_micros - PG_EPOCH_OFFSET_MICROS).to_be_bytes()),
            Field::Int4(n) => self.value(&i32::try_from(n).expect("a count under 2^31").to_be_bytes()),
            Field::OptUuid(None) | Field::OptText(None) => self.buf.extend_from_slice(&(-1i32).to_be_bytes()),
            Field::OptUuid(Some(id)) => self.field(Field::Uuid(id)),
            Field::OptText(Some(s)) => self.field(Field::Text(s)),
        }
    }

    /// A non-NULL field: its length, then its bytes.
    fn value(&mut self, bytes: &[u8]) {
        let len = i32::try_from(bytes.len()).expect("a field under 2 GiB");
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(bytes);
    }
}

/// One field of a row, as its column's type sends it.
#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    Uuid(Uuid),
    OptUuid(Option<Uuid>),
    /// `text`, and enum labels (an enum's binary form is its label).
    Text(&'a str),
    OptText(Option<&'a str>),
    /// `timestamptz` from Unix microseconds.
    Timestamp(i64),
    Int4(u32),
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
        use Field::{Int4, OptText, OptUuid, Text, Timestamp, Uuid as Id};
        match self {
            Self::Tenants => {
                for t in &plan.tenants[range] {
                    e.row(&[Id(t.id), Text(&t.name), Timestamp(t.created_at)]);
                }
            }
            Self::Users => {
                for u in &plan.users[range] {
                    let role = if u.admin { "admin" } else { "agent" };
                    e.row(&[
                        Id(u.tenant_id),
                        Id(u.id),
                        Text(&u.name),
                        Text(&u.email),
                        Text(role),
                        Timestamp(u.created_at),
                    ]);
                }
            }
            Self::Inboxes => {
                for i in &plan.inboxes[range] {
                    e.row(&[Id(i.tenant_id), Id(i.id), Text(&i.name), Text(i.channel), Timestamp(i.created_at)]);
                }
            }
            Self::Contacts => {
                for c in &plan.contacts[range] {
                    e.row(&[
                        Id(c.tenant_id),
                        Id(c.id),
                        Text(&c.name),
                        OptText(c.email.as_deref()),
                        Timestamp(c.created_at),
                    ]);
                }
            }
            Self::Conversations => {
                for c in &plan.conversations[range] {
                    e.row(&[
                        Id(c.tenant_id),
                        Id(c.id),
                        Id(c.inbox_id),
                        Id(c.contact_id),
                        OptUuid(c.assignee_id),
                        Text(c.status.label()),
                        Timestamp(c.created_at),
                        Timestamp(c.last_activity_at),
                        OptText(c.preview.as_deref()),
                        Int4(c.message_count),
                    ]);
                }
            }
            Self::Messages => {
                let mut body = String::with_capacity(512);
                for m in &plan.messages[range] {
                    plan.body(m, &mut body);
                    e.row(&[
                        Id(m.tenant_id),
                        Id(m.id),
                        Id(m.conversation_id),
                        Text(m.sender.label()),
                        OptUuid(m.author_id),
                        Text(&body),
                        Timestamp(m.created_at),
                    ]);
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
