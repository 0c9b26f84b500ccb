//! Outbound webhooks: which URLs a tenant may register, how deliveries are signed, and what a
//! delivery of a message carries.
//!
//! A webhook URL is chosen by a tenant and called by our worker from inside our network, so it
//! is validated like untrusted input: `https` only in production; no credentials in it; and no
//! address that is loopback, private, link-local, carrier-grade NAT, multicast or otherwise
//! special, whether written literally or reached through DNS. The worker checks the resolved
//! addresses again at every connection ([`is_forbidden`]), so a name that later re-resolves to
//! an internal address (DNS rebinding) is refused at delivery time too. Development and tests
//! may allow private addresses explicitly ([`WebhookPolicy::allow_private`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use url::{Host, Url};
use uuid::Uuid;

use crate::messages::MessageSender;
use crate::{DomainError, Pool, Result, TenantId};

/// The header carrying the delivery's signature: `t=<unix seconds>,v1=<hex HMAC-SHA256>`.
pub const SIGNATURE_HEADER: &str = "breakwater-signature";
/// The header carrying the delivery's idempotency key: the message id, the same on every retry.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// The header carrying the attempt number (1 for the first).
pub const ATTEMPT_HEADER: &str = "breakwater-attempt";
/// The longest URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Which webhook URLs are acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookPolicy {
    /// Refuse `http://` (production).
    pub require_https: bool,
    /// Accept loopback, private and link-local addresses (development and tests only).
    pub allow_private: bool,
}

impl WebhookPolicy {
    /// `https` only, public addresses only.
    #[must_use]
    pub const fn production() -> Self {
        Self { require_https: true, allow_private: false }
    }

    /// `http` allowed, still public addresses only unless [`Self::allow_private`] says otherwise.
    #[must_use]
    pub const fn development() -> Self {
        Self { require_https: false, allow_private: false }
    }

    /// The same policy, also accepting private and loopback addresses (local receivers).
    #[must_use]
    pub const fn allow_private(mut self, allow: bool) -> Self {
        self.allow_private = allow;
        self
    }
}

/// A webhook URL that passed [`WebhookUrl::parse`] (and, from [`WebhookUrl::validate`], DNS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl(Url);

impl WebhookUrl {
    /// Checks a URL's form against the policy: scheme, no credentials, a host, and no literal
    /// forbidden address. Does not resolve names (see [`Self::validate`]).
    ///
    /// # Errors
    /// [`DomainError::Invalid`] saying what is wrong.
    pub fn parse(raw: &str, policy: &WebhookPolicy) -> Result<Self> {
        let invalid = |why: &str| DomainError::Invalid(format!("webhook_url {why}"));
        if raw.len() > MAX_URL_LEN {
            return Err(invalid("is too long"));
        }
        let mut url = Url::parse(raw.trim()).map_err(|e| invalid(&format!("is not a URL ({e})")))?;
        match url.scheme() {
            "https" => {}
            "http" if !policy.require_https => {}
            "http" => return Err(invalid("must use https")),
            _ => return Err(invalid("must be an http(s) URL")),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid("must not contain credentials"));
        }
        match url.host() {
            None => return Err(invalid("has no host")),
            Some(Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip), policy)?,
            Some(Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip), policy)?,
            Some(Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let local = name == "localhost" || name.ends_with(".localhost");
                if local && !policy.allow_private {
                    return Err(invalid("must not point at this machine"));
                }
            }
        }
        url.set_fragment(None);
        Ok(Self(url))
    }

    /// [`Self::parse`], then resolves the host and refuses it when any of its addresses is
    /// forbidden (or when it does not resolve).
    ///
    /// # Errors
    /// [`DomainError::Invalid`] saying what is wrong.
    pub async fn validate(raw: &str, policy: &WebhookPolicy) -> Result<Self> {
        let url = Self::parse(raw, policy)?;
        url.resolve(policy).await?;
        Ok(url)
    }

    /// Resolves the host to the addresses a delivery may connect to: all of them, or an error
    /// when any is forbidden by the policy.
    ///
    /// # Errors
    /// [`DomainError::Invalid`] when the name does not resolve or resolves to a forbidden address.
    pub async fn resolve(&self, policy: &WebhookPolicy) -> Result<Vec<SocketAddr>> {
        let host = self.host();
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), self.port()))
            .await
            .map_err(|e| DomainError::Invalid(format!("webhook_url host does not resolve ({e})")))?
            .collect();
        if addrs.is_empty() {
            return Err(DomainError::Invalid("webhook_url host does not resolve".into()));
        }
        for addr in &addrs {
            check_ip(addr.ip(), policy)?;
        }
        Ok(addrs)
    }

    /// The URL.
    #[must_use]
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The parsed URL.
    #[must_use]
    pub fn url(&self) -> &Url {
        &self.0
    }

    /// `true` for `https`.
    #[must_use]
    pub fn is_https(&self) -> bool {
        self.0.scheme() == "https"
    }

    /// The host as a name or an address, without IPv6 brackets.
    #[must_use]
    pub fn host(&self) -> String {
        match self.0.host() {
            Some(Host::Ipv6(ip)) => ip.to_string(),
            Some(host) => host.to_string(),
            None => String::new(),
        }
    }

    /// The port, explicit or the scheme's.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.0.port_or_known_default().unwrap_or(443)
    }
}

