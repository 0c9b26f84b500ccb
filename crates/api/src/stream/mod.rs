//! The live inbox: `GET /v1/stream`, the tenant's events as Server-Sent Events.
//!
//! - The events come from the domain's outbox (`breakwater_domain::stream`), written in the same
//!   transaction as each change and numbered after it by one sequencer at a time (every task
//!   runs one, [`listener`]). One listener per task is woken by the sequencer's `NOTIFY`, reads
//!   the new rows of the tenants that have a stream open here, and hands them to the
//!   [`hub::Hub`]; it reconnects and catches up by itself, so a dropped notification connection
//!   loses nothing.
//! - Opening a stream is a request like any other: admitted, throttled, and holding a database
//!   slot while it replays what a `Last-Event-ID` missed. Once its head is sent it holds no
//!   admission slot and no database connection (`breakwater_admission::LongLived`), only its
//!   place under the caps (`STREAM_MAX`, `STREAM_MAX_PER_TENANT`).
//! - Each stream reads from its tenant's ring of `STREAM_BUFFER` events; one that falls further
//!   behind gets `resync` and is closed. An idle stream gets a comment line every
//!   `STREAM_HEARTBEAT_SECS`, under the load balancer's idle timeout.
//! - At shutdown every stream gets a `retry:` hint (a jittered reconnect delay) and ends, so its
//!   client reconnects to another task without a stampede.

pub mod hub;
pub mod listener;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, Sse};
use breakwater_domain::conversations::{AssigneeFilter, ConversationStatus};
use breakwater_domain::stream::{Event, EventKind, Head};
use futures_util::Stream;
use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

pub use hub::{Hub, Refused, StreamStatus, Subscription};

/// How the task's streams are bounded and paced.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Most streams open on the task.
    pub max: usize,
    /// Most streams of one tenant open on the task.
    pub max_per_tenant: usize,
    /// Each tenant's ring of events: how far a stream may fall behind.
    pub buffer: usize,
    /// Most events replayed to a client that resumes; further behind, it gets `resync`.
    pub replay_max: i64,
    /// Between heartbeats on an idle stream.
    pub heartbeat: Duration,
    /// The reconnect delay a client is told (`retry:`), and the base of the jitter added to it.
    pub retry: Duration,
}

/// What a stream carries: the inbox list's own filters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this inbox's conversations.
    pub inbox_id: Option<Uuid>,
    /// Only this assignee's conversations (or the unassigned ones).
    pub assignee: AssigneeFilter,
    /// Only conversations in this status.
    pub status: Option<ConversationStatus>,
}

impl Filter {
    /// Whether an event belongs on a stream with this filter. A `conversation.updated` matches
    /// when the conversation matched before the change or after it (a list must learn that one
    /// left it); `contact.erased` matches every filter (the contact's conversations may be in
    /// any list).
    #[must_use]
    pub fn matches(&self, e: &Event) -> bool {
        if e.kind == EventKind::ContactErased {
            return true;
        }
        if self.inbox_id.is_some() && self.inbox_id != e.inbox_id {
            return false;
        }
        let now = self.state_matches(e.status, e.assignee_id);
        let before = e.previous_status.is_some() && self.state_matches(e.previous_status, e.previous_assignee_id);
        now || before
    }

    fn state_matches(&self, status: Option<ConversationStatus>, assignee: Option<Uuid>) -> bool {
        let status_ok = self.status.is_none() || self.status == status;
        let assignee_ok = match self.assignee {
            AssigneeFilter::Any => true,
            AssigneeFilter::Unassigned => assignee.is_none(),
            AssigneeFilter::User(user) => assignee == Some(user),
        };
        status_ok && assignee_ok
    }
}

/// Where a resuming client starts: what to replay, or that it must re-read its lists.
#[derive(Debug)]
pub enum Resume {
    /// No `Last-Event-ID`: live events from now.
    Live,
    /// These missed events, then live ones.
    Replay { after: i64, events: Vec<Event> },
    /// The events after `after` are gone (retention) or too many to replay: `resync` first,
    /// carrying the tenant's newest id, then live events.
    Resync { head: i64 },
}

impl Resume {
    /// What a client whose last event was `last_event_id` needs, given where its tenant's
    /// sequence stands: `Err` with a message for an id the tenant never issued.
    ///
    /// # Errors
    /// A message for the `invalid_request` envelope.
    pub fn plan(last_event_id: i64, head: Head, replay_max: i64) -> Result<ResumePlan, String> {
        if last_event_id < 0 || last_event_id > head.last_id {
            return Err(format!(
                "Last-Event-ID {last_event_id} is not an event of this tenant (its newest is {})",
                head.last_id
            ));
        }
        if last_event_id < head.pruned_through || head.last_id - last_event_id > replay_max {
            return Ok(ResumePlan::Resync);
        }
        Ok(ResumePlan::Replay { after: last_event_id, through: head.last_id })
    }
}

