//! Property tests over the three parsers that face raw client input: the JWT extractor (through
//! the whole served app, so the layers around it are covered too), the error envelope, and the
//! cursor codec. No database is needed: every case is refused before one is touched (the pool
//! points at a closed port and is never reached).

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::IntoResponse as _;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use breakwater_api::auth::{Claims, JwtKeys};
use breakwater_api::config::{Config, DEV_JWT_SECRET};
use breakwater_api::error::ApiError;
use breakwater_domain::Cursor;
use breakwater_domain::tenants::Role;
use http_body_util::BodyExt as _;
use proptest::prelude::*;
use secrecy::SecretString;
use serde_json::Value;
use tower::ServiceExt as _;
use uuid::Uuid;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"))
}

fn state() -> &'static breakwater_api::AppState {
    static STATE: OnceLock<breakwater_api::AppState> = OnceLock::new();
    STATE.get_or_init(|| {
        let _guard = runtime().enter();
        // Nothing listens on port 1: a request that got as far as the database would fail
        // loudly (503 db_unavailable), which the properties below would report.
        let config = Config::from_args([
            "--app-env",
            "development",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--throttles",
            "off",
        ])
        .expect("config");
        let pool = config.db.pool().expect("lazy pool");
        let redis = breakwater_api::redis::pool(&config.redis_url, config.redis_cluster).expect("redis pool");
        breakwater_api::AppState::new(config, pool, redis).expect("state")
    })
}

/// Sends one request through the whole app (body cap, admission, routing, auth, handler).
fn send(req: Request<Body>) -> (StatusCode, Option<HeaderValue>, Value) {
    runtime().block_on(async {
        let response = breakwater_api::app(state().clone()).oneshot(req).await.expect("infallible");
        let status = response.status();
        let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, retry_after, body)
    })
}

/// The envelope's fixed shape: exactly these keys, these types.
fn assert_envelope(body: &Value) -> Result<(), TestCaseError> {
    let obj = body.as_object().ok_or_else(|| TestCaseError::fail(format!("not an object: {body}")))?;
    prop_assert_eq!(obj.keys().collect::<Vec<_>>(), vec!["error"]);
    let error = body["error"].as_object().ok_or_else(|| TestCaseError::fail("error is not an object"))?;
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    prop_assert_eq!(keys, vec!["code", "message", "recovery", "type"]);
    prop_assert!(body["error"]["type"].is_string() && body["error"]["code"].is_string());
    prop_assert!(body["error"]["message"].is_string());
    let recovery = body["error"]["recovery"].as_object().ok_or_else(|| TestCaseError::fail("recovery"))?;
    prop_assert!(recovery["retryable"].is_boolean());
    for key in recovery.keys() {
        prop_assert!(key == "retryable" || key == "retry_after_seconds", "unexpected recovery key {key}");
    }
    prop_assert_eq!(recovery["retryable"].as_bool(), Some(recovery.contains_key("retry_after_seconds")));
    Ok(())
}

/// The authenticated routes, one per handler shape.
const PROTECTED: &[(&str, &str)] = &[
    ("GET", "/v1/conversations"),
    ("GET", "/v1/conversations/0190a9a0-0000-7000-8000-000000000000"),
    ("POST", "/v1/conversations/0190a9a0-0000-7000-8000-000000000000/messages"),
    ("DELETE", "/v1/contacts/0190a9a0-0000-7000-8000-000000000000"),
    ("GET", "/v1/contacts?name=x"),
];

fn with_authorization(route: usize, value: HeaderValue) -> Request<Body> {
    let (method, path) = PROTECTED[route % PROTECTED.len()];
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, value)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{\"body\":\"x\"}"))
        .expect("request")
}

