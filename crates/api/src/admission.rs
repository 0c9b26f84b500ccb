//! Wiring `breakwater-admission` into the API: its settings from the environment, the route
//! classes, and the tenant key it takes turns over.
//!
//! Route classes (docs/ADMISSION.md): health, readiness, metrics, ops and the OpenAPI document
//! bypass admission entirely; the two expensive lists (the inbox and the contacts list) have
//! their own limit and queue, so cheap reads (one conversation, a page of messages) and writes
//! never wait behind them; so do the event streams' openings, so that a reconnection storm is
//! shed among its own and is told to come back within seconds, not the minute a flood is told.

use std::time::Duration;

use axum::http::{Method, Request};
use breakwater_admission::{Admission, AdmissionConfig, Algorithm, ClassConfig, ClassId, Mode, Route};

use crate::auth::Verified;

/// The defaults of every setting below: `breakwater_admission` owns them (docs/ADMISSION.md,
/// "Settings and defaults").
fn defaults() -> ClassConfig {
    ClassConfig::default()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Admission settings from the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionSettings {
    /// `adaptive` (a limit derived from the latency target), `static` (a fixed in-flight
    /// ceiling) or `off` (no protection: for experiments).
    #[arg(long = "admission", env = "ADMISSION", default_value = "adaptive")]
    pub mode: Mode,
    /// The adaptive controller: `gradient` (the default, see docs/ADMISSION.md) or `aimd`.
    #[arg(long = "admission-algorithm", env = "ADMISSION_ALGORITHM", default_value = "gradient")]
    pub algorithm: Algorithm,
    /// The p95 latency target for admitted requests, in ms: the only number to configure.
    #[arg(long = "admission-latency-target-ms", env = "ADMISSION_LATENCY_TARGET_MS", default_value_t = ms(defaults().latency_target))]
    pub latency_target_ms: u64,
    /// The fixed in-flight ceiling per class in `static` mode.
    #[arg(long = "admission-static-limit", env = "ADMISSION_STATIC_LIMIT", default_value_t = defaults().static_limit)]
    pub static_limit: usize,
    /// Waiters beyond the limit, per class.
    #[arg(long = "admission-queue", env = "ADMISSION_QUEUE", default_value_t = defaults().queue_capacity)]
    pub queue: usize,
    /// Longest wait in the queue, in ms.
    #[arg(long = "admission-max-wait-ms", env = "ADMISSION_MAX_WAIT_MS", default_value_t = ms(defaults().max_queue_wait))]
    pub max_wait_ms: u64,
    /// The adaptive limit's floor.
    #[arg(long = "admission-min-limit", env = "ADMISSION_MIN_LIMIT", default_value_t = defaults().min_limit)]
    pub min_limit: usize,
    /// The adaptive limit's ceiling.
    #[arg(long = "admission-max-limit", env = "ADMISSION_MAX_LIMIT", default_value_t = defaults().max_limit)]
    pub max_limit: usize,
}

/// The caller the refusal pacer tells apart (`breakwater_admission::RetryPacing`): the verified
/// user, or for a request without a valid token the client's address (its /64 for IPv6, as the
/// IP throttle buckets it; behind `trusted_proxies` proxies the one they saw), on one connection.
/// The identity keeps one caller's haste from holding another's refusals behind a load balancer,
/// whose connections carry many callers; the connection keeps the callers of one token (a
/// closed loop of workers) apart, so that each is held until its own `Retry-After` instead of
/// all of them being released at once.
pub fn caller_key<B>(trusted_proxies: usize) -> impl Fn(&Request<B>) -> Option<u64> + Clone + Send + Sync + 'static {
    move |req: &Request<B>| {
        use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
        let mut h =
            std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().build_hasher();
        match req.extensions().get::<Verified>() {
            Some(Verified(Ok(auth))) => (auth.tenant.0, auth.user.0).hash(&mut h),
            _ => {
                let peer = req.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0);
                let ip = crate::throttle_layer::client_ip(req.headers(), peer, trusted_proxies);
                crate::throttle::ip_bucket(ip).hash(&mut h);
            }
        }
        req.extensions().get::<crate::server::ConnectionId>().hash(&mut h);
        Some(h.finish())
    }
}

/// The route classes, by index in the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Classes {
    /// Single items, message pages and writes.
    pub default: ClassId,
    /// The inbox and the contacts list.
    pub lists: ClassId,
    /// Opening an event stream (`GET /v1/stream`).
    pub streams: ClassId,
}