impl std::fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

fn check_ip(ip: IpAddr, policy: &WebhookPolicy) -> Result<()> {
    if !policy.allow_private && is_forbidden(ip) {
        return Err(DomainError::Invalid(format!(
            "webhook_url must not point at a private, loopback or reserved address ({ip})"
        )));
    }
    Ok(())
}

/// Whether a webhook may not connect to `ip` (unless private addresses are allowed): anything
/// that is not a global unicast address, including IPv4 addresses embedded in IPv6 ones.
#[must_use]
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT, 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments, 192.0.0/24
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, 198.18/15
        || a >= 240 // reserved, 240/4
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4); // ::ffff:a.b.c.d
    }
    let embedded_v4 = |hi: u16, lo: u16| {
        let ([a, b], [c, d]) = (hi.to_be_bytes(), lo.to_be_bytes());
        Ipv4Addr::new(a, b, c, d)
    };
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated), fec0::/10
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || (seg[0] == 0x2001 && seg[1] == 0) // Teredo tunnels to anywhere
        || (seg[..6] == [0; 6]) // IPv4-compatible (deprecated) ::a.b.c.d
        || (seg[..6] == [0, 0, 0, 0, 0xffff, 0]) // IPv4-translated (SIIT), ::ffff:0:a.b.c.d
        || (seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && forbidden_v4(embedded_v4(seg[6], seg[7]))) // NAT64
        || (seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1) // local-use NAT64, 64:ff9b:1::/48
        || (seg[0] == 0x2002 && forbidden_v4(embedded_v4(seg[1], seg[2]))) // 6to4
}

/// A new webhook signing secret: 32 random bytes from the OS, base64url, prefixed `whsec_`.
///
/// # Panics
/// When the operating system has no randomness to give, which no supported platform does.
#[must_use]
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    #[allow(clippy::expect_used)] // getrandom fails only on platforms without an entropy source
    getrandom::fill(&mut bytes).expect("the OS random number generator failed");
    format!("whsec_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The signature header's value for `body` sent at unix time `timestamp`:
/// `t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed with the secret>`. The
/// timestamp is signed so a receiver can refuse old replays.
#[must_use]
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!("t={timestamp},v1={}", hex::encode(mac(secret, timestamp, body).finalize().into_bytes()))
}

/// Checks a signature header (what a receiver does): the HMAC matches, in constant time, and
/// the timestamp is within `tolerance_seconds` of `now`.
#[must_use]
pub fn verify(secret: &str, header: &str, body: &[u8], now: i64, tolerance_seconds: i64) -> bool {
    let mut timestamp = None;
    let mut signature = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", v)) => signature = hex::decode(v).ok(),
            _ => {}
        }
    }
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return false;
    };
    (now - timestamp).abs() <= tolerance_seconds && mac(secret, timestamp, body).verify_slice(&signature).is_ok()
}

fn mac(secret: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    #[allow(clippy::expect_used)] // HMAC accepts keys of any length
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// What a `deliver_message` POST carries (its JSON body). Built from the database on every
/// attempt, so it is the same bytes on every retry of the same message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MessageEvent {
    /// Always `message.created`.
    #[serde(rename = "type")]
    pub event_type: &'static str,
    /// The event's id: the message id, also the idempotency key.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: Uuid,
    /// The inbox whose webhook is called.
    pub inbox_id: Uuid,
    /// The conversation.
    pub conversation_id: Uuid,
    /// The contact the message is for.
    pub contact_id: Uuid,
    /// The message.
    pub message: EventMessage,
}

/// The message inside a [`MessageEvent`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventMessage {
    /// The message's id.
    pub id: Uuid,
    /// Who wrote it.
    pub sender: MessageSender,
    /// The agent who wrote it.
    pub author_id: Option<Uuid>,
    /// Its text.
    pub body: String,
    /// When it was written.
    pub created_at: DateTime<Utc>,
}

/// One delivery to make: where, with which secret, what.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// The inbox's webhook URL, as stored (the worker validates it again before calling).
    pub url: String,
    /// The inbox's signing secret (`None` for an inbox written without one).
    pub secret: Option<String>,
    /// The event to POST.
    pub event: MessageEvent,
}

