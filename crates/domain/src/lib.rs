//! Breakwater's chat domain: tenants, inboxes, contacts, conversations, messages and jobs.
//!
//! Architecture invariant: this crate knows nothing of HTTP, Redis or admission control. Every
//! query takes a [`TenantId`] and filters by it, so no caller can read across tenants.
