//! How a response is counted. A refusal (429, or a 503 carrying a typed `code`) is the service
//! working as designed and is never an error; an error is anything else that went wrong.

use http::HeaderMap;
use serde::{Deserialize, Serialize};

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum Outcome {
    /// A 2xx (and, where a JSON body is expected, one that parses).
    Ok,
    /// 429, or 503 with the typed envelope: counted by its `code`.
    Refused { code: String, retry_after: bool },
    /// Other 5xx, unexpected 4xx, 503 without a typed code, timeouts, resets, bad bodies.
    Error { kind: String },
}

impl Outcome {
    pub fn error(kind: impl Into<String>) -> Self {
        Self::Error { kind: kind.into() }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok)
    }
}

/// The `error.code` of Breakwater's envelope, if the body is one.
pub fn envelope_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("error")?.get("code")?.as_str().map(str::to_owned)
}

/// Classifies a response. `expect_json` makes a 2xx whose body does not parse an error.
pub fn classify(status: u16, headers: &HeaderMap, body: &[u8], expect_json: bool) -> Outcome {
    let retry_after = headers.contains_key(http::header::RETRY_AFTER);
    match status {
        200..=299 => {
            let json_body = expect_json
                || headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|ct| ct.starts_with("application/json"));
            if json_body && !body.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err() {
                Outcome::error("unparseable_body")
            } else if expect_json && body.is_empty() {
                Outcome::error("empty_body")
            } else {
                Outcome::Ok
            }
        }
        429 => Outcome::Refused {
            // A 429 is a refusal even without an envelope (a proxy's rate rule, say).
            code: envelope_code(body).unwrap_or_else(|| "rate_limited".to_owned()),
            retry_after,
        },
        503 => match envelope_code(body) {
            Some(code) => Outcome::Refused { code, retry_after },
            // A bare 503 (an HTML page from a proxy, a crash) is not a designed refusal.
            None => Outcome::error("status_503_untyped"),
        },
        s => Outcome::error(format!("status_{s}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry: bool) -> HeaderMap {
        let mut h = HeaderMap::new();
        if retry {
            h.insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        }
        h
    }

    #[test]
    fn refusals_are_counted_by_code_and_never_as_errors() {
        let shed = br#"{"error":{"type":"service_unavailable","code":"load_shed","recovery":{"retryable":true,"retry_after_seconds":1}}}"#;
        assert_eq!(
            classify(503, &headers(true), shed, false),
            Outcome::Refused { code: "load_shed".into(), retry_after: true }
        );
        assert_eq!(
            classify(429, &headers(false), b"", false),
            Outcome::Refused { code: "rate_limited".into(), retry_after: false }
        );
        assert_eq!(classify(503, &headers(true), b"<html>", false), Outcome::error("status_503_untyped"));
        assert_eq!(classify(500, &headers(false), b"", false), Outcome::error("status_500"));
        assert_eq!(classify(404, &headers(false), b"", false), Outcome::error("status_404"));
    }

    #[test]
    fn a_2xx_with_a_broken_body_is_an_error() {
        assert_eq!(classify(200, &headers(false), b"{\"items\":[", true), Outcome::error("unparseable_body"));
        assert_eq!(classify(200, &headers(false), b"{}", true), Outcome::Ok);
        assert_eq!(classify(200, &headers(false), b"plain", false), Outcome::Ok);
    }
}