/// The delivery of a message: `None` when there is nothing to deliver any more (the message or
/// its contact was erased, or the inbox no longer has a webhook).
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db webhooks.outbound", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn outbound(pool: &Pool, tenant: TenantId, message: Uuid) -> Result<Option<Outbound>> {
    let row = sqlx::query!(
        r#"SELECT i.webhook_url AS "webhook_url!", i.webhook_secret, c.inbox_id, c.id AS conversation_id,
                  c.contact_id, m.sender AS "sender: MessageSender", m.author_id, m.body, m.created_at
           FROM messages m
           JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conversation_id
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           JOIN inboxes i ON i.tenant_id = c.tenant_id AND i.id = c.inbox_id
           WHERE m.tenant_id = $1 AND m.id = $2 AND ct.erased_at IS NULL AND i.webhook_url IS NOT NULL"#,
        tenant.0,
        message
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Outbound {
        url: r.webhook_url,
        secret: r.webhook_secret,
        event: MessageEvent {
            event_type: "message.created",
            id: message,
            tenant_id: tenant.0,
            inbox_id: r.inbox_id,
            conversation_id: r.conversation_id,
            contact_id: r.contact_id,
            message: EventMessage {
                id: message,
                sender: r.sender,
                author_id: r.author_id,
                body: r.body,
                created_at: r.created_at,
            },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> WebhookPolicy {
        WebhookPolicy::development()
    }

    #[test]
    fn production_requires_https_and_public_hosts() {
        let prod = WebhookPolicy::production();
        assert!(WebhookUrl::parse("https://hooks.example.com/in?x=1#frag", &prod).is_ok());
        assert!(WebhookUrl::parse("http://hooks.example.com/in", &prod).is_err());
        assert!(WebhookUrl::parse("ftp://hooks.example.com/in", &prod).is_err());
        assert!(WebhookUrl::parse("https://user:pw@hooks.example.com/", &prod).is_err());
        assert!(WebhookUrl::parse("not a url", &prod).is_err());
        assert_eq!(
            WebhookUrl::parse("https://hooks.example.com/in#frag", &prod).map(|u| u.to_string()).ok().as_deref(),
            Some("https://hooks.example.com/in")
        );
    }

    #[test]
    fn literal_internal_addresses_are_refused_unless_allowed() {
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://0.0.0.0/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://100.64.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[::ffff:0:7f00:1]/",
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[64:ff9b:1::a00:1]/",
            "http://[64:ff9b:1:ffff::5db8:d822]/",
            "http://[2002:7f00:1::]/",
            "http://localhost:8080/",
            "http://api.localhost/",
        ] {
            assert!(WebhookUrl::parse(url, &dev()).is_err(), "{url} should be refused");
            assert!(WebhookUrl::parse(url, &dev().allow_private(true)).is_ok(), "{url} should be allowed");
        }
        for url in ["http://93.184.216.34/", "http://[2606:4700::6810:84e5]/", "https://example.com:8443/x"] {
            assert!(WebhookUrl::parse(url, &dev()).is_ok(), "{url} should be allowed");
        }
    }

    #[tokio::test]
    async fn names_that_resolve_to_internal_addresses_are_refused() {
        assert!(WebhookUrl::validate("http://localhost./x", &dev()).await.is_err());
        // Names other than `localhost` that the hosts file maps to loopback (the machine's own
        // name, usually) are caught by address.
        let policy = dev().allow_private(true);
        let own = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        for name in ["ip6-localhost", own.trim()].into_iter().filter(|n| !n.is_empty()) {
            let raw = format!("http://{name}:9/");
            let Ok(url) = WebhookUrl::parse(&raw, &dev()) else { continue };
            let Ok(addrs) = url.resolve(&policy).await else { continue };
            if addrs.iter().all(|a| is_forbidden(a.ip())) {
                let err = WebhookUrl::validate(&raw, &dev()).await;
                assert!(matches!(err, Err(DomainError::Invalid(m)) if m.contains("private")), "{raw}");
            }
        }
        assert!(WebhookUrl::validate("http://does-not-exist.invalid/", &dev()).await.is_err());
    }

    #[test]
    fn signatures_verify_and_expire() {
        let secret = new_secret();
        assert!(secret.starts_with("whsec_") && secret.len() > 40);
        assert_ne!(secret, new_secret());
        let header = sign(&secret, 1_700_000_000, b"{\"a\":1}");
        assert!(verify(&secret, &header, b"{\"a\":1}", 1_700_000_010, 300));
        assert!(!verify(&secret, &header, b"{\"a\":2}", 1_700_000_010, 300));
        assert!(!verify("whsec_other", &header, b"{\"a\":1}", 1_700_000_010, 300));
        assert!(!verify(&secret, &header, b"{\"a\":1}", 1_700_001_000, 300));
        assert!(!verify(&secret, "garbage", b"{\"a\":1}", 1_700_000_010, 300));
    }
}
