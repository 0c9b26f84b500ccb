//! One tenant's rows: its admins and agents, inboxes, contacts, conversations and messages, all
//! drawn from the tenant's own stream. [`TenantCtx::generate`] makes the draws in a fixed order
//! (users, inboxes, opening times, contacts, message counts, then each conversation with its
//! messages), so the same tenant always gets the same rows, whichever thread generates it.

use std::ops::Range;

use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use uuid::Uuid;

use super::{
    Contact, Conversation, DAY, Inbox, Message, PREVIEW_CHARS, SECOND, Sender, Status, Tenant, User, YEAR, body, float,
    float64, floor_usize, index32, micros, split, uuid_v7,
};
use crate::text;

/// Conversations per contact, on average.
const CONVERSATIONS_PER_CONTACT: f64 = 2.2;

/// A sampler over `0..weights.len()` by cumulative weights.
struct Weighted(Vec<f64>);

impl Weighted {
    /// Weights `1/(i+1)^exponent` for `n` items: a few busy ones, a tail of quiet ones.
    fn zipf(n: usize, exponent: f64) -> Self {
        let mut acc = 0.0;
        Self(
            (0..n)
                .map(|i| {
                    acc += float(i + 1).powf(-exponent);
                    acc
                })
                .collect(),
        )
    }

    fn sample(&self, rng: &mut impl Rng) -> usize {
        let total = self.0.last().copied().unwrap_or(0.0);
        let x = rng.random::<f64>() * total;
        self.0.partition_point(|&c| c <= x).min(self.0.len().saturating_sub(1))
    }
}

/// One tenant's rows before the global sort.
#[derive(Default)]
pub(super) struct TenantRows {
    pub(super) users: Vec<User>,
    pub(super) inboxes: Vec<Inbox>,
    pub(super) contacts: Vec<Contact>,
    pub(super) conversations: Vec<Conversation>,
    pub(super) messages: Vec<Message>,
}

/// What one tenant's generation needs.
pub(super) struct TenantCtx<'a> {
    pub(super) tenant: &'a Tenant,
    pub(super) domain: &'a str,
    pub(super) conversations: usize,
    /// The ordinals of the tenant's messages: as many as it has, allotted to it up front.
    pub(super) ordinals: Range<usize>,
    pub(super) until: i64,
    pub(super) bodies: &'a ChaCha8Rng,
}

