//! JWT authentication: HS256 tokens carrying `tenant_id`, `sub` (user) and `role`.
//!
//! A request's token is verified once, before admission ([`verify_request`], as
//! [`Verified`] in its extensions): admission's tenant key and the throttles read that outcome,
//! so nothing divides capacity on a claim whose signature was not checked. Handlers take an
//! [`Auth`], so no handler can reach the domain without a verified tenant. A token that passed is
//! remembered by its exact text, so a client's next request with it costs a lookup and an expiry
//! check ([`JwtKeys::principal`]).

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use breakwater_domain::tenants::Role;
use breakwater_domain::{TenantId, UserId};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, get_current_timestamp};
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use uuid::Uuid;

use crate::error::ApiError;
use crate::state::AppState;

/// The token's claims.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The tenant the token acts for.
    pub tenant_id: Uuid,
    /// The user (a `users.id` of that tenant).
    pub sub: Uuid,
    /// The user's role.
    pub role: Role,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Not valid before, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// The issuer, checked when `JWT_ISSUER` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// The audience, checked when `JWT_AUDIENCE` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
}

impl Claims {
    /// The claims every token carries; no `nbf`, `iss` or `aud`.
    #[must_use]
    pub fn new(tenant_id: Uuid, sub: Uuid, role: Role, exp: u64) -> Self {
        Self { tenant_id, sub, role, exp, nbf: None, iss: None, aud: None }
    }
}

/// What a token must satisfy beyond its signature and expiry.
#[derive(Debug, Clone, Default)]
pub struct TokenPolicy {
    /// The longest a token may still be valid for (`exp` minus now), seconds; `None`: no limit.
    pub max_ttl_secs: Option<u64>,
    /// The `iss` every token must carry, when set.
    pub issuer: Option<String>,
    /// The `aud` every token must carry, when set.
    pub audience: Option<String>,
}

/// Clock skew allowed on `exp` and `nbf`, seconds.
const LEEWAY_SECS: u64 = 30;

/// How many verified tokens one process remembers ([`JwtKeys::principal`]): about 3 MB at the
/// seed's token size, more distinct tokens than a task sees in use at once at the production
/// shape (the lab's 1,000-caller step has 1,000).
pub const VERIFIED_TOKENS: usize = 10_000;

/// Signing and verifying keys, derived once from the secret, and the tokens they verified lately.
#[derive(Clone)]
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    max_ttl_secs: Option<u64>,
    /// Tokens that passed every check of [`Self::verify`], by their exact text: the principal
    /// and `exp`. Shared by clones (one per process).
    verified: Arc<quick_cache::sync::Cache<Box<str>, (Auth, u64)>>,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JwtKeys(..)")
    }
}

impl JwtKeys {
    /// Keys for an HS256 secret, with no policy beyond signature, expiry and `nbf`.
    #[must_use]
    pub fn new(secret: &SecretString) -> Self {
        Self::with_policy(secret, &TokenPolicy::default())
    }

    /// Keys for an HS256 secret that also enforce `policy`.
    #[must_use]
    pub fn with_policy(secret: &SecretString, policy: &TokenPolicy) -> Self {
        let bytes = secret.expose_secret().as_bytes();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(issuer) = &policy.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        match &policy.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        Self {
            encoding: EncodingKey::from_secret(bytes),
            decoding: DecodingKey::from_secret(bytes),
            validation,
            max_ttl_secs: policy.max_ttl_secs,
            verified: Arc::new(quick_cache::sync::Cache::new(VERIFIED_TOKENS)),
        }
    }

    /// Signs a token.
    ///
    /// # Errors
    /// When signing fails (it does not, for HS256 and these claims).
    pub fn mint(&self, claims: &Claims) -> Result<String, jsonwebtoken::errors::Error> {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
    }

    /// Verifies a token's signature, algorithm, expiry, `nbf`, lifetime, issuer and audience,
    /// and returns its claims.
    ///
    /// # Errors
    /// [`ApiError::Unauthorized`] for anything but a valid, current token of ours.
    pub fn verify(&self, token: &str) -> Result<Claims, ApiError> {
        use jsonwebtoken::errors::ErrorKind;
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map(|data| data.claims)
            .map_err(|err| match err.kind() {
                ErrorKind::ExpiredSignature => ApiError::Unauthorized("token expired"),
                ErrorKind::ImmatureSignature => ApiError::Unauthorized("token not valid yet (nbf)"),
                ErrorKind::InvalidIssuer => ApiError::Unauthorized("token issuer not accepted"),
                ErrorKind::InvalidAudience => ApiError::Unauthorized("token audience not accepted"),
                _ => ApiError::Unauthorized("invalid token"),
            })?;
        if let Some(max) = self.max_ttl_secs
            && claims.exp > get_current_timestamp().saturating_add(max).saturating_add(LEEWAY_SECS)
        {
            return Err(ApiError::Unauthorized("token lifetime exceeds the maximum (JWT_MAX_TTL_SECS)"));
        }
        Ok(claims)
    }