impl AdmissionSettings {
    /// Builds the controller and the class ids.
    ///
    /// # Errors
    /// When the settings contradict each other (`min > max`...).
    pub fn build(&self) -> anyhow::Result<(Admission, Classes)> {
        let class = |name: &str| ClassConfig {
            name: name.to_owned(),
            latency_target: Duration::from_millis(self.latency_target_ms),
            static_limit: self.static_limit,
            queue_capacity: self.queue,
            max_queue_wait: Duration::from_millis(self.max_wait_ms),
            min_limit: self.min_limit,
            max_limit: self.max_limit,
            initial_limit: ClassConfig::default().initial_limit.clamp(self.min_limit, self.max_limit),
            longest_retry_after: breakwater_admission::LONGEST_RETRY_AFTER,
        };
        let mut config = AdmissionConfig {
            mode: self.mode,
            algorithm: self.algorithm,
            classes: vec![class("default")],
            ..Default::default()
        };
        let lists = config.add_class(class("lists"));
        // After a task's restart all its streams reconnect at once. Admission's `Retry-After`
        // grows with the overload, up to a minute, which would keep some of them away past the
        // 30 s they must be back in: a refused opening is told at most what the unanswered
        // cap tells a refused connection.
        let streams = config.add_class(ClassConfig {
            longest_retry_after: crate::server::RECONNECT_LONGEST_RETRY_AFTER,
            ..class("streams")
        });
        let default = config.class_id("default").ok_or_else(|| anyhow::anyhow!("no default class"))?;
        let admission = Admission::new(config).map_err(|e| anyhow::anyhow!("admission settings: {e:?}"))?;
        Ok((admission, Classes { default, lists, streams }))
    }
}

/// Public paths that are never counted, queued or shed: the liveness probe must report the truth
/// under load, and the API's description costs nothing. (Readiness, metrics and ops status are on
/// the ops listener, which admission does not front.)
pub const BYPASS: [&str; 2] = ["/health", "/openapi.json"];

/// The class of a request, from its method and path alone (cheap: no routing, no parsing).
pub fn classify<B>(classes: Classes) -> impl Fn(&Request<B>) -> Route + Clone + Send + Sync + 'static {
    move |req: &Request<B>| {
        let path = req.uri().path();
        if BYPASS.contains(&path) {
            Route::Bypass
        } else if req.method() == Method::GET && (path == "/v1/conversations" || path == "/v1/contacts") {
            Route::Class(classes.lists)
        } else if req.method() == Method::GET && path == crate::routes::stream::PATH {
            Route::Class(classes.streams)
        } else {
            Route::Class(classes.default)
        }
    }
}

/// The key admission takes turns over (and tells a lone tenant by): the tenant of the
/// request's verified token (`auth::verify_request` ran before admission). A request without a
/// valid token, forged, expired or absent, gets `None`: every such request shares that one
/// anonymous key, so a forged claim can neither be counted against a victim tenant's share nor
/// take a fresh turn of its own.
pub fn tenant_key<B>(req: &Request<B>) -> Option<u64> {
    let Verified(Ok(auth)) = req.extensions().get::<Verified>()? else { return None };
    let (high, low) = auth.tenant.0.as_u64_pair();
    Some(high ^ low)
}

impl crate::figures::Publish for breakwater_admission::Snapshot {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Kind, Lines, Number, Unit};
        let classes = &self.classes;
        per_class(
            out.figure(Kind::Gauge, "admission_limit", "Admission in-flight limit now, per route class"),
            classes,
            |c| c.limit.map(Number::from),
        )
        .unknown_in_prometheus_as(-1_i64)
        .emf("AdmissionLimit", Unit::Count, Lines::Class)
        .ops("classes/{class}/limit");
        per_class(out.figure(Kind::Gauge, "admission_in_flight", "Requests holding an admission slot"), classes, |c| {
            Some(c.load.in_flight.into())
        })
        .emf("AdmissionInFlight", Unit::Count, Lines::TaskAndClass)
        .ops("classes/{class}/in_flight");
        per_class(
            out.figure(Kind::Gauge, "admission_queue_depth", "Requests waiting for an admission slot"),
            classes,
            |c| Some(c.load.queue_depth.into()),
        )
        .emf("AdmissionQueueDepth", Unit::Count, Lines::TaskAndClass)
        .ops("classes/{class}/queue_depth");
        per_class(out.figure(Kind::Counter, "admission_admitted", "Requests admitted"), classes, |c| {
            Some(c.load.admitted_total.into())
        })
        .emf("AdmissionAdmitted", Unit::Count, Lines::TaskAndClass)
        .ops("classes/{class}/admitted_total");
        let shed = out.figure(Kind::Counter, "admission_shed", "Requests refused by admission, by reason");
        for c in classes {
            for (reason, n) in [
                ("queue_full", c.load.shed.queue_full),
                ("queue_timeout", c.load.shed.queue_timeout),
                ("deadline", c.load.shed.deadline),
            ] {
                shed.series(&[("class", c.name.as_str()), ("reason", reason)], n);
            }
        }
        shed.emf("AdmissionShed", Unit::Count, Lines::TaskAndClass).ops("classes/{class}/shed/{reason}");
        per_class(out.figure(Kind::Gauge, "admission_p95_ms", "p95 latency of admitted requests, ms"), classes, |c| {
            c.load.p95_ms.map(Number::from)
        })
        .unknown_in_prometheus_as(0.0)
        .emf("AdmissionP95", Unit::Milliseconds, Lines::Class)
        .ops("classes/{class}/p95_ms");
    }
}