/// The decision [`Resume::plan`] takes before anything is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumePlan {
    /// Read and replay `(after, through]`.
    Replay { after: i64, through: i64 },
    /// Too far behind: `resync`.
    Resync,
}

/// Parses a `Last-Event-ID` header: a tenant's event number.
///
/// # Errors
/// A message for the `invalid_request` envelope.
pub fn parse_last_event_id(raw: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(raw)
        .ok()
        .map(str::trim)
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|n| *n >= 0)
        .ok_or_else(|| "Last-Event-ID must be the id of an event of this stream (a non-negative integer)".to_owned())
}

/// A delay between `base` and twice `base`, so that clients told the same thing at the same
/// moment do not come back at the same moment.
#[must_use]
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(1.0 + rand::random_range(0.0..1.0))
}

/// The SSE response of a stream: its opening (the reconnect hint, then the replay or `resync`),
/// then live events, heartbeats between them, until the client leaves, falls too far behind,
/// or the task shuts down.
pub fn respond(
    subscription: Subscription,
    hub: Arc<Hub>,
    filter: Filter,
    resume: Resume,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    Sse::new(events(subscription, hub, filter, resume))
}

/// The grid heartbeats fall on: the heartbeats due within the same tenth of a second share one
/// timer tick, so a task with 10,000 idle streams wakes ten times a second for about 50 of them,
/// not 500 times a second for one each (docs/lab/history/2026-12-03-streams.md). A whole-second
/// grid woke less but wrote its heartbeats in bursts ten times larger, which the inbox list's
/// tail showed (docs/lab/history/2026-12-04-heartbeats-100ms-grid.md).
const HEARTBEAT_GRID: Duration = Duration::from_millis(100);

/// When a stream idle since now is next due a heartbeat: `after` from now, rounded up to the next
/// point of the grid on the process's clock.
fn next_heartbeat(after: Duration) -> tokio::time::Instant {
    static EPOCH: std::sync::LazyLock<tokio::time::Instant> = std::sync::LazyLock::new(tokio::time::Instant::now);
    let due = tokio::time::Instant::now() + after;
    let since = due.saturating_duration_since(*EPOCH).as_nanos();
    let grid = HEARTBEAT_GRID.as_nanos();
    let ticks = u64::try_from(since.div_ceil(grid)).unwrap_or(u64::MAX);
    *EPOCH + HEARTBEAT_GRID.saturating_mul(u32::try_from(ticks).unwrap_or(u32::MAX))
}

/// The events of [`respond`], heartbeats included.
fn events(
    subscription: Subscription,
    hub: Arc<Hub>,
    filter: Filter,
    resume: Resume,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let settings = hub.settings().clone();
    let mut opening = VecDeque::new();
    opening.push_back(SseEvent::default().retry(jittered(settings.retry)));
    let mut last = 0;
    match resume {
        Resume::Live => {}
        Resume::Replay { after, events } => {
            last = after;
            for e in events.iter().filter(|e| filter.matches(e)) {
                opening.push_back(render(e));
                hub.sent();
            }
            last = events.last().map_or(last, |e| e.id);
        }
        Resume::Resync { head } => {
            hub.resynced(false);
            opening.push_back(resync(head, "behind"));
            last = head;
        }
    }
    let beat = Box::pin(tokio::time::sleep_until(next_heartbeat(settings.heartbeat)));
    let state = State { subscription, hub, filter, last, opening, done: false, beat };
    futures_util::stream::unfold(state, next)
}

