//! The task's streams: who is subscribed to which tenant's events, the caps, and the figures.
//!
//! Each tenant with a stream open on this task has one `tokio::sync::broadcast` channel of
//! `STREAM_BUFFER` events; the listener sends each event once, and every stream of the tenant
//! reads it from the channel's ring. That ring is each stream's bounded buffer: a stream that
//! falls more than `STREAM_BUFFER` events behind (its client reads too slowly) finds it has
//! lagged, sends `resync` and closes. Memory is bounded by the caps times the ring, whatever the
//! clients do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use breakwater_domain::TenantId;
use breakwater_domain::stream::Event;
use serde::Serialize;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::Settings;

/// The streams open on this task.
#[derive(Debug)]
pub struct Hub {
    settings: Settings,
    tenants: Mutex<HashMap<TenantId, Channel>>,
    open: AtomicUsize,
    closing: CancellationToken,
    listener_connected: AtomicBool,
    /// Set once the listener has connected for the first time: before, a stream could miss
    /// events committed between its opening and the listener's first `LISTEN`, so none opens.
    /// (Later reconnections catch up from the heads, so streams open through them.)
    listening: AtomicBool,
    counters: Counters,
}

#[derive(Debug)]
struct Channel {
    sender: broadcast::Sender<Arc<Event>>,
    open: usize,
}

#[derive(Debug, Default)]
struct Counters {
    opened: AtomicU64,
    refused_task: AtomicU64,
    refused_tenant: AtomicU64,
    events_read: AtomicU64,
    events_sent: AtomicU64,
    resyncs: AtomicU64,
    dropped_slow: AtomicU64,
    listener_connects: AtomicU64,
}

/// Why a stream was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `STREAM_MAX` streams are open on this task, it is shutting down, or its listener has not
    /// connected yet (it is starting).
    TaskFull,
    /// The tenant has `STREAM_MAX_PER_TENANT` streams open on this task.
    TenantFull,
}

/// A stream's place in the hub: its receiver, and its count, given back when dropped.
#[derive(Debug)]
pub struct Subscription {
    /// The tenant's events, as the listener reads them.
    pub events: broadcast::Receiver<Arc<Event>>,
    /// Cancelled when the task begins to shut down.
    pub closing: CancellationToken,
    hub: Arc<Hub>,
    tenant: TenantId,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.release(self.tenant);
    }
}

