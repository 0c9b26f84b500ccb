//! The tower layer and service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{Layer, Service};

use crate::body::AdmissionBody;
use crate::config::ClassId;
use crate::refusal::{Refusal, Render};
use crate::state::{Admission, Decision, SlotGuard, Ticket};

/// Where the classifier sends a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Never counted, queued or refused: health, readiness, metrics, ops.
    Bypass,
    /// Admitted under this class's limit and queue.
    Class(ClassId),
}

/// `Request-Timeout` (the IETF draft's name) and its common `X-` spelling: milliseconds.
static REQUEST_TIMEOUT: HeaderName = HeaderName::from_static("request-timeout");
static X_REQUEST_TIMEOUT: HeaderName = HeaderName::from_static("x-request-timeout");

/// The client's deadline, from `Request-Timeout` or `X-Request-Timeout` (whole milliseconds).
/// Anything unparsable is ignored.
#[must_use]
pub fn client_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(&REQUEST_TIMEOUT).or_else(|| headers.get(&X_REQUEST_TIMEOUT))?;
    let ms: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms))
}

impl Admission {
    /// The layer to put in front of a service. `classify` picks the route class (or bypass) of a
    /// request; `tenant` picks the key the queue takes turns over (`None`: one shared key). Both
    /// run on every request before anything else, so keep them to a header or path look-up.
    pub fn layer<C, K>(&self, classify: C, tenant: K) -> AdmissionLayer<C, K> {
        AdmissionLayer { admission: self.clone(), classify, tenant, render: Refusal::default_response }
    }
}

/// Tower layer applying admission control. Every service it makes shares one controller.
#[derive(Clone)]
pub struct AdmissionLayer<C, K> {
    admission: Admission,
    classify: C,
    tenant: K,
    render: Render,
}

impl<C, K> AdmissionLayer<C, K> {
    /// Renders refusals with `render` instead of [`Refusal::default_response`]: for a user with an
    /// error envelope of its own. The [`Refusal`] is put in the response's extensions either way.
    #[must_use]
    pub fn render_with(mut self, render: Render) -> Self {
        self.render = render;
        self
    }
}

impl<C, K> fmt::Debug for AdmissionLayer<C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionLayer").field("admission", &self.admission).finish_non_exhaustive()
    }
}

impl<S, C: Clone, K: Clone> Layer<S> for AdmissionLayer<C, K> {
    type Service = AdmissionService<S, C, K>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            admission: self.admission.clone(),
            classify: self.classify.clone(),
            tenant: self.tenant.clone(),
            render: self.render,
        }
    }
}

/// The service [`AdmissionLayer`] makes. Clones (one per connection in hyper/axum) share the
/// controller: the limit is global to the process.
#[derive(Clone)]
pub struct AdmissionService<S, C, K> {
    inner: S,
    admission: Admission,
    classify: C,
    tenant: K,
    render: Render,
}

impl<S, C, K> fmt::Debug for AdmissionService<S, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionService").field("admission", &self.admission).finish_non_exhaustive()
    }
}

impl<S, C, K, B, ResBody> Service<Request<B>> for AdmissionService<S, C, K>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    C: Fn(&Request<B>) -> Route,
    K: Fn(&Request<B>) -> Option<u64>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = Response<AdmissionBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, B>;

    /// Readiness is the inner service's: admission never sheds on `Pending` here (that is the
    /// `LoadShed` over `Buffer` trap, where an exhausted coop budget looks like overload).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let class = match (self.classify)(&req) {
            Route::Bypass => {
                self.admission.count_bypass();
                return ResponseFuture::calling(self.inner.call(req), None, self.render);
            }
            Route::Class(class) => class,
        };
        let tenant = (self.tenant)(&req);
        // The deadline header is read only if the request cannot go straight in.
        match self.admission.admit(class, tenant, || client_timeout(req.headers())) {
            Decision::Admit(guard) => ResponseFuture::calling(self.inner.call(req), Some(guard), self.render),
            Decision::Refuse(refusal) => ResponseFuture { state: State::Refused { refusal }, render: self.render },
            Decision::Wait(ticket, until) => {
                // Keep the service that was made ready for this request; leave a clone behind.
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                ResponseFuture {
                    state: State::Waiting {
                        sleep: Box::pin(tokio::time::sleep_until(until)),
                        ticket,
                        svc: Some(svc),
                        req: Some(req),
                    },
                    render: self.render,
                }
            }
        }
    }
}

pin_project! {
    /// Future of [`AdmissionService`].
    pub struct ResponseFuture<F, S, B> {
        #[pin]
        state: State<F, S, B>,
        render: Render,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, B> {
        Waiting {
            sleep: Pin<Box<Sleep>>,
            ticket: Ticket,
            svc: Option<S>,
            req: Option<Request<B>>,
        },
        Calling {
            #[pin]
            fut: F,
            guard: Option<SlotGuard>,
        },
        Refused { refusal: Refusal },
        Done,
    }
}

impl<F, S, B> ResponseFuture<F, S, B> {
    fn calling(fut: F, guard: Option<SlotGuard>, render: Render) -> Self {
        Self { state: State::Calling { fut, guard }, render }
    }
}

impl<F, S, B> fmt::Debug for ResponseFuture<F, S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Calling { .. } => "calling",
            State::Refused { .. } => "refused",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture").field("state", &state).finish()
    }
}

impl<F, S, B, ResBody, E> Future for ResponseFuture<F, S, B>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    S: Service<Request<B>, Future = F, Response = Response<ResBody>, Error = E>,
    ResBody: Body,
{
    type Output = Result<Response<AdmissionBody<ResBody>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let render = *this.render;
            let mut state = this.state;
            match state.as_mut().project() {
                StateProj::Waiting { sleep, ticket, svc, req } => {
                    let outcome = match ticket.poll(cx) {
                        Poll::Ready(outcome) => outcome,
                        Poll::Pending => {
                            ready!(sleep.as_mut().poll(cx));
                            ticket.expire()
                        }
                    };
                    let next = match (outcome, svc.take(), req.take()) {
                        (Ok(guard), Some(mut svc), Some(req)) => {
                            State::Calling { fut: svc.call(req), guard: Some(guard) }
                        }
                        (Err(refusal), _, _) => State::Refused { refusal },
                        (Ok(_), _, _) => unreachable!("the request is taken only once"),
                    };
                    state.set(next);
                }
                StateProj::Calling { fut, guard } => {
                    let result = ready!(fut.poll(cx));
                    let guard = guard.take();
                    state.set(State::Done);
                    return Poll::Ready(result.map(|res| {
                        let long_lived = res.extensions().get::<crate::body::LongLived>().is_some();
                        res.map(|body| AdmissionBody::wrap(body, guard, long_lived))
                    }));
                }
                StateProj::Refused { refusal } => {
                    let refusal = *refusal;
                    state.set(State::Done);
                    return Poll::Ready(Ok(refusal.into_response(render)));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
