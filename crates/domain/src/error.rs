//! The domain's one error type; the API maps it to HTTP.

/// What a domain operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    /// No such row in the caller's tenant (including: it exists, but in another tenant).
    #[error("not found")]
    NotFound,
    /// The query itself is malformed: a cursor from another list, a filter combination no index
    /// serves, a page size out of range.
    #[error("{0}")]
    BadQuery(String),
    /// The input is well-formed but not acceptable (a reference to an unknown row, a bad value).
    #[error("{0}")]
    Invalid(String),
    /// The request conflicts with the current state (an idempotency key reused for another body).
    #[error("{0}")]
    Conflict(String),
    /// The token's user or tenant does not exist.
    #[error("the token's user or tenant does not exist")]
    UnknownPrincipal,
    /// No database connection could be had within the pool's acquire timeout (the bulkhead).
    #[error("database pool saturated")]
    PoolSaturated,
    /// The database could not be reached or the statement timed out.
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// Anything else: a bug or an unexpected database error. Logged, never shown to clients.
    #[error("database error")]
    Database(#[source] sqlx::Error),
}

/// The domain's result type.
pub type Result<T> = std::result::Result<T, DomainError>;

impl From<sqlx::Error> for DomainError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::RowNotFound => Self::NotFound,
            sqlx::Error::PoolTimedOut => Self::PoolSaturated,
            sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => Self::Unavailable(err),
            sqlx::Error::Database(db) => match (db.code().as_deref(), db.constraint()) {
                // A foreign key to `users`/`tenants` from the principal's own ids.
                (
                    Some("23503"),
                    Some(
                        "messages_author_fk"
                        | "idempotency_keys_user_fk"
                        | "contacts_tenant_id_fkey"
                        | "conversations_tenant_id_fkey",
                    ),
                ) => Self::UnknownPrincipal,
                (Some("23503"), Some("conversations_inbox_fk")) => {
                    Self::Invalid("inbox_id does not name an inbox of this tenant".into())
                }
                (Some("23503"), Some("conversations_assignee_fk")) => {
                    Self::Invalid("assignee_id does not name a user of this tenant".into())
                }
                (Some("23503"), Some("conversations_contact_fk")) => {
                    Self::Invalid("contact_id does not name a contact of this tenant".into())
                }
                (Some("23514" | "22001"), _) => Self::Invalid("a field is out of range".into()),
                // Data exceptions: a NUL byte in text, a value out of a type's range.
                (Some(code), _) if code.starts_with("22") => Self::Invalid("a value is not acceptable".into()),
                // query_canceled (statement_timeout), admin shutdown, cannot connect now.
                (Some("57014" | "57P01" | "57P02" | "57P03"), _) => Self::Unavailable(err),
                _ => Self::Database(err),
            },
            _ => Self::Database(err),
        }
    }
}