impl Hub {
    /// An empty hub.
    #[must_use]
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            tenants: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            closing: CancellationToken::new(),
            listener_connected: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// The settings it was made with.
    #[must_use]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Opens a stream of `tenant`'s events, within the caps.
    ///
    /// # Errors
    /// [`Refused`] past a cap or once shutdown has begun.
    pub fn subscribe(self: &Arc<Self>, tenant: TenantId) -> Result<Subscription, Refused> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if self.closing.is_cancelled()
            || !self.listening.load(Ordering::Acquire)
            || self.open.load(Ordering::Relaxed) >= self.settings.max
        {
            self.counters.refused_task.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::TaskFull);
        }
        let channel = tenants
            .entry(tenant)
            .or_insert_with(|| Channel { sender: broadcast::channel(self.settings.buffer).0, open: 0 });
        if channel.open >= self.settings.max_per_tenant {
            self.counters.refused_tenant.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::TenantFull);
        }
        channel.open += 1;
        self.open.fetch_add(1, Ordering::Relaxed);
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Subscription {
            events: channel.sender.subscribe(),
            closing: self.closing.clone(),
            hub: self.clone(),
            tenant,
        })
    }

    fn release(&self, tenant: TenantId) {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = tenants.get_mut(&tenant) {
            channel.open -= 1;
            if channel.open == 0 {
                tenants.remove(&tenant);
            }
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether any stream of `tenant` is open here (the listener reads only those tenants'
    /// events).
    #[must_use]
    pub fn wants(&self, tenant: TenantId) -> bool {
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner).contains_key(&tenant)
    }

    /// Hands an event to the tenant's streams on this task.
    pub fn publish(&self, event: Event) {
        self.counters.events_read.fetch_add(1, Ordering::Relaxed);
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = tenants.get(&TenantId(event.tenant_id)) {
            // No receiver left (the last stream closing now) is no error.
            let _ = channel.sender.send(Arc::new(event));
        }
    }

    /// Closes every stream (each sends its `retry:` hint first) and refuses new ones: shutdown
    /// has begun.
    pub fn close(&self) {
        self.closing.cancel();
    }

    pub(crate) fn sent(&self) {
        self.counters.events_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn resynced(&self, slow: bool) {
        self.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        if slow {
            self.counters.dropped_slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn listener_connected(&self, connected: bool) {
        if connected {
            self.counters.listener_connects.fetch_add(1, Ordering::Relaxed);
            self.listening.store(true, Ordering::Release);
        }
        self.listener_connected.store(connected, Ordering::Relaxed);
    }

    /// The published state.
    #[must_use]
    pub fn status(&self) -> StreamStatus {
        let c = &self.counters;
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let tenant_highest =
            self.tenants.lock().unwrap_or_else(PoisonError::into_inner).values().map(|c| c.open).max().unwrap_or(0);
        StreamStatus {
            max: self.settings.max,
            max_per_tenant: self.settings.max_per_tenant,
            buffer_events: self.settings.buffer,
            heartbeat_seconds: self.settings.heartbeat.as_secs(),
            open: self.open.load(Ordering::Relaxed),
            tenant_highest,
            opened: get(&c.opened),
            refused_task: get(&c.refused_task),
            refused_tenant: get(&c.refused_tenant),
            events_read: get(&c.events_read),
            events_sent: get(&c.events_sent),
            resyncs: get(&c.resyncs),
            dropped_slow: get(&c.dropped_slow),
            listener_connected: self.listener_connected.load(Ordering::Relaxed),
            listener_connects: get(&c.listener_connects),
        }
    }
}

/// The published state of the task's streams.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamStatus {
    /// Most streams open on this task (`STREAM_MAX`).
    pub max: usize,
    /// Most streams of one tenant open on this task (`STREAM_MAX_PER_TENANT`).
    pub max_per_tenant: usize,
    /// Events a stream may fall behind before it is sent `resync` and closed (`STREAM_BUFFER`).
    pub buffer_events: usize,
    /// Seconds between heartbeats on an idle stream (`STREAM_HEARTBEAT_SECS`).
    pub heartbeat_seconds: u64,
    /// Streams open now.
    pub open: usize,
    /// The most streams one tenant has open now.
    pub tenant_highest: usize,
    /// Streams opened since start.
    pub opened: u64,
    /// Streams refused since start: `STREAM_MAX` reached, shutting down, or not listening yet
    /// (503 `streams_full`).
    pub refused_task: u64,
    /// Streams refused since start: the tenant's cap reached (429 `stream_limit`).
    pub refused_tenant: u64,
    /// Events the listener read for this task's streams since start.
    pub events_read: u64,
    /// Events written to streams since start (one event to three streams is three).
    pub events_sent: u64,
    /// `resync` events sent since start (a resume past the retention or the replay cap, or a
    /// client too slow).
    pub resyncs: u64,
    /// Of those, streams closed because their client read too slowly.
    pub dropped_slow: u64,
    /// Whether the listener's connection is up now.
    pub listener_connected: bool,
    /// Times the listener connected since start (1 plus its reconnections).
    pub listener_connects: u64,
}

impl crate::figures::Publish for StreamStatus {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Lines, NOT_ALARMED, Unit};
        out.setting("stream_max", "Most streams open on this task", self.max).ops("max");
        out.setting("stream_max_per_tenant", "Most streams of one tenant on this task", self.max_per_tenant)
            .ops("max_per_tenant");
        out.setting("stream_buffer_events", "Events a stream may fall behind before resync", self.buffer_events)
            .ops("buffer_events");
        out.setting("stream_heartbeat_seconds", "Seconds between heartbeats on an idle stream", self.heartbeat_seconds)
            .ops("heartbeat_seconds");
        out.gauge("streams_open", "Streams open now", self.open)
            .emf("StreamsOpen", Unit::Count, Lines::Task)
            .ops("open");
        out.gauge("streams_tenant_highest", "The most streams one tenant has open now", self.tenant_highest)
            .no_emf(NOT_ALARMED)
            .ops("tenant_highest");
        out.counter("streams_opened", "Streams opened", self.opened).no_emf(NOT_ALARMED).ops("opened");
        out.counter("streams_refused_task", "Streams refused: STREAM_MAX reached or shutting down", self.refused_task)
            .emf("StreamsRefused", Unit::Count, Lines::Task)
            .ops("refused_task");
        out.counter("streams_refused_tenant", "Streams refused: the tenant's cap reached", self.refused_tenant)
            .no_emf(NOT_ALARMED)
            .ops("refused_tenant");
        out.counter("stream_events_read", "Events the listener read for this task's streams", self.events_read)
            .no_emf(NOT_ALARMED)
            .ops("events_read");
        out.counter("stream_events_sent", "Events written to streams", self.events_sent)
            .no_emf(NOT_ALARMED)
            .ops("events_sent");
        out.counter("stream_resyncs", "resync events sent", self.resyncs).no_emf(NOT_ALARMED).ops("resyncs");
        out.counter("streams_dropped_slow", "Streams closed because their client read too slowly", self.dropped_slow)
            .no_emf(NOT_ALARMED)
            .ops("dropped_slow");
        out.gauge(
            "stream_listener_connected",
            "Whether the stream listener's connection is up",
            u64::from(self.listener_connected),
        )
        .no_emf(NOT_ALARMED)
        .ops("listener_connected");
        out.counter("stream_listener_connects", "Times the stream listener connected", self.listener_connects)
            .no_emf(NOT_ALARMED)
            .ops("listener_connects");
    }
}
