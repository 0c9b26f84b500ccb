//! The waiting room of one class: a sub-queue per tenant, served round robin, with CoDel-style
//! overload detection per tenant (a tenant whose sub-queue has not been empty for an interval is
//! flooding: its waiters get a short wait and are served newest first).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::refusal::Refusal;

/// What a waiter is eventually told.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Admitted { probe: bool },
    Refused(Refusal),
}

#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) id: u64,
    pub(crate) tx: oneshot::Sender<Outcome>,
}

#[derive(Debug)]
struct TenantQueue {
    key: Option<u64>,
    waiters: VecDeque<Waiter>,
    /// When this tenant's sub-queue was last seen empty.
    last_empty: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    tenants: Vec<TenantQueue>,
    cursor: usize,
    len: usize,
}

impl FairQueue {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn find(&self, key: Option<u64>) -> Option<usize> {
        self.tenants.iter().position(|t| t.key == key)
    }

    /// Where a newcomer of `key` would be served: its tenant's backlog times the number of
    /// tenants taking turns, at most the whole queue.
    pub(crate) fn position(&self, key: Option<u64>) -> usize {
        let own = self.find(key).map_or(0, |i| self.tenants[i].waiters.len());
        let turns = self.tenants.len() + usize::from(own == 0);
        ((own + 1) * turns).min(self.len + 1)
    }

    /// Sustained overload for this tenant: its sub-queue has not been empty for `interval`.
    pub(crate) fn overloaded(&self, key: Option<u64>, now: Instant, interval: Duration) -> bool {
        self.find(key)
            .is_some_and(|i| now.saturating_duration_since(self.tenants[i].last_empty) >= interval)
    }

    pub(crate) fn push(&mut self, key: Option<u64>, waiter: Waiter, now: Instant) {
        let i = match self.find(key) {
            Some(i) => i,
            None => {
                self.tenants.push(TenantQueue {
                    key,
                    waiters: VecDeque::new(),
                    last_empty: now,
                });
                self.tenants.len() - 1
            }
        };
        self.tenants[i].waiters.push_back(waiter);
        self.len += 1;
    }

    /// The next waiter in round-robin order across tenants; within a tenant, oldest first, or
    /// newest first when `lifo` and the tenant is in sustained overload.
    pub(crate) fn pop(&mut self, now: Instant, interval: Duration, lifo: bool) -> Option<Waiter> {
        if self.tenants.is_empty() {
            return None;
        }
        let i = self.cursor % self.tenants.len();
        let t = &mut self.tenants[i];
        let newest_first = lifo && now.saturating_duration_since(t.last_empty) >= interval;
        let waiter = if newest_first {
            t.waiters.pop_back()
        } else {
            t.waiters.pop_front()
        };
        self.len -= 1;
        self.cursor = i + 1;
        self.drop_if_empty(i);
        waiter
    }

    /// Removes a waiter that gave up (timed out or was dropped). False if it is no longer queued.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        for i in 0..self.tenants.len() {
            if let Some(j) = self.tenants[i].waiters.iter().position(|w| w.id == id) {
                self.tenants[i].waiters.remove(j);
                self.len -= 1;
                self.drop_if_empty(i);
                return true;
            }
        }
        false
    }

    /// The queue is full and `key` wants in: if some tenant holds at least two more waiters than
    /// `key` does, that tenant gives up its oldest waiter, so one flooding tenant cannot fill the
    /// queue and lock everyone else out.
    pub(crate) fn evict_for(&mut self, key: Option<u64>) -> Option<Waiter> {
        let own = self.find(key).map_or(0, |i| self.tenants[i].waiters.len());
        let (i, heaviest) = self
            .tenants
            .iter()
            .enumerate()
            .max_by_key(|(_, t)| t.waiters.len())?;
        if heaviest.waiters.len() < own + 2 {
            return None;
        }
        let waiter = self.tenants[i].waiters.pop_front();
        self.len -= 1;
        self.drop_if_empty(i);
        waiter
    }

    /// A tenant without waiters leaves the rotation; its entry (and overload clock) starts afresh
    /// with its next waiter.
    fn drop_if_empty(&mut self, i: usize) {
        if self.tenants[i].waiters.is_empty() {
            self.tenants.remove(i);
            if self.cursor > i {
                self.cursor -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64) -> (Waiter, oneshot::Receiver<Outcome>) {
        let (tx, rx) = oneshot::channel();
        (Waiter { id, tx }, rx)
    }

    fn fill(
        q: &mut FairQueue,
        now: Instant,
        items: &[(u64, u64)],
    ) -> Vec<oneshot::Receiver<Outcome>> {
        items
            .iter()
            .map(|&(tenant, id)| {
                let (w, rx) = waiter(id);
                q.push(Some(tenant), w, now);
                rx
            })
            .collect()
    }

    #[test]
    fn tenants_take_turns() {
        let now = Instant::now();
        let mut q = FairQueue::default();
        let _rx = fill(
            &mut q,
            now,
            &[(1, 10), (1, 11), (1, 12), (2, 20), (3, 30), (2, 21)],
        );
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(now, Duration::from_secs(1), true))
            .map(|w| w.id)
            .collect();
        assert_eq!(order, [10, 20, 30, 11, 21, 12]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_flooding_tenant_is_served_newest_first() {
        let t0 = Instant::now();
        let mut q = FairQueue::default();
        let _rx = fill(&mut q, t0, &[(1, 1), (1, 2), (1, 3)]);
        let later = t0 + Duration::from_millis(150);
        let interval = Duration::from_millis(100);
        assert!(q.overloaded(Some(1), later, interval));
        assert!(!q.overloaded(Some(2), later, interval));
        assert_eq!(q.pop(later, interval, true).map(|w| w.id), Some(3));
        assert_eq!(q.pop(later, interval, false).map(|w| w.id), Some(1));
    }

    #[test]
    fn eviction_takes_from_the_heaviest_tenant_only() {
        let now = Instant::now();
        let mut q = FairQueue::default();
        let _rx = fill(&mut q, now, &[(1, 1), (1, 2), (1, 3), (2, 4)]);
        assert_eq!(q.evict_for(Some(3)).map(|w| w.id), Some(1));
        assert_eq!(q.len(), 3);
        // Tenant 1 has 2, tenant 2 has 1: not two more than tenant 2 holds.
        assert!(q.evict_for(Some(2)).is_none());
        assert!(q.remove(4));
        assert!(!q.remove(4));
        assert_eq!(q.len(), 2);
        assert_eq!(q.position(Some(1)), 3);
        assert_eq!(q.position(Some(9)), 2);
    }
}