struct State {
    subscription: Subscription,
    hub: Arc<Hub>,
    filter: Filter,
    /// The newest id this stream has passed (sent or filtered out).
    last: i64,
    opening: VecDeque<SseEvent>,
    done: bool,
    /// When the stream is next due a heartbeat (reset by every event).
    beat: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl State {
    /// An event goes out: the next heartbeat is a whole interval away.
    fn sending(&mut self) {
        let heartbeat = self.hub.settings().heartbeat;
        self.beat.as_mut().reset(next_heartbeat(heartbeat));
    }
}

async fn next(mut s: State) -> Option<(Result<SseEvent, Infallible>, State)> {
    // (The opening's events were counted when it was made; its hint and `resync` are no events.)
    if let Some(e) = s.opening.pop_front() {
        s.sending();
        return Some((Ok(e), s));
    }
    if s.done {
        return None;
    }
    loop {
        tokio::select! {
            biased;
            () = s.subscription.closing.cancelled() => {
                // Shutdown: reconnect elsewhere, not all at once.
                s.done = true;
                let hint = SseEvent::default().retry(jittered(s.hub.settings().retry)).comment("shutting down");
                return Some((Ok(hint), s));
            }
            () = s.beat.as_mut() => {
                s.sending();
                return Some((Ok(SseEvent::default().comment("")), s));
            }
            received = s.subscription.events.recv() => match received {
                Ok(e) => {
                    if e.id <= s.last {
                        continue; // already replayed
                    }
                    s.last = e.id;
                    if s.filter.matches(&e) {
                        s.hub.sent();
                        s.sending();
                        return Some((Ok(render(&e)), s));
                    }
                }
                Err(RecvError::Lagged(_)) => {
                    // Too slow: its place in the ring is gone. It must re-read its lists.
                    s.hub.resynced(true);
                    s.done = true;
                    return Some((Ok(resync(s.last, "slow")), s));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }
}

fn render(e: &Event) -> SseEvent {
    let view = crate::views::StreamEvent::from(e);
    SseEvent::default()
        .id(e.id.to_string())
        .event(e.kind.as_str())
        .json_data(view)
        .unwrap_or_else(|_| SseEvent::default().comment("unrenderable event"))
}

/// `resync`: re-read the lists; resume after `id`. `reason` is `behind` (past the retention or
/// the replay cap) or `slow` (the client read too slowly; the stream closes).
fn resync(id: i64, reason: &'static str) -> SseEvent {
    SseEvent::default().id(id.to_string()).event("resync").data(format!(r#"{{"reason":"{reason}"}}"#))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, status: ConversationStatus, assignee: Option<Uuid>) -> Event {
        Event {
            tenant_id: Uuid::nil(),
            id: 1,
            kind,
            at: chrono::Utc::now(),
            contact_id: Uuid::nil(),
            conversation_id: Some(Uuid::nil()),
            inbox_id: Some(Uuid::from_u128(1)),
            status: Some(status),
            assignee_id: assignee,
            previous_status: None,
            previous_assignee_id: None,
            message_id: None,
            preview: None,
        }
    }

    #[test]
    fn filters_are_the_inbox_lists_and_an_update_that_leaves_a_list_is_shown_to_it() {
        use ConversationStatus::{Closed, Open};
        let agent = Uuid::from_u128(7);
        let open_list = Filter { status: Some(Open), ..Filter::default() };
        let mine = Filter { assignee: AssigneeFilter::User(agent), ..Filter::default() };
        let unassigned = Filter { assignee: AssigneeFilter::Unassigned, ..Filter::default() };
        let other_inbox = Filter { inbox_id: Some(Uuid::from_u128(2)), ..Filter::default() };

        let created = event(EventKind::ConversationCreated, Open, None);
        assert!(open_list.matches(&created) && unassigned.matches(&created) && Filter::default().matches(&created));
        assert!(!mine.matches(&created) && !other_inbox.matches(&created));

        // Closed and assigned to the agent: it left the open list and the unassigned one.
        let mut closed = event(EventKind::ConversationUpdated, Closed, Some(agent));
        closed.previous_status = Some(Open);
        assert!(open_list.matches(&closed) && unassigned.matches(&closed) && mine.matches(&closed));
        let mut unrelated = event(EventKind::ConversationUpdated, Closed, None);
        unrelated.previous_status = Some(Closed);
        assert!(!open_list.matches(&unrelated));

        let erased = Event { kind: EventKind::ContactErased, inbox_id: None, status: None, ..created };
        assert!([open_list, mine, unassigned, other_inbox].iter().all(|f| f.matches(&erased)));
    }

    #[test]
    fn a_resume_replays_what_is_kept_and_resyncs_what_is_not() {
        let head = Head { last_id: 100, pruned_through: 40 };
        assert_eq!(Resume::plan(90, head, 50), Ok(ResumePlan::Replay { after: 90, through: 100 }));
        assert_eq!(Resume::plan(100, head, 50), Ok(ResumePlan::Replay { after: 100, through: 100 }));
        assert_eq!(Resume::plan(40, head, 50), Ok(ResumePlan::Resync), "its next event (41) is kept... but 50 away");
        assert_eq!(Resume::plan(39, head, 500), Ok(ResumePlan::Resync), "event 40 is gone");
        assert_eq!(Resume::plan(40, head, 500), Ok(ResumePlan::Replay { after: 40, through: 100 }));
        assert!(Resume::plan(101, head, 50).is_err(), "from the future");
        assert!(Resume::plan(0, Head::default(), 50).is_ok(), "a tenant with no events yet");
    }

    fn settings(buffer: usize) -> Settings {
        Settings {
            max: 10,
            max_per_tenant: 10,
            buffer,
            replay_max: 100,
            heartbeat: Duration::from_secs(20),
            retry: Duration::from_secs(1),
        }
    }

    /// The frames a stream yields now, as text (`None`: it ended).
    async fn frames(
        stream: &mut (impl Stream<Item = Result<SseEvent, Infallible>> + Unpin),
        n: usize,
    ) -> Vec<Option<String>> {
        use futures_util::StreamExt as _;
        let mut out = Vec::new();
        for _ in 0..n {
            let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await.ok();
            out.push(next.and_then(|e| e.map(|e| format!("{:?}", e.unwrap_or_else(|never| match never {})))));
        }
        out
    }

    #[tokio::test]
    async fn a_client_that_falls_further_behind_than_the_buffer_gets_resync_and_is_closed() {
        let hub = Arc::new(Hub::new(settings(2)));
        hub.listener_connected(true);
        let tenant = breakwater_domain::TenantId(Uuid::nil());
        let subscription = hub.subscribe(tenant).expect("under the caps");
        let mut stream = Box::pin(events(subscription, hub.clone(), Filter::default(), Resume::Live));
        // The client has read nothing while five events came: more than its ring holds.
        for id in 1..=5 {
            hub.publish(Event { id, ..event(EventKind::MessageCreated, ConversationStatus::Open, None) });
        }
        let got = frames(&mut stream, 3).await;
        assert!(got[0].as_deref().is_some_and(|f| f.contains("retry:")), "{got:?}");
        assert!(got[1].as_deref().is_some_and(|f| f.contains("event: resync") && f.contains("slow")), "{got:?}");
        assert_eq!(got[2], None, "and then it ends");
        assert_eq!(hub.status().dropped_slow, 1);
        drop(stream);
        assert_eq!(hub.status().open, 0, "its place under the caps is given back");
        assert!(!hub.wants(tenant), "and the tenant's ring with the last stream");
    }

    #[tokio::test]
    async fn a_client_within_the_buffer_gets_every_event_in_order() {
        let hub = Arc::new(Hub::new(settings(8)));
        hub.listener_connected(true);
        let subscription = hub.subscribe(breakwater_domain::TenantId(Uuid::nil())).expect("under the caps");
        let mut stream = Box::pin(events(subscription, hub.clone(), Filter::default(), Resume::Live));
        for id in 1..=5 {
            hub.publish(Event { id, ..event(EventKind::MessageCreated, ConversationStatus::Open, None) });
        }
        let got = frames(&mut stream, 7).await;
        for (n, frame) in got[1..6].iter().enumerate() {
            assert!(frame.as_deref().is_some_and(|f| f.contains(&format!("id: {}", n + 1))), "{got:?}");
        }
        assert!(got[6].is_none(), "nothing more yet: {got:?}");
    }

    #[test]
    fn last_event_ids_are_non_negative_integers() {
        assert_eq!(parse_last_event_id(b"42"), Ok(42));
        assert_eq!(parse_last_event_id(b" 7 "), Ok(7));
        for bad in [&b""[..], b"-1", b"abc", b"1.5", b"99999999999999999999", b"\xff"] {
            assert!(parse_last_event_id(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn heartbeats_fall_on_the_grid_a_full_interval_away() {
        let before = tokio::time::Instant::now();
        let first = next_heartbeat(Duration::from_secs(20));
        let after = tokio::time::Instant::now();
        assert!(first >= before + Duration::from_secs(20), "{:?}", first - before);
        assert!(first <= after + Duration::from_secs(20) + HEARTBEAT_GRID, "{:?}", first - after);
        let later = next_heartbeat(Duration::from_secs(20));
        // Streams idle since moments apart share a tick (unless a point of the grid fell between).
        let apart = later.saturating_duration_since(first);
        assert!(apart == Duration::ZERO || apart == HEARTBEAT_GRID, "{apart:?}");
    }

    #[test]
    fn jitter_stays_between_once_and_twice_the_base() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(2));
            assert!(d >= Duration::from_secs(2) && d < Duration::from_secs(4), "{d:?}");
        }
    }
}