    /// The principal of a token: [`Self::verify`]'s answer, remembered.
    ///
    /// A client sends the same token on every request until it expires, and a refusal paid for
    /// verifying it as much as a served request: HS256's SHA-256, two base64 decodes and two JSON
    /// parses were 17% of a kept-alive refusal's CPU (docs/ADMISSION.md). So a token that passed
    /// every check is remembered by its exact text, and the same text again is answered from
    /// memory, its expiry checked on each use as [`Self::verify`] checks it. The other checks cannot
    /// change their answer as time passes (a token past its `nbf`, within the maximum lifetime,
    /// with our issuer and audience stays so, and the keys are fixed for the process). Only
    /// tokens that passed go in, so a forged or altered one is never answered from memory; an
    /// expired one is forgotten and gets [`Self::verify`]'s 401. At most [`VERIFIED_TOKENS`]
    /// are kept (S3-FIFO eviction: tokens seen once do not push out the ones in use).
    ///
    /// # Errors
    /// [`Self::verify`]'s.
    pub fn principal(&self, token: &str) -> Result<Auth, ApiError> {
        if let Some((auth, exp)) = self.verified.get(token) {
            if exp.saturating_add(LEEWAY_SECS) >= get_current_timestamp() {
                return Ok(auth);
            }
            self.verified.remove(token);
        }
        let claims = self.verify(token)?;
        let auth = Auth { tenant: TenantId(claims.tenant_id), user: UserId(claims.sub), role: claims.role };
        self.verified.insert(token.into(), (auth, claims.exp));
        Ok(auth)
    }
}

/// The verified principal of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auth {
    /// Whose data the request may touch.
    pub tenant: TenantId,
    /// Who is acting.
    pub user: UserId,
    /// What they may do.
    pub role: Role,
}

impl Auth {
    /// Reads and verifies the bearer token of a request.
    ///
    /// # Errors
    /// [`ApiError::Unauthorized`] when it is missing, malformed, expired or forged.
    pub fn from_headers(headers: &axum::http::HeaderMap, keys: &JwtKeys) -> Result<Self, ApiError> {
        let value =
            headers.get(header::AUTHORIZATION).ok_or(ApiError::Unauthorized("missing Authorization: Bearer token"))?;
        let value = value.to_str().map_err(|_| ApiError::Unauthorized("invalid Authorization header"))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(ApiError::Unauthorized("expected Authorization: Bearer token"))?;
        keys.principal(token.trim())
    }
}

/// The outcome of verifying a request's token, set by [`verify_request`] before admission: the
/// principal, or why there is none (the 401's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified(pub Result<Auth, &'static str>);

/// Verifies the request's token once (HS256: a few microseconds the first time a token is seen,
/// a lookup after that: [`JwtKeys::principal`]) and records the outcome.
pub fn verify_request<B>(keys: &JwtKeys, mut req: axum::http::Request<B>) -> axum::http::Request<B> {
    let outcome = Auth::from_headers(req.headers(), keys).map_err(|e| match e {
        ApiError::Unauthorized(why) => why,
        _ => "invalid token",
    });
    req.extensions_mut().insert(Verified(outcome));
    req
}

impl Auth {
    /// The request's principal: the outcome [`verify_request`] recorded, or (when that layer did
    /// not run) the token verified now.
    ///
    /// # Errors
    /// [`ApiError::Unauthorized`] when the token is missing, malformed, expired or forged.
    pub fn of_request(
        extensions: &axum::http::Extensions,
        headers: &axum::http::HeaderMap,
        keys: &JwtKeys,
    ) -> Result<Self, ApiError> {
        match extensions.get::<Verified>() {
            Some(Verified(outcome)) => outcome.map_err(ApiError::Unauthorized),
            None => Self::from_headers(headers, keys),
        }
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        // An outer layer (the throttles) may have verified the token already.
        if let Some(auth) = parts.extensions.get::<Self>() {
            return Ok(*auth);
        }
        let auth = Self::of_request(&parts.extensions, &parts.headers, &state.jwt)?;
        parts.extensions.insert(auth);
        Ok(auth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn keys() -> JwtKeys {
        JwtKeys::new(&SecretString::from("test-secret-test-secret-test-secret"))
    }

    fn claims(exp: u64) -> Claims {
        Claims::new(Uuid::now_v7(), Uuid::now_v7(), Role::Agent, exp)
    }

    fn now() -> u64 {
        u64::try_from(chrono::Utc::now().timestamp()).expect("after 1970")
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).expect("ascii"));
        h
    }

    #[test]
    fn accepts_a_valid_token() {
        let c = claims(now() + 60);
        let token = keys().mint(&c).expect("mint");
        let auth = Auth::from_headers(&headers(&format!("Bearer {token}")), &keys()).expect("valid");
        assert_eq!(auth.tenant, TenantId(c.tenant_id));
        assert_eq!(auth.user, UserId(c.sub));
    }

