//! Typed refusals: 503, `Retry-After`, and the error envelope the API uses (shown in README.md).
//! Built from a few numbers copied out under the class lock; rendering is one small string and no
//! lock.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::body::AdmissionBody;
use crate::config::{ClassId, LONGEST_RETRY_AFTER};

/// Why a request was refused. Also put in the refusal's response extensions, so an outer layer
/// (metrics, logs) can count refusals by reason without parsing the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// The queue was full (or this waiter was pushed out by a lighter tenant): `load_shed`.
    QueueFull,
    /// The request waited the longest allowed and got no slot: `queue_timeout`.
    QueueTimeout,
    /// The client's `Request-Timeout` could not be met given the expected wait: refused at the
    /// door instead of being served to nobody. Reported as `queue_timeout`.
    Deadline,
}

impl RefusalReason {
    /// The envelope's `code`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::QueueFull => "load_shed",
            Self::QueueTimeout | Self::Deadline => "queue_timeout",
        }
    }
}

/// A refusal and the figures it was decided on. Found in the 503's extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// The route class that refused.
    pub class: ClassId,
    /// In-flight requests of the class at the moment of refusal.
    pub in_flight: usize,
    /// The class's limit at that moment.
    pub limit: usize,
    /// Waiters in the class's queue.
    pub queued: usize,
    /// The queue's bound.
    pub queue_capacity: usize,
    /// Whole seconds to wait before retrying (>= 1), from the queue's drain rate and the overload.
    pub retry_after_seconds: u32,
    /// For `QueueTimeout`: how long it waited; for `Deadline`: the expected wait. Milliseconds.
    pub wait_ms: u64,
    /// For `Deadline`: the client's timeout, milliseconds.
    pub client_timeout_ms: u64,
}

impl Refusal {
    /// The human part of the envelope, e.g. `over capacity (in-flight 5/5, queue 16/16)`.
    #[must_use]
    pub fn message(&self) -> String {
        let mut s = String::with_capacity(96);
        self.write_message(&mut s);
        s
    }

    fn write_message(&self, s: &mut String) {
        match self.reason {
            RefusalReason::QueueFull => s.push_str("over capacity"),
            RefusalReason::QueueTimeout => {
                s.push_str("no capacity within ");
                push_int(s, self.wait_ms);
                s.push_str(" ms");
            }
            RefusalReason::Deadline => {
                s.push_str("expected wait ");
                push_int(s, self.wait_ms);
                s.push_str(" ms exceeds the request timeout of ");
                push_int(s, self.client_timeout_ms);
                s.push_str(" ms");
            }
        }
        s.push_str(" (in-flight ");
        push_int(s, self.in_flight as u64);
        if self.limit != usize::MAX {
            s.push('/');
            push_int(s, self.limit as u64);
        }
        s.push_str(", queue ");
        push_int(s, self.queued as u64);
        s.push('/');
        push_int(s, self.queue_capacity as u64);
        s.push(')');
    }

