//! The dataset, generated in memory before anything is written: every row of every table,
//! except message bodies, which are derived from `(seed, message ordinal)` when they are encoded.
//!
//! Everything comes from ChaCha8 streams keyed by `--seed`: one stream for the tenant-level
//! draws, one per tenant, one per message body. Nothing reads the clock, so a seed always gives
//! the same rows, and generating tenants in parallel gives the same rows as generating them in
//! order.
//!
//! Rows are sorted by their UUIDv7 key, whose timestamp is the row's `created_at`: the tables
//! are written in time order, as a production database fills up, so the heap's physical order
//! (and the planner's correlation statistics) look like production's.
//!
//! [`Plan::generate`] draws the tenants, then generates each tenant's rows (`tenant`) on a few
//! threads, then merges them in key order.

mod tenant;

use std::ops::Range;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use uuid::Uuid;

use self::tenant::{TenantCtx, TenantRows};
pub use crate::enums::{Sender, Status};
use crate::text;

/// Microseconds in a second and in a day.
pub(crate) const SECOND: i64 = 1_000_000;
const DAY: i64 = 86_400 * SECOND;
const YEAR: i64 = 365 * DAY;
/// The preview the API keeps of a conversation's newest message (`breakwater_domain`'s rule).
pub(crate) const PREVIEW_CHARS: usize = breakwater_domain::messages::PREVIEW_CHARS;

/// How much to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizes {
    /// Tenants.
    pub tenants: usize,
    /// Conversations over all tenants.
    pub conversations: usize,
    /// Messages over all tenants.
    pub messages: usize,
    /// The biggest tenant's share of conversations, contacts and messages (0 < skew <= 1).
    pub skew: f64,
}

impl Sizes {
    /// The production shape: 50 tenants, 400,000 conversations, 2,000,000 messages, 55% in one.
    pub const FULL: Self = Self { tenants: 50, conversations: 400_000, messages: 2_000_000, skew: 0.55 };
    /// For tests and the dev stack: seeds in a second or two.
    pub const SMALL: Self = Self { tenants: 5, conversations: 2_000, messages: 10_000, skew: 0.55 };

    /// Checks the sizes make a dataset.
    ///
    /// # Errors
    /// A message saying which size is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.tenants == 0 || self.tenants > 100_000 {
            return Err("--tenants must be between 1 and 100000".into());
        }
        if self.conversations < self.tenants {
            return Err("--conversations must be at least --tenants (every tenant gets one)".into());
        }
        if self.conversations > 100_000_000 || self.messages > 1_000_000_000 {
            return Err("--conversations or --messages is too large for one machine".into());
        }
        if !(self.skew > 0.0 && self.skew <= 1.0) {
            return Err("--skew must be in (0, 1]".into());
        }
        if self.skew * float(self.tenants) < 1.0 - 1e-9 {
            return Err("--skew must be at least 1/--tenants, or the skewed tenant would not be the biggest".into());
        }
        Ok(())
    }
}

/// A tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Key.
    pub id: Uuid,
    /// Company name.
    pub name: String,
    /// Unix microseconds.
    pub created_at: i64,
}

/// An agent or admin.
#[derive(Debug, Clone)]
pub struct User {
    /// Its tenant.
    pub tenant_id: Uuid,
    /// Key.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// Work email.
    pub email: String,
    /// `true` for `admin`, else `agent`.
    pub admin: bool,
    /// Unix microseconds.
    pub created_at: i64,
}

/// An inbox (channel).
#[derive(Debug, Clone)]
pub struct Inbox {
    /// Its tenant.
    pub tenant_id: Uuid,
    /// Key.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// `web`, `email`, `whatsapp`, `sms` or `api`.
    pub channel: &'static str,
    /// Unix microseconds.
    pub created_at: i64,
}

/// An end customer.
#[derive(Debug, Clone)]
pub struct Contact {
    /// Its tenant.
    pub tenant_id: Uuid,
    /// Key.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// Email, for most.
    pub email: Option<String>,
    /// Unix microseconds.
    pub created_at: i64,
}

