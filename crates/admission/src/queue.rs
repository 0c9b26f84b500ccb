//! The waiting room of one class: a sub-queue per tenant. The next free slot goes to the tenant
//! with the smallest footprint (slots held plus waiters), ties in turn, so a tenant that floods
//! waits behind everyone else; within a tenant, oldest first, or newest first for a flooding one.

use std::collections::VecDeque;
use tokio::sync::oneshot;

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
    pub(crate) tenant: Option<u64>,
    pub(crate) tx: oneshot::Sender<Outcome>,
}

#[derive(Debug)]
struct TenantQueue {
    key: Option<u64>,
    waiters: VecDeque<Waiter>,
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

    /// Tenants with waiters.
    pub(crate) fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Waiters of this tenant.
    pub(crate) fn queued(&self, key: Option<u64>) -> usize {
        self.find(key).map_or(0, |i| self.tenants[i].waiters.len())
    }

    pub(crate) fn push(&mut self, key: Option<u64>, waiter: Waiter) {
        let i = match self.find(key) {
            Some(i) => i,
            None => {
                self.tenants.push(TenantQueue { key, waiters: VecDeque::new() });
                self.tenants.len() - 1
            }
        };
        self.tenants[i].waiters.push_back(waiter);
        self.len += 1;
    }

    /// The next waiter: from the waiting tenant with the smallest footprint (`held(key)` slots
    /// plus its waiters), ties taken in turn (round robin from where the last pick left off);
    /// within a tenant, oldest first, or newest first when `newest_first(key)`.
    pub(crate) fn pop(
        &mut self,
        held: impl Fn(Option<u64>) -> usize,
        newest_first: impl Fn(Option<u64>) -> bool,
    ) -> Option<Waiter> {
        let n = self.tenants.len();
        let i = (0..n)
            .map(|k| (self.cursor + k) % n)
            .min_by_key(|&i| held(self.tenants[i].key) + self.tenants[i].waiters.len())?;
        let t = &mut self.tenants[i];
        let waiter = if newest_first(t.key) { t.waiters.pop_back() } else { t.waiters.pop_front() };
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

    /// The queue is full and `key` wants in: whose waiter to push out, if anyone's. The waiting
    /// tenant with the largest footprint (`held(key)` slots plus its waiters) gives one up if
    /// that footprint is at least two more than `key`'s would be, so one flooding tenant cannot
    /// fill the queue and lock everyone else out.
    pub(crate) fn eviction_victim(&self, key: Option<u64>, held: impl Fn(Option<u64>) -> usize) -> Option<usize> {
        let own = held(key) + self.queued(key);
        let (i, footprint) =
            self.tenants.iter().enumerate().map(|(i, t)| (i, held(t.key) + t.waiters.len())).max_by_key(|&(_, f)| f)?;
        (footprint >= own + 2).then_some(i)
    }

    /// Pushes out the oldest waiter of the tenant at `i` (from [`Self::eviction_victim`]).
    pub(crate) fn evict(&mut self, i: usize) -> Option<Waiter> {
        let waiter = self.tenants.get_mut(i)?.waiters.pop_front();
        if waiter.is_some() {
            self.len -= 1;
            self.drop_if_empty(i);
        }
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
        (Waiter { id, tenant: None, tx }, rx)
    }

    fn fill(q: &mut FairQueue, items: &[(u64, u64)]) -> Vec<oneshot::Receiver<Outcome>> {
        items
            .iter()
            .map(|&(tenant, id)| {
                let (w, rx) = waiter(id);
                q.push(Some(tenant), w);
                rx
            })
            .collect()
    }

    fn drain(q: &mut FairQueue, held: impl Fn(Option<u64>) -> usize + Copy) -> Vec<u64> {
        std::iter::from_fn(|| q.pop(held, |_| false)).map(|w| w.id).collect()
    }

    #[test]
    fn tenants_take_turns() {
        let mut q = FairQueue::default();
        let _rx = fill(&mut q, &[(1, 10), (1, 11), (1, 12), (2, 20), (3, 30), (2, 21)]);
        // Footprints 3, 2, 1: the lightest goes first. (Here nobody's slots grow as they are
        // served; in the real queue they do, and the turns even out.)
        assert_eq!(drain(&mut q, |_| 0), [30, 20, 21, 10, 11, 12]);
        assert!(q.is_empty());
    }

    #[test]
    fn the_tenant_holding_fewest_slots_goes_first() {
        let mut q = FairQueue::default();
        let _rx = fill(&mut q, &[(1, 10), (1, 11), (2, 20), (3, 30)]);
        let held = |k: Option<u64>| match k {
            Some(1) => 0,
            Some(2) => 5,
            _ => 2,
        };
        assert_eq!(drain(&mut q, held), [10, 11, 30, 20]);
    }

    #[test]
    fn a_flooding_tenant_is_served_newest_first() {
        let mut q = FairQueue::default();
        let _rx = fill(&mut q, &[(1, 1), (1, 2), (1, 3)]);
        assert_eq!(q.queued(Some(1)), 3);
        assert_eq!(q.pop(|_| 0, |_| true).map(|w| w.id), Some(3));
        assert_eq!(q.pop(|_| 0, |_| false).map(|w| w.id), Some(1));
    }

    #[test]
    fn eviction_takes_from_the_heaviest_tenant_only() {
        let mut q = FairQueue::default();
        let _rx = fill(&mut q, &[(1, 1), (1, 2), (1, 3), (2, 4)]);
        let evict_for = |q: &mut FairQueue, key, held: &dyn Fn(Option<u64>) -> usize| {
            let i = q.eviction_victim(key, held)?;
            q.evict(i)
        };
        assert_eq!(evict_for(&mut q, Some(3), &|_| 0).map(|w| w.id), Some(1));
        assert_eq!(q.len(), 3);
        // Tenant 1 has 2 waiting, tenant 2 has 1: not two more than tenant 2 would have.
        assert!(evict_for(&mut q, Some(2), &|_| 0).is_none());
        // Unless tenant 1 also holds slots and tenant 2 holds none.
        let held = |k: Option<u64>| if k == Some(1) { 3 } else { 0 };
        assert_eq!(evict_for(&mut q, Some(2), &held).map(|w| w.id), Some(2));
        assert!(q.remove(3));
        assert!(q.remove(4));
        assert!(!q.remove(4));
        assert!(q.is_empty());
        let _rx = fill(&mut q, &[(1, 5), (1, 6), (2, 7)]);
        assert_eq!(q.position(Some(1)), 4);
        assert_eq!(q.position(Some(9)), 3);
    }
}