fn assert_unauthorized(req: Request<Body>) -> Result<(), TestCaseError> {
    let (status, _, body) = send(req);
    prop_assert_eq!(status, StatusCode::UNAUTHORIZED, "{}", body);
    assert_envelope(&body)?;
    prop_assert_eq!(body["error"]["code"].as_str(), Some("unauthorized"));
    Ok(())
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// An HS256 signature over `header.payload` with the server's key: a token we signed, whatever
/// its content.
fn signed(header_json: &[u8], payload_json: &[u8]) -> String {
    use hmac::{Hmac, Mac as _};
    let signing_input = format!("{}.{}", b64(header_json), b64(payload_json));
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(DEV_JWT_SECRET.as_bytes()).expect("any key length");
    mac.update(signing_input.as_bytes());
    format!("{signing_input}.{}", b64(&mac.finalize().into_bytes()))
}

fn json_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::from),
        Just(Value::from(Uuid::now_v7().to_string())),
        Just(Value::from("admin")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any bytes a header may carry: 401 with the envelope, never a panic or a 500.
    #[test]
    fn any_authorization_header_is_a_401_envelope(
        route in any::<usize>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            assert_unauthorized(with_authorization(route, value))?;
        }
    }

    /// Bearer tokens shaped like JWTs (three base64url segments of anything).
    #[test]
    fn jwt_shaped_garbage_is_a_401_envelope(
        route in any::<usize>(),
        scheme in prop_oneof![Just("Bearer "), Just("bearer "), Just("Bearer  "), Just("BEARER ")],
        segments in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..5),
    ) {
        let token = segments.iter().map(|s| b64(s)).collect::<Vec<_>>().join(".");
        let value = HeaderValue::from_str(&format!("{scheme}{token}")).expect("base64url is visible ASCII");
        assert_unauthorized(with_authorization(route, value))?;
    }

    /// Tokens we really signed, with claims of the wrong shape or a header naming another
    /// algorithm: the signature is right, the token is still refused.
    #[test]
    fn validly_signed_tokens_with_bad_claims_are_a_401_envelope(
        route in any::<usize>(),
        alg in prop_oneof![
            Just("HS256".to_owned()), Just("none".to_owned()), Just("HS512".to_owned()), Just("RS256".to_owned()),
            ".{0,8}",
        ],
        tenant_id in json_scalar(),
        sub in json_scalar(),
        role in json_scalar(),
        exp in json_scalar(),
        drop in any::<u8>(),
    ) {
        let mut claims = serde_json::Map::new();
        for (i, (k, v)) in [("tenant_id", tenant_id), ("sub", sub), ("role", role), ("exp", exp)].into_iter().enumerate() {
            if drop & (1 << i) == 0 {
                claims.insert(k.to_owned(), v);
            }
        }
        let well_formed = serde_json::from_value::<Claims>(Value::Object(claims.clone())).ok();
        let now = u64::try_from(chrono::Utc::now().timestamp()).expect("after 1970");
        // A claim set that happens to be valid and unexpired (with the 30 s leeway) under HS256 is
        // a real token: skip it.
        prop_assume!(!(alg == "HS256" && well_formed.is_some_and(|c| c.exp.saturating_add(60) > now)));
        let header_json = serde_json::to_vec(&serde_json::json!({"alg": alg, "typ": "JWT"})).expect("json");
        let token = signed(&header_json, &serde_json::to_vec(&claims).expect("json"));
        let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("ascii");
        assert_unauthorized(with_authorization(route, value))?;
    }

    /// Every error, with any message, renders the fixed envelope as valid JSON, with the
    /// status its type names and `Retry-After` exactly when it is retryable.
    #[test]
    fn every_error_renders_the_fixed_envelope(variant in 0usize..14, msg in any::<String>(), secs in 0u64..100_000) {
        let err = match variant {
            0 => ApiError::InvalidRequest(msg.clone()),
            1 => ApiError::Unprocessable(msg.clone()),
            2 => ApiError::Unauthorized("invalid token"),
            3 => ApiError::NotFound,
            4 => ApiError::MethodNotAllowed,
            5 => ApiError::Conflict(msg.clone()),
            6 => ApiError::BodyTooLarge { limit: usize::try_from(secs).expect("small") },
            7 => ApiError::RateLimited { kind: "tenant", retry_after: secs },
            8 => ApiError::DbSaturated,
            9 => ApiError::DbUnavailable,
            10 => ApiError::Timeout,
            11 => ApiError::BodyTimeout { timeout: std::time::Duration::from_millis(secs) },
            12 => ApiError::Forbidden("admin"),
            _ => ApiError::Internal(anyhow::anyhow!("{msg}")),
        };
        let (status, code) = err.parts();
        let (kind, code) = (code.kind(), code.as_str());
        let carries_message = matches!(variant, 0 | 1 | 5);
        let response = err.into_response();
        prop_assert_eq!(response.status(), status);
        let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
        let bytes = runtime().block_on(response.into_body().collect()).expect("body").to_bytes();
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
        assert_envelope(&body)?;
        prop_assert_eq!(body["error"]["type"].as_str(), Some(kind));
        prop_assert_eq!(body["error"]["code"].as_str(), Some(code));
        if carries_message {
            prop_assert_eq!(body["error"]["message"].as_str(), Some(msg.as_str()));
        } else if variant == 13 {
            // An internal error's cause is logged, never rendered.
            prop_assert_eq!(body["error"]["message"].as_str(), Some("internal error"));
        }
        let retryable = body["error"]["recovery"]["retryable"].as_bool().unwrap_or(false);
        prop_assert_eq!(retry_after.is_some(), retryable);
        if let Some(v) = retry_after {
            prop_assert_eq!(
                v.to_str().ok().and_then(|s| s.parse::<u64>().ok()),
                body["error"]["recovery"]["retry_after_seconds"].as_u64()
            );
        }
    }

    /// Any string given as a cursor is a typed error or a cursor that re-encodes to itself
    /// (never a panic).
    #[test]
    fn any_cursor_string_is_a_typed_error_or_a_stable_cursor(s in ".{0,300}") {
        match Cursor::decode(&s) {
            Err(_) => {}
            Ok(c) => prop_assert_eq!(Cursor::decode(&c.encode()), Ok(c)),
        }
    }

    /// Structured garbage inside valid base64url: both cursor forms, broken in every field.
    #[test]
    fn cursor_payload_garbage_is_a_typed_error_or_a_stable_cursor(
        form in prop_oneof![Just("t:"), Just("s:"), Just(""), Just("x:")],
        a in "[-0-9a-f:]{0,40}",
        b in ".{0,60}",
    ) {
        let raw = format!("{form}{a}:{b}");
        match Cursor::decode(&b64(raw.as_bytes())) {
            Err(_) => {}
            Ok(c) => prop_assert_eq!(Cursor::decode(&c.encode()), Ok(c)),
        }
    }

    /// Round trips, for both forms, over their whole domains.
    #[test]
    fn cursors_round_trip(micros in -62_135_596_800_000_000i64..253_402_300_799_000_000, id in any::<u128>(),
                          key in "[^\u{0}]{0,200}") {
        let at = chrono::DateTime::from_timestamp_micros(micros).expect("in range");
        for c in [Cursor::Time(at, Uuid::from_u128(id)), Cursor::Text(key.clone(), Uuid::from_u128(id))] {
            prop_assert_eq!(Cursor::decode(&c.encode()), Ok(c));
        }
    }
}

/// The property harness is not vacuous: a real token of ours passes the extractor (and then
/// fails only at the unreachable database, with the typed 503).
#[test]
fn a_valid_token_gets_past_auth() {
    let keys = JwtKeys::new(&SecretString::from(DEV_JWT_SECRET));
    let exp = u64::try_from(chrono::Utc::now().timestamp()).expect("after 1970") + 600;
    let token = keys.mint(&Claims::new(Uuid::now_v7(), Uuid::now_v7(), Role::Agent, exp)).expect("mint");
    let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("ascii");
    let (status, retry_after, body) = send(with_authorization(0, value));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(retry_after.is_some());
    assert!(
        matches!(body["error"]["code"].as_str(), Some("db_unavailable" | "db_saturated")),
        "a valid token reaches the database layer: {body}"
    );
}
