//! Who causes a sustained overload: the tenant whose footprint is over twice its share. Its
//! waits are shortened and its newest waiter goes first; everyone else keeps the normal wait
//! and order (docs/ADMISSION.md, "Fairness between tenants").

use std::collections::HashMap;
use std::time::Duration;

use crate::config::AdmissionConfig;
use crate::keys::KeyHasher;

/// What a class's tenants hold and wait for, to tell who causes a sustained overload.
pub(crate) struct Footprints<'a> {
    pub(crate) slots: &'a HashMap<Option<u64>, usize, KeyHasher>,
    /// Slots in use (at most the limit, at least one).
    pub(crate) busy: usize,
    /// Waiters in the queue, all tenants.
    pub(crate) queued: usize,
    /// Tenants with waiters.
    pub(crate) waiting_tenants: usize,
    /// How long the class has been in overload.
    pub(crate) backlog: Duration,
}

impl Footprints<'_> {
    /// Sustained overload (CoDel: no arrival has found a free slot for `codel_interval`) caused by
    /// this tenant at another's expense: another tenant holds a slot or waits, and this one's
    /// footprint (slots held plus `waiters`) is over twice its share of the class's (busy slots
    /// plus the queue) among the tenants present, or it is the one tenant holding any, or nobody
    /// holds one and it waits (`waiting`). A tenant at or under its share keeps the normal wait
    /// and order, and so does one holding no slot while another holds them all: at a small limit
    /// a flooding tenant often holds every slot, and a light tenant arriving then, or queueing a
    /// second request, is not the cause of the overload. The footprint, not the slots alone: a
    /// light tenant's burst briefly holds more than its share of a small limit, while the tenant
    /// causing the overload is the one with a backlog (at a limit of 24 shared by ten tenants, a
    /// tenant sending a tenth of the capacity held 5 slots in a burst, over twice its 2.4).
    pub(crate) fn flooding(&self, tenant: Option<u64>, waiters: usize, waiting: bool, cfg: &AdmissionConfig) -> bool {
        if self.backlog < cfg.codel_interval {
            return false;
        }
        let held = self.slots.get(&tenant).copied().unwrap_or(0);
        let holders = self.slots.len();
        // Alone in the class (no other tenant holds a slot or waits): the overload is the
        // service's, not this tenant's at anyone else's expense, so it keeps the normal wait and
        // order. The short wait is for sharing; with nobody to share with it would only refuse
        // work that the latency target could carry.
        let others_hold = holders > usize::from(held > 0);
        let others_wait = self.waiting_tenants > usize::from(waiters > 0);
        if !others_hold && !others_wait {
            return false;
        }
        if held == 0 {
            return holders == 0 && waiting;
        }
        // Tenants present: at least the holders, or the waiting tenants if more.
        let present = holders.max(self.waiting_tenants);
        holders == 1 || (held + waiters) * present > 2 * (self.busy + self.queued)
    }
}
