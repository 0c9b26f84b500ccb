//! Who causes a sustained overload: the tenant holding over twice its share of the busy slots.
//! Its waits are shortened and its newest waiter goes first; everyone else keeps the normal wait
//! and order (docs/ADMISSION.md, "Fairness between tenants").

use std::collections::HashMap;
use std::time::Duration;

use crate::config::AdmissionConfig;
use crate::keys::KeyHasher;

/// Sustained overload (CoDel: no arrival has found a free slot for `codel_interval`) caused by
/// this tenant at another's expense: another tenant holds a slot or waits, and this one holds
/// over twice its share of the `busy` slots, or it is the one tenant holding any, or nobody
/// holds one and it waits. A tenant at or under its share keeps the normal
/// wait and order, and so does one holding no slot while another holds them all: at a small limit
/// a flooding tenant often holds every slot, and a light tenant arriving then, or queueing a
/// second request, is not the cause of the overload.
#[allow(clippy::too_many_arguments)]
pub(crate) fn flooding(
    slots: &HashMap<Option<u64>, usize, KeyHasher>,
    waiting_tenants: usize,
    queued: bool,
    busy: usize,
    tenant: Option<u64>,
    waiting: bool,
    backlog: Duration,
    cfg: &AdmissionConfig,
) -> bool {
    if backlog < cfg.codel_interval {
        return false;
    }
    let held = slots.get(&tenant).copied().unwrap_or(0);
    let holders = slots.len();
    // Alone in the class (no other tenant holds a slot or waits): the overload is the service's,
    // not this tenant's at anyone else's expense, so it keeps the normal wait and order. The
    // short wait is for sharing; with nobody to share with it would only refuse work that the
    // latency target could carry.
    let others_hold = holders > usize::from(held > 0);
    let others_wait = waiting_tenants > usize::from(queued);
    if !others_hold && !others_wait {
        return false;
    }
    if held == 0 {
        return holders == 0 && waiting;
    }
    holders == 1 || held * holders > 2 * busy
}