impl TenantCtx<'_> {
    /// Generates the tenant's rows from its stream `rng`; its messages come out sorted by key.
    pub(super) fn generate(&self, rng: &mut ChaCha8Rng) -> TenantRows {
        let (users, agent_ids) = self.users(rng);
        let inboxes = self.inboxes(rng);
        let opened = self.opening_times(rng);
        let (contacts, slots) = self.contacts(rng, &opened);
        let counts = self.message_counts(rng);
        let mut rows = TenantRows {
            users,
            inboxes,
            contacts,
            conversations: Vec::with_capacity(self.conversations),
            messages: Vec::with_capacity(self.ordinals.len()),
        };
        self.add_conversations(rng, &mut rows, &agent_ids, &opened, &slots, &counts);
        rows.messages.sort_unstable_by_key(|m| m.id);
        rows
    }

    /// The tenant's users, admins first, and the keys of its agents.
    fn users(&self, rng: &mut ChaCha8Rng) -> (Vec<User>, Vec<Uuid>) {
        let (convs, tenant_id) = (self.conversations, self.tenant.id);
        let onboarded = self.tenant.created_at;

        // Agents scale with the tenant (2 for the smallest, ~120 for the 55% one), plus admins.
        let agents = floor_usize((float(convs).sqrt() / 4.0).round()).clamp(2, 150);
        let admins = 1 + usize::from(convs >= 10_000) + usize::from(convs >= 100_000);
        let users: Vec<User> = (0..admins + agents)
            .map(|n| {
                let who = text::person(rng);
                let created_at = onboarded + rng.random_range(0..30 * DAY);
                User {
                    tenant_id,
                    id: uuid_v7(rng, created_at),
                    email: text::work_email(&who, n, self.domain),
                    name: who.name,
                    admin: n < admins,
                    created_at,
                }
            })
            .collect();
        let agent_ids: Vec<Uuid> = users[admins..].iter().map(|u| u.id).collect();
        (users, agent_ids)
    }

    /// The tenant's inboxes: two for the smallest, more as it grows, twelve at most.
    fn inboxes(&self, rng: &mut ChaCha8Rng) -> Vec<Inbox> {
        let (convs, tenant_id) = (self.conversations, self.tenant.id);
        let onboarded = self.tenant.created_at;
        let inbox_count = (2 + floor_usize((float(convs) / 500.0).log2())).clamp(2, 12);
        (0..inbox_count)
            .map(|i| {
                let (name, channel) = text::inbox(i);
                let created_at = onboarded + rng.random_range(0..30 * DAY);
                Inbox { tenant_id, id: uuid_v7(rng, created_at), name, channel, created_at }
            })
            .collect()
    }

    /// When each conversation opens, in time order.
    fn opening_times(&self, rng: &mut ChaCha8Rng) -> Vec<i64> {
        let year_start = self.until - YEAR;

        // When conversations open: over the year, four times denser at its end than its start
        // (inverse CDF of a density growing like e^(k t), k = ln 4).
        let k = 4f64.ln();
        let mut opened: Vec<i64> = (0..self.conversations)
            .map(|_| {
                let u: f64 = rng.random();
                let f = (1.0 + u * (k.exp() - 1.0)).ln() / k;
                year_start + micros(f * float64(YEAR))
            })
            .collect();
        opened.sort_unstable();
        opened
    }

    /// The tenant's contacts, and for each conversation (in the order of `opened`, when each
    /// opens) the index of its contact. A contact is created shortly before its first
    /// conversation.
    fn contacts(&self, rng: &mut ChaCha8Rng, opened: &[i64]) -> (Vec<Contact>, Vec<u32>) {
        let (convs, tenant_id) = (self.conversations, self.tenant.id);
        let year_start = self.until - YEAR;

        // Conversations per contact: a fixed number of contacts per conversation (so contacts
        // follow the tenant's share), each with one conversation plus a share of the rest by
        // power-law weights (alpha 1.5): most write in once, a few hundreds of times.
        let contact_count = floor_usize((float(convs) / CONVERSATIONS_PER_CONTACT).round()).clamp(1, convs);
        let tail: Vec<f64> = (0..contact_count).map(|_| (1.0 - rng.random::<f64>()).powf(-1.0 / 1.5) - 1.0).collect();
        let mut per_contact = split(convs - contact_count, &tail);
        for n in &mut per_contact {
            *n += 1;
        }
        let mut slots: Vec<u32> =
            per_contact.iter().enumerate().flat_map(|(j, &n)| std::iter::repeat_n(index32(j), n)).collect();
        slots.shuffle(rng);
        let mut first_seen = vec![i64::MAX; per_contact.len()];
        for (i, &j) in slots.iter().enumerate() {
            let j = j as usize;
            first_seen[j] = first_seen[j].min(opened[i]);
        }
        // One in twenty contacts never wrote in (imported from a CRM, say).
        let idle = per_contact.len() / 20;
        let contacts: Vec<Contact> = (0..per_contact.len() + idle)
            .map(|j| {
                let created_at = match first_seen.get(j) {
                    Some(&first) => first - rng.random_range(0..2 * 3_600 * SECOND),
                    None => year_start + rng.random_range(0..YEAR),
                };
                let who = text::person(rng);
                let email = rng.random_bool(0.85).then(|| text::contact_email(rng, &who));
                Contact { tenant_id, id: uuid_v7(rng, created_at), name: who.name, email, created_at }
            })
            .collect();
        (contacts, slots)
    }

    /// How many messages each conversation has; they add up to the tenant's messages.
    fn message_counts(&self, rng: &mut ChaCha8Rng) -> Vec<usize> {
        let (convs, msgs) = (self.conversations, self.ordinals.len());

        // Messages per conversation: at least one (but for 1 in 200 just opened by an agent),
        // the rest dealt by log-normal weights, so a few conversations run to hundreds.
        let empty: Vec<bool> = (0..convs).map(|_| msgs >= convs && rng.random_bool(0.005)).collect();
        let nonempty = empty.iter().filter(|e| !**e).count();
        let base = usize::from(msgs >= nonempty);
        let weight = LogNormal::new(0.0, 1.1).expect("finite parameters");
        let weights: Vec<f64> = empty.iter().map(|&e| if e { 0.0 } else { weight.sample(rng) }).collect();
        let mut counts = split(msgs - base * nonempty, &weights);
        for (c, e) in counts.iter_mut().zip(&empty) {
            if !e {
                *c += base;
            }
        }
        counts
    }

    /// Adds the conversations to `rows`, each with its messages: the `i`th opens at `opened[i]`,
    /// with the contact `slots[i]` of `rows.contacts`, and has `counts[i]` messages. The agents
    /// (`agent_ids`) are assigned and write replies; the inboxes are picked from `rows.inboxes`.
    fn add_conversations(
        &self,
        rng: &mut ChaCha8Rng,
        rows: &mut TenantRows,
        agent_ids: &[Uuid],
        opened: &[i64],
        slots: &[u32],
        counts: &[usize],
    ) {
        let (tenant_id, until) = (self.tenant.id, self.until);
        let pick_agent = Weighted::zipf(agent_ids.len(), 0.6);
        let pick_inbox = Weighted::zipf(rows.inboxes.len(), 0.9);
        let (conversations, messages) = (&mut rows.conversations, &mut rows.messages);

        // Gaps between messages: a few minutes typically, hours sometimes, and now and then the
        // contact comes back days later.
        let gap = LogNormal::new(180f64.ln(), 1.6).expect("finite parameters");
        let mut ordinal = index32(self.ordinals.start);
        let mut times = Vec::new();
        let mut scratch = String::new();
        for (i, &created_at) in opened.iter().enumerate() {
            times.clear();
            let mut at = created_at + rng.random_range(0..5 * SECOND);
            for m in 0..counts[i] {
                if m > 0 {
                    at += if rng.random_bool(0.04) {
                        rng.random_range(DAY..10 * DAY)
                    } else {
                        micros(gap.sample(rng) * float64(SECOND)).max(SECOND)
                    };
                }
                times.push(at);
            }
            squeeze_before(&mut times, until);
            let last_activity_at = times.last().copied().unwrap_or(created_at);
            let status = status_after(until - last_activity_at, rng);
            let unassigned = match status {
                Status::Open => 0.30,
                Status::Pending => 0.08,
                Status::Closed => 0.04,
            };
            let assignee_id = (!rng.random_bool(unassigned)).then(|| agent_ids[pick_agent.sample(rng)]);
            let id = uuid_v7(rng, created_at);
            let mut sender = Sender::Contact;
            for (m, &at) in times.iter().enumerate() {
                if m > 0 {
                    sender = next_sender(sender, rng);
                }
                let author_id = (sender == Sender::Agent).then(|| match assignee_id {
                    Some(a) if rng.random_bool(0.9) => a,
                    _ => agent_ids[pick_agent.sample(rng)],
                });
                messages.push(Message {
                    id: uuid_v7(rng, at),
                    conversation_id: id,
                    created_at: at,
                    tenant_id,
                    author_id,
                    ordinal,
                    sender,
                });
                ordinal += 1;
            }
            let preview = messages.last().filter(|m| m.conversation_id == id).map(|m| {
                body(self.bodies, m.ordinal, m.sender, &mut scratch);
                scratch.chars().take(PREVIEW_CHARS).collect()
            });
            conversations.push(Conversation {
                tenant_id,
                id,
                inbox_id: rows.inboxes[pick_inbox.sample(rng)].id,
                contact_id: rows.contacts[slots[i] as usize].id,
                assignee_id,
                status,
                created_at,
                last_activity_at,
                preview,
                message_count: index32(counts[i]),
            });
        }
    }
}

