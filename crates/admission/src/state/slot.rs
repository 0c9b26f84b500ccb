//! What a request holds on its class once the door has decided: a slot ([`SlotGuard`]) or a
//! place in the queue ([`Ticket`]). Each gives back what it holds when dropped, so a slot or a
//! queue place is never lost to a panic, an error or a client that went away.

use std::fmt;
use std::future::Future as _;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Admission, Shared, lock, secs_to_ms};
use crate::config::ClassId;
use crate::queue::Outcome;
use crate::refusal::{Refusal, RefusalReason};

/// A held slot. Dropping it releases the slot: after the body has been sent, on panic (unwinding
/// drops it), on error, or when the client goes away and hyper drops the future or body.
/// Only a completed response feeds the latency controller.
pub(crate) struct SlotGuard {
    admission: Admission,
    pub(super) class: ClassId,
    pub(super) tenant: Option<u64>,
    pub(super) admitted_at: Instant,
    pub(super) probe: bool,
    pub(super) completed: bool,
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard").field("class", &self.class).finish_non_exhaustive()
    }
}

impl SlotGuard {
    pub(super) fn new(
        shared: Arc<Shared>,
        class: ClassId,
        tenant: Option<u64>,
        admitted_at: Instant,
        probe: bool,
    ) -> Self {
        Self { admission: Admission { shared }, class, tenant, admitted_at, probe, completed: false }
    }

    /// The response has been fully produced: release and count its latency.
    pub(crate) fn complete(mut self) {
        self.completed = true;
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.admission.release(self);
    }
}

/// A place in the queue. Dropping it unqueued (client gone) removes it; if a slot was handed to
/// it meanwhile, the slot is passed on.
pub(crate) struct Ticket {
    pub(super) admission: Admission,
    pub(super) class: ClassId,
    pub(super) tenant: Option<u64>,
    pub(super) waiter: u64,
    pub(super) rx: oneshot::Receiver<Outcome>,
    pub(super) since: Instant,
    pub(super) settled: bool,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("class", &self.class).finish_non_exhaustive()
    }
}

impl Ticket {
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<SlotGuard, Refusal>> {
        match std::pin::Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(outcome)) => Poll::Ready(self.settle(outcome)),
            // The sender lives in the queue, which lives as long as `admission`: unreachable,
            // but a waiter must never hang, so treat it as a timeout.
            Poll::Ready(Err(_)) => Poll::Ready(Err(self.expire_refusal())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The wait is over: leave the queue with a `queue_timeout`, unless a slot or a refusal was
    /// sent just before (then that is the answer).
    pub(crate) fn expire(&mut self) -> Result<SlotGuard, Refusal> {
        let (id, class) = self.admission.class(self.class);
        let mut st = lock(&class.state);
        if st.queue.remove(self.waiter) {
            st.shed.queue_timeout += 1;
            let mut r = st.refusal(id, &class.config, RefusalReason::QueueTimeout);
            drop(st);
            self.settled = true;
            r.wait_ms = secs_to_ms(Instant::now().saturating_duration_since(self.since).as_secs_f64());
            return Err(r);
        }
        drop(st);
        match self.rx.try_recv() {
            Ok(outcome) => self.settle(outcome),
            Err(_) => Err(self.expire_refusal()),
        }
    }

    fn expire_refusal(&mut self) -> Refusal {
        self.settled = true;
        let (id, class) = self.admission.class(self.class);
        let st = lock(&class.state);
        st.refusal(id, &class.config, RefusalReason::QueueTimeout)
    }

    fn settle(&mut self, outcome: Outcome) -> Result<SlotGuard, Refusal> {
        self.settled = true;
        match outcome {
            Outcome::Admitted { probe } => {
                Ok(SlotGuard::new(self.admission.shared.clone(), self.class, self.tenant, Instant::now(), probe))
            }
            Outcome::Refused(r) => Err(r),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (_, class) = self.admission.class(self.class);
        let removed = lock(&class.state).queue.remove(self.waiter);
        if !removed && let Ok(Outcome::Admitted { probe }) = self.rx.try_recv() {
            // Granted but never used: give the slot back (and to the next waiter).
            drop(SlotGuard::new(self.admission.shared.clone(), self.class, self.tenant, Instant::now(), probe));
        }
    }
}