    /// The JSON error envelope (the API's). The message holds only digits and fixed ASCII, so it needs
    /// no escaping.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(224);
        s.push_str(r#"{"error":{"type":"service_unavailable","code":""#);
        s.push_str(self.reason.code());
        s.push_str(r#"","message":""#);
        self.write_message(&mut s);
        s.push_str(r#"","recovery":{"retryable":true,"retry_after_seconds":"#);
        push_int(&mut s, u64::from(self.retry_after_seconds));
        s.push_str("}}}");
        s
    }

    /// The `Retry-After` header's value.
    #[must_use]
    pub fn retry_after_header(&self) -> HeaderValue {
        match SECONDS.get(self.retry_after_seconds as usize) {
            Some(s) => HeaderValue::from_static(s),
            None => HeaderValue::from(self.retry_after_seconds),
        }
    }

    /// The crate's own rendering, for users of the layer without an envelope of their own
    /// ([`Render`]): a 503 with [`Refusal::to_json`], `content-type` and `Retry-After`.
    #[must_use]
    pub fn default_response(&self) -> Response<Bytes> {
        let mut res = Response::new(Bytes::from(self.to_json()));
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let headers = res.headers_mut();
        headers.reserve(2);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(RETRY_AFTER, self.retry_after_header());
        res
    }

    /// The response the layer sends: what `render` makes, with this refusal in its extensions
    /// (the pacer and the user's metrics read it there), whatever the renderer put in them.
    pub(crate) fn into_response<B>(self, render: Render) -> Response<AdmissionBody<B>> {
        let mut res = render(&self).map(AdmissionBody::refusal);
        res.extensions_mut().insert(self);
        res
    }
}

/// How the layer turns a [`Refusal`] into a response: [`Refusal::default_response`] unless the
/// user of the layer renders its own envelope ([`crate::AdmissionLayer::render_with`]). The status
/// should stay 503 with `Retry-After`: the refusal holds nothing, and clients should come back.
pub type Render = fn(&Refusal) -> Response<Bytes>;

/// Decimal digits without the formatting machinery (a refusal must cost microseconds).
fn push_int(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        // A digit, so the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation)]
        let d = (n % 10) as u8;
        digits[i] = b'0' + d;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        s.push(char::from(d));
    }
}

/// `Retry-After` values as static strings (it is clamped to [`LONGEST_RETRY_AFTER`]), so rendering
/// one allocates nothing.
const SECONDS: [&str; LONGEST_RETRY_AFTER as usize + 1] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "17", "18", "19", "20",
    "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32", "33", "34", "35", "36", "37", "38", "39",
    "40", "41", "42", "43", "44", "45", "46", "47", "48", "49", "50", "51", "52", "53", "54", "55", "56", "57", "58",
    "59", "60",
];

/// `Retry-After` from how long the queue ahead takes to drain at the measured rate, scaled by the
/// overload (offered / admitted in the last window), so that a 10x flood is told to back off
/// longer than a burst. Whole seconds, from 1 to `longest` (a class's `longest_retry_after`).
pub(crate) fn retry_after(ahead: usize, drain_per_sec: f64, pressure: f64, longest: u32) -> u32 {
    #[allow(clippy::cast_precision_loss)]
    let seconds = (ahead as f64 + 1.0) / drain_per_sec.max(0.1) * pressure.max(1.0);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = seconds.ceil().clamp(1.0, f64::from(longest.clamp(1, LONGEST_RETRY_AFTER))) as u32;
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(reason: RefusalReason) -> Refusal {
        Refusal {
            reason,
            class: ClassId::DEFAULT,
            in_flight: 5,
            limit: 5,
            queued: 16,
            queue_capacity: 16,
            retry_after_seconds: 1,
            wait_ms: 340,
            client_timeout_ms: 100,
        }
    }

    #[test]
    fn envelope_matches_design() {
        assert_eq!(
            refusal(RefusalReason::QueueFull).to_json(),
            r#"{"error":{"type":"service_unavailable","code":"load_shed","message":"over capacity (in-flight 5/5, queue 16/16)","recovery":{"retryable":true,"retry_after_seconds":1}}}"#
        );
        let deadline = refusal(RefusalReason::Deadline).message();
        assert_eq!(deadline, "expected wait 340 ms exceeds the request timeout of 100 ms (in-flight 5/5, queue 16/16)");
        assert_eq!(RefusalReason::QueueTimeout.code(), "queue_timeout");
    }

    #[test]
    fn retry_after_follows_drain_rate_and_pressure() {
        assert_eq!(retry_after(15, 400.0, 1.0, 60), 1);
        assert_eq!(retry_after(15, 4.0, 1.0, 60), 4);
        assert_eq!(retry_after(15, 400.0, 100.0, 60), 4);
        assert_eq!(retry_after(15, 0.0, 1.0, 60), 60);
    }

    #[test]
    fn a_class_s_longest_retry_after_bounds_it() {
        assert_eq!(retry_after(15, 0.0, 1.0, 5), 5, "a flood's minute is cut to the class's bound");
        assert_eq!(retry_after(15, 4.0, 1.0, 5), 4, "under the bound it is the drain time");
        assert_eq!(retry_after(0, 400.0, 1.0, 5), 1);
    }
}
