//! The body cap: the first and cheapest check. A request whose `Content-Length` exceeds the cap
//! is answered 413 before admission, auth or any handler sees it; a chunked body is cut at the
//! cap by the JSON extractor (axum's `DefaultBodyLimit`, set to the same value).

use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Response, header};
use axum::response::IntoResponse as _;
use futures_util::future::Either;
use tower::{Layer, Service};

use crate::error::ApiError;

/// The configured cap, visible to extractors through the request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Layer applying [`BodyLimit`].
#[derive(Debug, Clone, Copy)]
pub struct BodyLimitLayer(pub usize);

impl<S> Layer<S> for BodyLimitLayer {
    type Service = BodyLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyLimitService { inner, limit: self.0 }
    }
}

/// See [`BodyLimitLayer`].
#[derive(Debug, Clone)]
pub struct BodyLimitService<S> {
    inner: S,
    limit: usize,
}

impl<S, B> Service<Request<B>> for BodyLimitService<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<Response<Body>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let declared =
            req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.limit as u64) {
            let response = ApiError::BodyTooLarge { limit: self.limit }.into_response();
            return Either::Left(std::future::ready(Ok(response)));
        }
        req.extensions_mut().insert(BodyLimit(self.limit));
        Either::Right(self.inner.call(req))
    }
}