/// One series per admission class, labelled `class`.
fn per_class<'f>(
    figure: &'f mut crate::figures::Figure,
    classes: &[breakwater_admission::ClassSnapshot],
    value: impl Fn(&breakwater_admission::ClassSnapshot) -> Option<crate::figures::Number>,
) -> &'f mut crate::figures::Figure {
    for c in classes {
        figure.maybe(&[("class", c.name.as_str())], value(c));
    }
    figure
}

impl crate::figures::Publish for breakwater_admission::PacingSnapshot {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::NOT_ALARMED;
        out.counter(
            "retry_early",
            "Refusals to callers that came back before their last refusal's Retry-After",
            self.early_total,
        )
        .no_emf(NOT_ALARMED)
        .ops("early_total");
        out.counter(
            "retry_held",
            "Of those, refusals held until the Retry-After their caller was given",
            self.held_total,
        )
        .no_emf(NOT_ALARMED)
        .ops("held_total");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_bypass() {
        let (_, classes) = AdmissionSettings::default_for_tests().build().expect("builds");
        let c = classify::<()>(classes);
        let req = |m: Method, p: &str| Request::builder().method(m).uri(p).body(()).expect("request");
        assert_eq!(c(&req(Method::GET, "/health")), Route::Bypass);
        assert_eq!(c(&req(Method::GET, "/openapi.json")), Route::Bypass);
        assert_eq!(c(&req(Method::GET, "/v1/conversations?status=open")), Route::Class(classes.lists));
        assert_eq!(c(&req(Method::GET, "/v1/contacts")), Route::Class(classes.lists));
        assert_eq!(c(&req(Method::GET, "/v1/conversations/x/messages")), Route::Class(classes.default));
        // The counts read a few hundred counter rows: cheap, not a list.
        assert_eq!(c(&req(Method::GET, "/v1/conversations/counts")), Route::Class(classes.default));
        assert_eq!(c(&req(Method::POST, "/v1/conversations")), Route::Class(classes.default));
        assert_eq!(c(&req(Method::GET, "/v1/stream?status=open")), Route::Class(classes.streams));
    }

    #[test]
    fn a_refused_stream_opening_is_told_at_most_the_unanswered_cap_s_longest_wait() {
        let (admission, classes) = AdmissionSettings::default_for_tests().build().expect("builds");
        let snapshot = admission.snapshot();
        let longest = |id: ClassId| snapshot.classes[id.index()].longest_retry_after_seconds;
        assert_eq!(longest(classes.streams), crate::server::RECONNECT_LONGEST_RETRY_AFTER);
        assert_eq!(longest(classes.default), breakwater_admission::LONGEST_RETRY_AFTER);
        assert_eq!(longest(classes.lists), breakwater_admission::LONGEST_RETRY_AFTER);
    }

    #[test]
    fn the_key_is_the_verified_tenant_and_a_forged_claim_is_anonymous() {
        use crate::auth::{Claims, JwtKeys, verify_request};
        use axum::http::header::AUTHORIZATION;
        use breakwater_domain::tenants::Role;
        use secrecy::SecretString;
        let ours = JwtKeys::new(&SecretString::from("our-secret-our-secret-our-secret"));
        let theirs = JwtKeys::new(&SecretString::from("a-forger-s-key-a-forger-s-key-xx"));
        let exp = u64::try_from(chrono::Utc::now().timestamp()).expect("after 1970") + 60;
        let (victim, other) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let token = |keys: &JwtKeys, tenant| {
            keys.mint(&Claims::new(tenant, uuid::Uuid::now_v7(), Role::Admin, exp)).expect("mint")
        };
        let key = |auth: Option<String>| {
            let mut req = Request::builder();
            if let Some(a) = auth {
                req = req.header(AUTHORIZATION, format!("Bearer {a}"));
            }
            tenant_key(&verify_request(&ours, req.body(()).expect("request")))
        };
        let victims = key(Some(token(&ours, victim)));
        assert!(victims.is_some());
        assert_eq!(victims, key(Some(token(&ours, victim))), "one tenant, one key");
        assert_ne!(victims, key(Some(token(&ours, other))));
        // Signed with another key, claiming the victim: anonymous, like no token at all.
        assert_eq!(key(Some(token(&theirs, victim))), None);
        assert_eq!(key(Some("h.eyJ0ZW5hbnRfaWQiOiJ4In0.s".to_owned())), None);
        assert_eq!(key(None), None);
        // Without the verification layer nothing is trusted.
        let unverified = Request::builder().header(AUTHORIZATION, format!("Bearer {}", token(&ours, victim)));
        assert_eq!(tenant_key(&unverified.body(()).expect("request")), None);
    }

    impl AdmissionSettings {
        fn default_for_tests() -> Self {
            use clap::Parser as _;
            #[derive(clap::Parser)]
            struct P {
                #[command(flatten)]
                a: AdmissionSettings,
            }
            P::parse_from(["x"]).a
        }
    }
}
