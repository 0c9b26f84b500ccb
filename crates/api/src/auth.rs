//! JWT authentication: HS256 tokens carrying `tenant_id`, `sub` (user) and `role`.
//!
//! A request's token is verified once, before admission ([`verify_request`], as
//! [`Verified`] in its extensions): admission's tenant key and the throttles read that outcome,
//! so nothing divides capacity on a claim whose signature was not checked. Handlers take an
//! [`Auth`], so no handler can reach the domain without a verified tenant.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use breakwater_domain::tenants::Role;
use breakwater_domain::{TenantId, UserId};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};
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

/// Signing and verifying keys, derived once from the secret.
#[derive(Clone)]
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    max_ttl_secs: Option<u64>,
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
        if let Some(max) = self.max_ttl_secs {
            let now = u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
            if claims.exp > now.saturating_add(max).saturating_add(LEEWAY_SECS) {
                return Err(ApiError::Unauthorized("token lifetime exceeds the maximum (JWT_MAX_TTL_SECS)"));
            }
        }
        Ok(claims)
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
        let claims = keys.verify(token.trim())?;
        Ok(Self { tenant: TenantId(claims.tenant_id), user: UserId(claims.sub), role: claims.role })
    }
}

/// The outcome of verifying a request's token, set by [`verify_request`] before admission: the
/// principal, or why there is none (the 401's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified(pub Result<Auth, &'static str>);

/// Verifies the request's token once (HS256: a few microseconds, the price of a base64 and JSON
/// decode that reading the claim unverified paid anyway) and records the outcome.
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
