//! The response body admission hands back: the service's body carrying the request's slot (freed
//! when the body has been fully produced, or dropped), or a refusal's envelope.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::state::SlotGuard;

pin_project! {
    /// Response body of [`AdmissionService`](crate::AdmissionService). Implements
    /// [`http_body::Body`] with the inner body's data type, so axum and hyper take it as is.
    pub struct AdmissionBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, guard: Option<SlotGuard> },
        Refusal { bytes: Option<Bytes> },
    }
}

impl<B> fmt::Debug for AdmissionBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { guard, .. } => {
                if guard.is_some() {
                    "holding a slot"
                } else {
                    "no slot"
                }
            }
            Kind::Refusal { .. } => "refusal",
        };
        f.debug_struct("AdmissionBody").field("kind", &kind).finish()
    }
}

/// A response extension that marks a long-lived response (a server-sent event stream, a long
/// poll): admission treats its head as the request's end, releasing its slot and taking its
/// latency sample then, instead of holding the slot for as long as the body runs. The service
/// that sets it bounds such responses by other means (a cap of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongLived;

impl<B: Body> AdmissionBody<B> {
    /// Wraps a response body; the slot (if any) is released when the body ends or is dropped,
    /// or at once for a [`LongLived`] response.
    pub(crate) fn wrap(body: B, guard: Option<SlotGuard>, long_lived: bool) -> Self {
        let guard = match guard {
            // Nothing left to send (a 204, an empty body), or a stream that holds no slot: the
            // request is complete now.
            Some(g) if long_lived || body.is_end_stream() => {
                g.complete();
                None
            }
            other => other,
        };
        Self { kind: Kind::Inner { body, guard } }
    }
}

impl<B> AdmissionBody<B> {
    pub(crate) fn refusal(bytes: Bytes) -> Self {
        Self { kind: Kind::Refusal { bytes: Some(bytes) } }
    }
}

impl<B> Body for AdmissionBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { mut body, guard } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let done = match &frame {
                    None => Some(true),
                    Some(Err(_)) => Some(false),
                    Some(Ok(_)) if body.is_end_stream() => Some(true),
                    Some(Ok(_)) => None,
                };
                match done {
                    Some(true) => {
                        if let Some(g) = guard.take() {
                            g.complete();
                        }
                    }
                    // An error ends the response unfinished: release without a latency sample.
                    Some(false) => drop(guard.take()),
                    None => {}
                }
                Poll::Ready(frame)
            }
            KindProj::Refusal { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(B::Data::from(b))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Refusal { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Refusal { bytes } => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
