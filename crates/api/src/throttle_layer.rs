//! The throttle middleware: takes the verified principal (the token was verified before
//! admission, `auth::verify_request`; the handler does not verify it again), checks the
//! caller's role against the permission table (403, `permissions.rs`), finds the client's
//! address, and asks the throttles; 429 with `Retry-After` and the envelope when a bucket ran
//! out, the IETF `RateLimit-Policy`/`RateLimit` headers on every answer.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Response};
use axum::middleware::Next;
use axum::response::IntoResponse as _;

use crate::auth::Auth;
use crate::error::ApiError;
use crate::state::AppState;
use crate::throttle::{Decision, Limit};

/// The client's address: the socket's peer, or, behind `trusted_proxies` proxies that each
/// append to `X-Forwarded-For`, the entry that many places from the right. Entries further left
/// are the client's own claims and are never trusted, so a forged header cannot pick a bucket.
#[must_use]
pub fn client_ip(headers: &HeaderMap, peer: Option<SocketAddr>, trusted_proxies: usize) -> IpAddr {
    let socket = peer.map_or(IpAddr::from([0, 0, 0, 0]), |p| p.ip());
    if trusted_proxies == 0 {
        return socket;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    // The last `trusted_proxies` hops were appended by our proxies; the one they saw is the client.
    hops.len()
        .checked_sub(trusted_proxies)
        .and_then(|i| hops.get(i))
        .and_then(|s| s.parse::<IpAddr>().ok())
        .unwrap_or(socket)
}

fn ceil_secs(us: i64) -> u64 {
    u64::try_from((us.max(0) + 999_999) / 1_000_000).unwrap_or(u64::MAX)
}

fn insert_rate_headers(headers: &mut HeaderMap, name: &str, limit: Limit, remaining: u64, reset_us: i64) {
    let policy = format!("\"{name}\";q={};w={}", limit.burst, limit.window_secs());
    let state = format!("\"{name}\";r={remaining};t={}", ceil_secs(reset_us));
    if let (Ok(p), Ok(s)) = (HeaderValue::from_str(&policy), HeaderValue::from_str(&state)) {
        headers.insert("ratelimit-policy", p);
        headers.insert("ratelimit", s);
    }
}

/// Refuses a role the permission table does not allow for this route (every role, for a route
/// the table does not list).
fn authorize(req: &Request, auth: Auth) -> Result<(), ApiError> {
    let path = req.extensions().get::<MatchedPath>().map_or("", MatchedPath::as_str);
    // axum answers HEAD on a GET route: it needs what the GET needs.
    let method = if req.method() == axum::http::Method::HEAD { &axum::http::Method::GET } else { req.method() };
    match crate::permissions::required(method, path) {
        Some(required) if crate::permissions::satisfies(auth.role, required) => Ok(()),
        Some(required) => Err(ApiError::Forbidden(crate::permissions::role_name(required))),
        None => {
            tracing::error!(method = %req.method(), path, "a route missing from the permission table");
            Err(ApiError::Forbidden("a listed"))
        }
    }
}

/// Middleware: authenticate and authorize, then throttle.
pub(crate) async fn throttle(State(state): State<AppState>, mut req: Request, next: Next) -> Response<Body> {
    let verified = Auth::of_request(req.extensions(), req.headers(), &state.jwt);
    let auth = match verified.and_then(|auth| authorize(&req, auth).map(|()| auth)) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    req.extensions_mut().insert(auth);
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let ip = client_ip(req.headers(), peer, state.config.throttle.trusted_proxies);
    match state.throttles.check(auth.tenant, auth.user, ip).await {
        Decision::Off => next.run(req).await,
        Decision::Admitted { kind, limit, remaining, reset_us } => {
            let mut response = next.run(req).await;
            insert_rate_headers(response.headers_mut(), kind.as_str(), limit, remaining, reset_us);
            response
        }
        Decision::Refused { kind, limit, retry_after_us } => refused(kind, limit, retry_after_us),
    }
}

/// The whole seconds a refusal's `Retry-After` says for a bucket that admits again in
/// `retry_after_us`: rounded up, and at least one (HTTP's delta-seconds cannot say less).
#[must_use]
pub(crate) fn told_retry_after(retry_after_us: i64) -> u64 {
    ceil_secs(retry_after_us).max(1)
}

/// The 429 of a bucket that ran out: the envelope, `Retry-After` and the `RateLimit` headers.
pub(crate) fn refused(kind: crate::throttle::KeyKind, limit: Limit, retry_after_us: i64) -> Response<Body> {
    let retry_after = told_retry_after(retry_after_us);
    let mut response = ApiError::RateLimited { kind: kind.as_str(), retry_after }.into_response();
    insert_rate_headers(response.headers_mut(), kind.as_str(), limit, 0, retry_after_us);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(v).expect("ascii"));
        h
    }

    #[test]
    fn forwarded_for_is_trusted_only_as_far_as_configured() {
        let peer = Some(SocketAddr::from(([10, 0, 0, 7], 4000)));
        let socket: IpAddr = [10, 0, 0, 7].into();
        assert_eq!(client_ip(&xff("1.2.3.4"), peer, 0), socket, "no proxy: the header is ignored");
        assert_eq!(client_ip(&xff("6.6.6.6, 1.2.3.4"), peer, 1), "1.2.3.4".parse::<IpAddr>().expect("ip"));
        assert_eq!(client_ip(&xff("6.6.6.6, 1.2.3.4, 10.0.0.2"), peer, 2), "1.2.3.4".parse::<IpAddr>().expect("ip"));
        assert_eq!(client_ip(&xff("garbage"), peer, 1), socket);
        assert_eq!(client_ip(&HeaderMap::new(), peer, 1), socket);
    }
}