/// Compresses a conversation's message times that run past the end of the seeded year so they
/// end at it, keeping their order (strictly increasing).
fn squeeze_before(times: &mut [i64], until: i64) {
    let (Some(&first), Some(&last)) = (times.first(), times.last()) else { return };
    if last <= until || times.len() < 2 {
        return;
    }
    let scale = float64((until - first).max(0)) / float64(last - first);
    let mut previous = first;
    for t in times.iter_mut().skip(1) {
        *t = (first + micros(float64(*t - first) * scale)).max(previous + 1);
        previous = *t;
    }
}

/// Recent conversations are often still open or waiting; old ones are nearly all closed.
fn status_after(idle: i64, rng: &mut impl Rng) -> Status {
    let (open, pending) = if idle < 2 * DAY {
        (0.45, 0.25)
    } else if idle < 14 * DAY {
        (0.12, 0.13)
    } else {
        (0.03, 0.02)
    };
    let x: f64 = rng.random();
    if x < open {
        Status::Open
    } else if x < open + pending {
        Status::Pending
    } else {
        Status::Closed
    }
}

/// Who writes next: mostly turns between contact and agent, sometimes a second message from
/// the same side, now and then a system notice.
fn next_sender(previous: Sender, rng: &mut impl Rng) -> Sender {
    let x: f64 = rng.random();
    match previous {
        Sender::Contact if x < 0.70 => Sender::Agent,
        Sender::Contact if x < 0.95 => Sender::Contact,
        Sender::Agent if x < 0.65 => Sender::Contact,
        Sender::Agent if x < 0.95 => Sender::Agent,
        Sender::System if x < 0.60 => Sender::Agent,
        Sender::System => Sender::Contact,
        _ => Sender::System,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeezing_keeps_order_and_ends_in_time() {
        let mut t = vec![0, 10, 20, 1_000];
        squeeze_before(&mut t, 100);
        assert_eq!(t.first(), Some(&0));
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        assert!(*t.last().expect("non-empty") <= 100);
    }
}
