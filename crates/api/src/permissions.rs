//! Who may do what: the permission table, the one owner of every operation's role.
//!
//! The authentication middleware enforces it (`throttle_layer.rs`, right after the token is
//! verified, before the throttles and the bulkhead), the OpenAPI document publishes it as each
//! operation's bearer scope (`openapi.rs`), and README.md's table is checked against it by a
//! test. A route missing from the table is refused to every role (it fails closed), and the
//! document's test fails on an operation without a declared role.

use axum::http::Method;
use breakwater_domain::tenants::Role;

/// One operation and the least role that may call it.
#[derive(Debug, Clone)]
pub struct Permission {
    /// The HTTP method.
    pub method: Method,
    /// The route's path template, as the router and the OpenAPI document spell it.
    pub path: &'static str,
    /// The least role allowed: an admin may do everything an agent may.
    pub role: Role,
}

const fn allow(method: Method, path: &'static str, role: Role) -> Permission {
    Permission { method, path, role }
}

/// Every tenant operation. Erasure is irreversible and is an admin's alone.
// A table: its rows look alike because each is one operation's entry.
pub static PERMISSIONS: [Permission; 12] = [
    allow(Method::GET, "/v1/conversations", Role::Agent),
    allow(Method::GET, "/v1/conversations/counts", Role::Agent),
    allow(Method::POST, "/v1/conversations", Role::Agent),
    allow(Method::GET, "/v1/conversations/{id}", Role::Agent),
    allow(Method::PATCH, "/v1/conversations/{id}", Role::Agent),
    allow(Method::GET, "/v1/conversations/{id}/messages", Role::Agent),
    allow(Method::POST, "/v1/conversations/{id}/messages", Role::Agent),
    allow(Method::GET, "/v1/contacts", Role::Agent),
    allow(Method::POST, "/v1/contacts", Role::Agent),
    allow(Method::GET, "/v1/contacts/{id}", Role::Agent),
    allow(Method::DELETE, "/v1/contacts/{id}", Role::Admin),
    allow(Method::GET, "/v1/stream", Role::Agent),
];

/// The least role for an operation, or `None` when the table does not list it.
#[must_use]
pub fn required(method: &Method, path: &str) -> Option<Role> {
    PERMISSIONS.iter().find(|p| p.method == *method && p.path == path).map(|p| p.role)
}

/// Whether `role` may do what `required` allows.
#[must_use]
pub fn satisfies(role: Role, required: Role) -> bool {
    rank(role) >= rank(required)
}

fn rank(role: Role) -> u8 {
    match role {
        Role::Agent => 0,
        Role::Admin => 1,
    }
}

/// A role as the token and the document spell it.
#[must_use]
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Agent => "agent",
        Role::Admin => "admin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erasure_is_for_admins_and_the_rest_for_every_role() {
        let erase = required(&Method::DELETE, "/v1/contacts/{id}").expect("listed");
        assert!(!satisfies(Role::Agent, erase));
        assert!(satisfies(Role::Admin, erase));
        let reply = required(&Method::POST, "/v1/conversations/{id}/messages").expect("listed");
        assert!(satisfies(Role::Agent, reply) && satisfies(Role::Admin, reply));
        assert_eq!(required(&Method::DELETE, "/v1/conversations/{id}"), None, "unlisted: fails closed");
    }

    #[test]
    fn each_operation_is_listed_once() {
        for (i, p) in PERMISSIONS.iter().enumerate() {
            let again = PERMISSIONS.iter().skip(i + 1).any(|q| q.method == p.method && q.path == p.path);
            assert!(!again, "{} {} is listed twice", p.method, p.path);
        }
    }
}