/// A conversation, with the fields denormalised from its messages.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// Its tenant.
    pub tenant_id: Uuid,
    /// Key.
    pub id: Uuid,
    /// Its inbox.
    pub inbox_id: Uuid,
    /// Its contact.
    pub contact_id: Uuid,
    /// Its agent, if assigned.
    pub assignee_id: Option<Uuid>,
    /// Where it stands.
    pub status: Status,
    /// Unix microseconds.
    pub created_at: i64,
    /// The newest message's `created_at`, or `created_at` when it has none.
    pub last_activity_at: i64,
    /// The first [`PREVIEW_CHARS`] characters of the newest message.
    pub preview: Option<String>,
    /// How many messages it has.
    pub message_count: u32,
}

/// A message, without its body (see [`Plan::body`]).
#[derive(Debug, Clone)]
pub struct Message {
    /// Key.
    pub id: Uuid,
    /// Its conversation.
    pub conversation_id: Uuid,
    /// Unix microseconds.
    pub created_at: i64,
    /// Its tenant.
    pub tenant_id: Uuid,
    /// The agent who wrote it, for `sender = agent`.
    pub author_id: Option<Uuid>,
    /// Names the body's random stream.
    pub ordinal: u32,
    /// Who wrote it.
    pub sender: Sender,
}

/// The whole dataset.
#[derive(Debug)]
pub struct Plan {
    /// `--seed`.
    pub seed: u64,
    /// Tenants, by key.
    pub tenants: Vec<Tenant>,
    /// Users, by key.
    pub users: Vec<User>,
    /// Inboxes, by key.
    pub inboxes: Vec<Inbox>,
    /// Contacts, by key (time order).
    pub contacts: Vec<Contact>,
    /// Conversations, by key (time order).
    pub conversations: Vec<Conversation>,
    /// Messages, by key (time order).
    pub messages: Vec<Message>,
    /// The tenant with the largest share, and one of its admins.
    pub biggest: (Uuid, Uuid),
    bodies: ChaCha8Rng,
}

/// Streams of the ChaCha8 key derived from the seed: bodies use streams `0..2^32` (the
/// message ordinal), tenants `TENANT_STREAM + index`, the tenant-level draws `GLOBAL_STREAM`.
const TENANT_STREAM: u64 = 1 << 40;
const GLOBAL_STREAM: u64 = 1 << 41;

fn stream(seed: u64, n: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(n);
    rng
}

/// A UUIDv7 for a row created at `at` (unix microseconds): the timestamp from the row, the
/// random bits from the seeded stream.
fn uuid_v7(rng: &mut impl RngCore, at: i64) -> Uuid {
    let mut random = [0u8; 10];
    rng.fill_bytes(&mut random);
    let millis = u64::try_from(at.div_euclid(1_000)).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid()
}

/// A float-to-count conversion for values the caller has already bounded.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn floor_usize(x: f64) -> usize {
    if x.is_finite() && x > 0.0 { x.floor() as usize } else { 0 }
}

#[allow(clippy::cast_possible_truncation)]
fn micros(x: f64) -> i64 {
    x.round() as i64
}

#[allow(clippy::cast_precision_loss)]
fn float(n: usize) -> f64 {
    n as f64
}

fn index32(i: usize) -> u32 {
    u32::try_from(i).expect("row counts are validated to fit u32")
}

#[allow(clippy::cast_precision_loss)]
fn float64(n: i64) -> f64 {
    n as f64
}