    #[test]
    fn rejects_expired_forged_and_malformed_tokens() {
        let expired = keys().mint(&claims(now() - 3600)).expect("mint");
        let other = JwtKeys::new(&SecretString::from("another-secret-another-secret-xx"));
        let forged = other.mint(&claims(now() + 60)).expect("mint");
        // alg=none: a header that asks us to skip verification.
        let none = format!(
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{}.",
            base64_url(&serde_json::to_vec(&claims(now() + 60)).expect("json"))
        );
        for value in [
            format!("Bearer {expired}"),
            format!("Bearer {forged}"),
            format!("Bearer {none}"),
            "Bearer".into(),
            "Basic abc".into(),
            "Bearer a.b.c".into(),
        ] {
            assert!(matches!(Auth::from_headers(&headers(&value), &keys()), Err(ApiError::Unauthorized(_))), "{value}");
        }
        assert!(Auth::from_headers(&HeaderMap::new(), &keys()).is_err());
    }

    #[test]
    fn the_policy_refuses_long_lived_immature_and_foreign_tokens() {
        let secret = SecretString::from("test-secret-test-secret-test-secret");
        let policy = TokenPolicy {
            max_ttl_secs: Some(3600),
            issuer: Some("https://id.example.com".into()),
            audience: Some("breakwater".into()),
        };
        let strict = JwtKeys::with_policy(&secret, &policy);
        let good = || Claims {
            iss: Some("https://id.example.com".into()),
            aud: Some("breakwater".into()),
            ..claims(now() + 600)
        };
        let verify = |c: &Claims| strict.verify(&strict.mint(c).expect("mint"));
        assert!(verify(&good()).is_ok());
        let cases: [(&str, Claims, &str); 6] = [
            (
                "year 9999",
                Claims { exp: 253_402_300_799, ..good() },
                "token lifetime exceeds the maximum (JWT_MAX_TTL_SECS)",
            ),
            ("nbf in an hour", Claims { nbf: Some(now() + 3600), ..good() }, "token not valid yet (nbf)"),
            (
                "another issuer",
                Claims { iss: Some("https://evil.example.com".into()), ..good() },
                "token issuer not accepted",
            ),
            ("no issuer", Claims { iss: None, ..good() }, "invalid token"),
            ("another audience", Claims { aud: Some("someone-else".into()), ..good() }, "token audience not accepted"),
            ("no audience", Claims { aud: None, ..good() }, "invalid token"),
        ];
        for (name, c, why) in cases {
            match verify(&c) {
                Err(ApiError::Unauthorized(got)) => assert_eq!(got, why, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        // A past nbf, and a lifetime just inside the maximum, pass.
        assert!(verify(&Claims { nbf: Some(now() - 60), exp: now() + 3590, ..good() }).is_ok());
        // Without an issuer or audience configured, tokens carrying either are still accepted.
        let lax = JwtKeys::new(&secret);
        assert!(lax.verify(&lax.mint(&good()).expect("mint")).is_ok());
    }

    #[test]
    fn a_remembered_token_is_answered_alike_until_it_expires() {
        let keys = keys();
        // Valid for about a second past the leeway.
        let c = claims(now() + 1 - LEEWAY_SECS);
        let token = keys.mint(&c).expect("mint");
        let first = keys.principal(&token).expect("valid");
        assert_eq!(keys.verified.len(), 1, "a verified token is remembered");
        let again = keys.principal(&token).expect("valid, from memory");
        assert_eq!(first, again);
        assert_eq!((again.tenant, again.user, again.role), (TenantId(c.tenant_id), UserId(c.sub), Role::Agent));
        // Clones share the memory (hyper clones the state per connection).
        assert_eq!(keys.clone().verified.len(), 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while now() <= c.exp + LEEWAY_SECS {
            assert!(std::time::Instant::now() < deadline, "the clock did not move");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        match keys.principal(&token) {
            Err(ApiError::Unauthorized(why)) => assert_eq!(why, "token expired"),
            other => panic!("an expired token was answered from memory: {other:?}"),
        }
        assert_eq!(keys.verified.len(), 0, "an expired token is forgotten");
    }

    #[test]
    fn only_tokens_that_pass_are_remembered_and_one_changed_byte_is_refused() {
        let keys = keys();
        let token = keys.mint(&claims(now() + 600)).expect("mint");
        let other = JwtKeys::new(&SecretString::from("another-secret-another-secret-xx"));
        let forged = other.mint(&claims(now() + 600)).expect("mint");
        assert!(keys.principal(&forged).is_err());
        assert!(keys.principal(&keys.mint(&claims(now() - 3600)).expect("mint")).is_err());
        assert_eq!(keys.verified.len(), 0, "refused tokens are not remembered");
        keys.principal(&token).expect("valid");
        // The remembered token's text with any one character changed (its claims or its
        // signature) is a different key, verified in full, and refused.
        for i in 0..token.len() {
            let mut altered = token.clone().into_bytes();
            altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(altered).expect("ascii");
            assert!(keys.principal(&altered).is_err(), "byte {i} changed was accepted");
        }
        assert_eq!(keys.verified.len(), 1);
    }

    fn base64_url(bytes: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_headers_never_panic(value in "[ -~]{0,300}") {
            if let Ok(v) = HeaderValue::from_str(&value) {
                let mut h = HeaderMap::new();
                h.insert(header::AUTHORIZATION, v);
                proptest::prop_assert!(Auth::from_headers(&h, &keys()).is_err());
            }
        }
    }
}
