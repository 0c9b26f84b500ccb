//! What the API's and the worker's `/metrics` share: the content type, the text encoding, and
//! [`advance`] for totals a layer keeps itself.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// The `Content-Type` of a scrape (OpenMetrics text, what `prometheus-client` encodes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry as OpenMetrics text; empty if encoding fails (it only fails on a broken
/// `fmt::Write`, which a `String` is not).
#[must_use]
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// Moves a counter up to a total kept elsewhere since start. With scrapes serialized and a
/// total that only grows, the counter ends equal to it; it never moves down.
pub fn advance(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_follows_a_growing_total_and_never_goes_back() {
        let c = Counter::default();
        advance(&c, 5);
        advance(&c, 5);
        assert_eq!(c.get(), 5);
        advance(&c, 3);
        assert_eq!(c.get(), 5, "a stale reading does not move it down");
        advance(&c, 9);
        assert_eq!(c.get(), 9);
        let mut r = Registry::default();
        r.register("jobs", "Jobs", c);
        assert!(encode(&r).contains("jobs_total 9"), "{}", encode(&r));
    }
}