/// Splits `total` into parts proportional to `weights`, exactly (largest remainder first).
pub(crate) fn split(total: usize, weights: &[f64]) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    if weights.is_empty() || sum <= 0.0 {
        return vec![0; weights.len()];
    }
    let quotas: Vec<f64> = weights.iter().map(|w| float(total) * w / sum).collect();
    let mut parts: Vec<usize> = quotas.iter().map(|q| floor_usize(*q)).collect();
    let given: usize = parts.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (quotas[a] - quotas[a].floor(), quotas[b] - quotas[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(total.saturating_sub(given)) {
        parts[i] += 1;
    }
    parts
}

/// The tenants' shares: the first has `skew`, the rest follow a long tail (rank^-1.1), flattened
/// if need be so that none of them is bigger than the first.
pub(crate) fn shares(tenants: usize, skew: f64) -> Vec<f64> {
    if tenants == 1 {
        return vec![1.0];
    }
    let tail = |exponent: f64| {
        let w: Vec<f64> = (1..tenants).map(|r| float(r).powf(-exponent)).collect();
        let sum: f64 = w.iter().sum();
        w.into_iter().map(|w| (1.0 - skew) * w / sum).collect::<Vec<f64>>()
    };
    let mut exponent = 1.1;
    let mut rest = tail(exponent);
    while rest[0] > skew && exponent > 1e-6 {
        exponent /= 2.0;
        rest = tail(exponent);
    }
    if rest[0] > skew {
        rest = tail(0.0);
    }
    std::iter::once(skew).chain(rest).collect()
}

/// Parameters of one generation.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Sizes and skew.
    pub sizes: Sizes,
    /// `--seed`.
    pub seed: u64,
    /// The end of the seeded year (unix microseconds).
    pub until: i64,
}

impl Plan {
    /// Generates the dataset.
    ///
    /// # Panics
    /// Never for validated [`Sizes`].
    #[must_use]
    pub fn generate(params: Params) -> Self {
        let Params { sizes, seed, until } = params;
        let mut global = stream(seed, GLOBAL_STREAM);
        let names = text::tenant_names(&mut global, sizes.tenants);
        let weights = shares(sizes.tenants, sizes.skew);
        // Every tenant gets at least one conversation; the rest follow the shares.
        let mut conversations = split(sizes.conversations - sizes.tenants, &weights);
        for c in &mut conversations {
            *c += 1;
        }
        let messages = split(sizes.messages, &weights);
        let (tenants, domains): (Vec<Tenant>, Vec<String>) = names
            .into_iter()
            .map(|(name, domain)| {
                let created_at = until - YEAR - 30 * DAY - global.random_range(0..(3 * YEAR));
                (Tenant { id: uuid_v7(&mut global, created_at), name, created_at }, domain)
            })
            .unzip();

        // Message ordinals are allotted per tenant up front, so tenants generate independently
        // (and in parallel) and still give the same rows.
        let ordinals: Vec<Range<usize>> = messages
            .iter()
            .scan(0usize, |next, m| {
                let ordinals = *next..*next + m;
                *next = ordinals.end;
                Some(ordinals)
            })
            .collect();
        let bodies = stream(seed, 0);
        let next_tenant = std::sync::atomic::AtomicUsize::new(0);
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get).clamp(1, 4);
        let mut per_tenant: Vec<(usize, TenantRows)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            // Tenant 0, the big one, is taken first; the others share the rest.
                            let t = next_tenant.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if t >= tenants.len() {
                                break done;
                            }
                            let ctx = TenantCtx {
                                tenant: &tenants[t],
                                domain: &domains[t],
                                conversations: conversations[t],
                                ordinals: ordinals[t].clone(),
                                until,
                                bodies: &bodies,
                            };
                            done.push((t, ctx.generate(&mut stream(seed, TENANT_STREAM + t as u64))));
                        }
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().expect("a generator thread panicked")).collect()
        });
        per_tenant.sort_unstable_by_key(|(t, _)| *t);

        let admin =
            per_tenant.first().and_then(|(_, rows)| rows.users.iter().find(|u| u.admin)).map_or(Uuid::nil(), |u| u.id);
        let mut plan = Self {
            seed,
            biggest: (tenants[0].id, admin),
            tenants,
            users: Vec::new(),
            inboxes: Vec::new(),
            contacts: Vec::new(),
            conversations: Vec::with_capacity(sizes.conversations),
            messages: Vec::new(),
            bodies,
        };
        let mut message_runs = Vec::with_capacity(per_tenant.len());
        for (_, rows) in per_tenant {
            plan.users.extend(rows.users);
            plan.inboxes.extend(rows.inboxes);
            plan.contacts.extend(rows.contacts);
            plan.conversations.extend(rows.conversations);
            message_runs.push(rows.messages);
        }
        plan.messages = merge_sorted(message_runs);
        plan.tenants.sort_unstable_by_key(|t| t.id);
        plan.users.sort_unstable_by_key(|u| u.id);
        plan.inboxes.sort_unstable_by_key(|i| i.id);
        plan.contacts.sort_unstable_by_key(|c| c.id);
        plan.conversations.sort_unstable_by_key(|c| c.id);
        plan
    }

    /// Writes a message's body, a pure function of the seed and the message's ordinal, to `out`.
    pub fn body(&self, message: &Message, out: &mut String) {
        body(&self.bodies, message.ordinal, message.sender, out);
    }
}

