//! The PostgreSQL enums the seed writes, shared by the plan (which draws them) and the text
//! generator (which writes a message in its sender's voice).

/// Who wrote a message (`message_sender`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The end customer.
    Contact,
    /// An agent of the tenant.
    Agent,
    /// The platform.
    System,
}

impl Sender {
    /// The enum label in PostgreSQL.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Contact => "contact",
            Self::Agent => "agent",
            Self::System => "system",
        }
    }
}

/// Where a conversation stands (`conversation_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting for an agent.
    Open,
    /// Waiting for the contact.
    Pending,
    /// Done.
    Closed,
}

impl Status {
    /// The enum label in PostgreSQL.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Pending => "pending",
            Self::Closed => "closed",
        }
    }
}
