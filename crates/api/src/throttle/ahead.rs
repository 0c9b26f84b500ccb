//! The throttles' answer ahead of admission: a request that the door of its tenant, user or IP
//! bucket does not let through (a bucket that refused is followed in process, see
//! [`Throttles::refused_ahead`]) gets that bucket's 429 here, before it can take an admission
//! slot or queue place, and without asking Redis. Only a verified request is looked up: one
//! without a valid token is refused 401 inside, whatever its buckets say.
//!
//! The 429 holds nothing shared, so it is marked [`PaceableRefusal`]: a caller that spins on it
//! is slowed by the refusal pacer like one that spins on admission's 503s.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use breakwater_admission::PaceableRefusal;
use futures_util::future::{Either, Ready, ready};
use tower::Service;

use super::{Decision, Throttles};
use crate::auth::Verified;

/// Wraps the admitted app.
#[derive(Debug, Clone)]
pub struct ThrottledAhead<S> {
    inner: S,
    throttles: Arc<Throttles>,
    trusted_proxies: usize,
}

impl<S> ThrottledAhead<S> {
    /// `inner` behind the throttles' remembered refusals.
    pub fn new(inner: S, throttles: Arc<Throttles>, trusted_proxies: usize) -> Self {
        Self { inner, throttles, trusted_proxies }
    }
}

impl<S> Service<Request<Body>> for ThrottledAhead<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response<Body>, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if let Some(Verified(Ok(auth))) = req.extensions().get::<Verified>() {
            let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
            let ip = crate::throttle_layer::client_ip(req.headers(), peer, self.trusted_proxies);
            if let Some(Decision::Refused { kind, limit, retry_after_us }) =
                self.throttles.refused_ahead(auth.tenant, auth.user, ip)
            {
                let mut response = crate::throttle_layer::refused(kind, limit, retry_after_us);
                // What the header says, not when the bucket admits again: a bucket of 225/s admits
                // again within 5 ms, but the header says a whole second.
                let told = crate::throttle_layer::told_retry_after(retry_after_us);
                let retry_after_seconds = u32::try_from(told).unwrap_or(u32::MAX);
                response.extensions_mut().insert(PaceableRefusal { retry_after_seconds });
                return Either::Left(ready(Ok(response)));
            }
        }
        Either::Right(self.inner.call(req))
    }
}
