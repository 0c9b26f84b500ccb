//! The request body, taken whole before anything pooled is held: the first and cheapest layer.
//!
//! - A declared `Content-Length` over the cap is answered 413 before anything else runs.
//! - Any other body is read to its end here, under `BODY_READ_TIMEOUT_MS` and the cap, before
//!   admission, the throttles or the database bulkhead see the request. A client that stalls its
//!   body therefore waits on its own connection only: it holds no admission slot and no database
//!   slot, and is answered 408 `body_timeout` (connection closed) when the timeout passes. A body
//!   cut short or over the cap while streaming gets 400 or 413.
//! - The handler's JSON extractor then parses bytes already in memory.
//!
//! Requests without a body (every GET, a DELETE) pass straight through, with no allocation.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse as _;
use futures_util::future::{BoxFuture, Either};
use http_body::Body as _;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use serde::Serialize;
use tower::{Layer, Service};

use crate::error::ApiError;

/// The configured cap, visible to extractors through the request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// The body settings and what they refused, shared by every connection.
#[derive(Debug)]
pub struct BodyIntake {
    limit: usize,
    read_timeout: Duration,
    read: AtomicU64,
    too_large: AtomicU64,
    timed_out: AtomicU64,
    unreadable: AtomicU64,
}

/// The published state of the body layer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BodyStatus {
    /// Largest accepted body, bytes.
    pub limit_bytes: usize,
    /// The longest a client may take to send its body, ms; past it, 408 `body_timeout`.
    pub read_timeout_ms: u64,
    /// Bodies read whole since start.
    pub read: u64,
    /// Bodies refused 413 since start (declared or streamed past the cap).
    pub too_large: u64,
    /// Bodies not sent within the read timeout since start (408).
    pub timed_out: u64,
    /// Bodies cut short by the client since start (400).
    pub unreadable: u64,
}

impl BodyIntake {
    /// A cap of `limit` bytes read within `read_timeout`.
    #[must_use]
    pub fn new(limit: usize, read_timeout: Duration) -> Self {
        Self {
            limit,
            read_timeout,
            read: AtomicU64::new(0),
            too_large: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
        }
    }

    /// The published state.
    #[must_use]
    pub fn status(&self) -> BodyStatus {
        BodyStatus {
            limit_bytes: self.limit,
            read_timeout_ms: u64::try_from(self.read_timeout.as_millis()).unwrap_or(u64::MAX),
            read: self.read.load(Ordering::Relaxed),
            too_large: self.too_large.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            unreadable: self.unreadable.load(Ordering::Relaxed),
        }
    }

    /// Reads `body` whole, or says why not.
    async fn read(&self, body: Body) -> Result<Body, ApiError> {
        let collected = tokio::time::timeout(self.read_timeout, Limited::new(body, self.limit).collect()).await;
        let (counter, result) = match collected {
            Ok(Ok(collected)) => (&self.read, Ok(Body::from(collected.to_bytes()))),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                (&self.too_large, Err(ApiError::BodyTooLarge { limit: self.limit }))
            }
            Ok(Err(_)) => {
                (&self.unreadable, Err(ApiError::InvalidRequest("the request body was cut short".to_owned())))
            }
            Err(_) => (&self.timed_out, Err(ApiError::BodyTimeout { timeout: self.read_timeout })),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }
}

/// Layer applying [`BodyIntake`].
#[derive(Debug, Clone)]
pub struct BodyLayer(pub Arc<BodyIntake>);

impl<S> Layer<S> for BodyLayer {
    type Service = BodyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyService { inner, intake: self.0.clone() }
    }
}

/// See [`BodyLayer`].
#[derive(Debug, Clone)]
pub struct BodyService<S> {
    inner: S,
    intake: Arc<BodyIntake>,
}

type Refused = std::future::Ready<Result<Response<Body>, Infallible>>;

impl<S> Service<Request<Body>> for BodyService<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Refused, Either<S::Future, BoxFuture<'static, Result<Response<Body>, Infallible>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let limit = self.intake.limit;
        let declared =
            req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit as u64) {
            self.intake.too_large.fetch_add(1, Ordering::Relaxed);
            return Either::Left(std::future::ready(Ok(refusal(ApiError::BodyTooLarge { limit }))));
        }
        req.extensions_mut().insert(BodyLimit(limit));
        if req.body().is_end_stream() {
            return Either::Right(Either::Left(self.inner.call(req)));
        }
        // Keep the service that was made ready for this request; leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let intake = self.intake.clone();
        Either::Right(Either::Right(Box::pin(async move {
            let (parts, body) = req.into_parts();
            match intake.read(body).await {
                Ok(body) => inner.call(Request::from_parts(parts, body)).await,
                Err(e) => Ok(refusal(e)),
            }
        })))
    }
}

/// A refusal of the body. The connection is closed after it: the rest of a body that was not
/// read would otherwise be taken for the next request.
fn refusal(error: ApiError) -> Response<Body> {
    let mut response = error.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

impl crate::figures::Publish for BodyStatus {
    fn publish(&self, out: &mut crate::figures::Figures) {
        out.counter(
            "body_timed_out",
            "Request bodies not sent within BODY_READ_TIMEOUT_MS (408 body_timeout)",
            self.timed_out,
        )
        .no_emf(crate::figures::NOT_ALARMED)
        .ops("timed_out");
    }
}