fn body(bodies: &ChaCha8Rng, ordinal: u32, sender: Sender, out: &mut String) {
    let mut rng = bodies.clone();
    rng.set_stream(u64::from(ordinal));
    text::body(&mut rng, sender, out);
}

/// Merges per-tenant runs, each sorted by key, into one sorted vector (a k-way merge moves each
/// row once, where concatenating and sorting would move it dozens of times).
fn merge_sorted(runs: Vec<Vec<Message>>) -> Vec<Message> {
    use std::cmp::Reverse;
    let total = runs.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    let mut iters: Vec<std::vec::IntoIter<Message>> = runs.into_iter().map(Vec::into_iter).collect();
    let mut heads = std::collections::BinaryHeap::new();
    let mut pending: Vec<Option<Message>> = iters.iter_mut().map(Iterator::next).collect();
    for (run, head) in pending.iter().enumerate() {
        if let Some(m) = head {
            heads.push(Reverse((m.id, run)));
        }
    }
    while let Some(Reverse((_, run))) = heads.pop() {
        if let Some(m) = pending[run].take() {
            out.push(m);
        }
        pending[run] = iters[run].next();
        if let Some(m) = &pending[run] {
            heads.push(Reverse((m.id, run)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_exact_and_proportional() {
        let parts = split(1_000, &[0.55, 0.25, 0.2]);
        assert_eq!(parts, vec![550, 250, 200]);
        let parts = split(10, &[1.0, 1.0, 1.0]);
        assert_eq!(parts.iter().sum::<usize>(), 10);
        assert_eq!(split(7, &[0.0, 0.0]), vec![0, 0]);
    }

    #[test]
    fn shares_give_the_top_tenant_the_skew() {
        let s = shares(50, 0.55);
        assert!((s[0] - 0.55).abs() < 1e-12);
        assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(s.windows(2).skip(1).all(|w| w[0] >= w[1]), "a long tail, biggest first");
        let flat = shares(5, 0.3);
        assert!(flat[1..].iter().all(|&x| x <= 0.3), "{flat:?}");
        assert!((flat.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn v7_keys_follow_time() {
        let mut rng = stream(1, 1);
        let a = uuid_v7(&mut rng, 1_700_000_000_000_000);
        let b = uuid_v7(&mut rng, 1_700_000_000_001_000);
        assert_eq!(a.get_version_num(), 7);
        assert!(a < b);
    }

    #[test]
    fn a_small_plan_is_consistent() {
        let plan = Plan::generate(Params { sizes: Sizes::SMALL, seed: 3, until: 1_790_000_000_000_000 });
        assert_eq!(plan.conversations.len(), 2_000);
        assert_eq!(plan.messages.len(), 10_000);
        let total: u32 = plan.conversations.iter().map(|c| c.message_count).sum();
        assert_eq!(total, 10_000);
        assert!(plan.messages.windows(2).all(|w| w[0].id < w[1].id));
    }
}
