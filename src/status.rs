//! Shared status that the engine's parts report and HTTP, telemetry and the outbox
//! publisher read: deliveries in flight (`IntakeStats`, with the acks that
//! settled them, `AckCounts`) and whether the engine takes work (`Readiness`). It sits low so that readers need not import the
//! actors that write it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::domain::ids::IdGenerator;

/// Deliveries received and not yet settled (acked, retried or dead-lettered), shared
/// by every intake of an engine. The broker's unacked count for our consumers is the
/// same number, so its peak shows that prefetch and permits bound the work in memory.
#[derive(Debug, Default)]
pub struct IntakeStats {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Intakes currently connected and consuming.
    consuming: AtomicUsize,
    /// Intakes told to stop whose last acks and connection close are still to go.
    closing: AtomicUsize,
    acks: Arc<AckCounts>,
}

impl IntakeStats {
    pub fn consuming(&self) -> usize {
        self.consuming.load(Ordering::Relaxed)
    }
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
    pub fn closing(&self) -> usize {
        self.closing.load(Ordering::Relaxed)
    }
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
    /// Deliveries acked, and the frames that acked them.
    pub fn acks(&self) -> &AckCounts {
        &self.acks
    }

    /// Waits until nothing is in flight or `grace` has passed; returns whether it
    /// drained.
    pub async fn drained(&self, grace: std::time::Duration) -> bool {
        poll_until(grace, || self.in_flight() == 0).await
    }

    /// Waits until every intake has stopped consuming and closed its connection, its
    /// last acks sent, or `grace` has passed; returns whether they all closed. Until
    /// then the broker still holds their settled deliveries as unacked, and a process
    /// that exits first has them redelivered.
    pub async fn closed(&self, grace: std::time::Duration) -> bool {
        poll_until(grace, || self.consuming() == 0 && self.closing() == 0).await
    }

    pub(crate) fn consuming_started(&self) {
        self.consuming.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn consuming_stopped(&self) {
        self.consuming.fetch_sub(1, Ordering::Relaxed);
    }
    pub(crate) fn closing_started(&self) {
        self.closing.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn closing_done(&self) {
        self.closing.fetch_sub(1, Ordering::Relaxed);
    }
    /// The ack counters, shared with the channels' ack tasks.
    pub(crate) fn ack_counts(&self) -> Arc<AckCounts> {
        self.acks.clone()
    }

    /// Counts one delivery in flight until the returned guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> InFlight {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        metrics::gauge!(crate::telemetry::names::INTAKE_IN_FLIGHT).set(now as f64);
        InFlight(self.clone())
    }
}

/// Polls `done` every 20 ms until it holds or `grace` has passed; returns whether it
/// held.
async fn poll_until(grace: std::time::Duration, done: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + grace;
    while !done() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    true
}

/// One unsettled delivery; dropping it counts the delivery as settled.
pub(crate) struct InFlight(Arc<IntakeStats>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.0.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        metrics::gauge!(crate::telemetry::names::INTAKE_IN_FLIGHT).set(now as f64);
    }
}

/// The shared answer; starts ready (the engine checked everything while starting).
/// An operator may also pause intake (admin API); the intakes consume only while
/// the engine is ready, not paused, and may mint ids (its node id lease is current).
#[derive(Debug)]
pub struct Readiness {
    ready: AtomicBool,
    paused: AtomicBool,
    ids: OnceLock<Arc<IdGenerator>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            ready: AtomicBool::new(true),
            paused: AtomicBool::new(false),
            ids: OnceLock::new(),
        }
    }
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }
    /// Sets the operator's pause; returns the previous value.
    pub fn set_paused(&self, paused: bool) -> bool {
        metrics::gauge!(crate::telemetry::names::INTAKE_PAUSED).set(if paused { 1.0 } else { 0.0 });
        self.paused.swap(paused, Ordering::Relaxed)
    }
    /// Sets the monitor's answer; returns the previous value.
    pub(crate) fn set_ready(&self, ready: bool) -> bool {
        self.ready.swap(ready, Ordering::Relaxed)
    }
    /// Follows this generator's lease: while it may not mint, intake stops.
    pub fn watch_minting(&self, ids: Arc<IdGenerator>) {
        let _ = self.ids.set(ids);
    }
    /// Whether the engine's ids may be minted now (no generator watched: yes).
    pub fn may_mint(&self) -> bool {
        self.ids.get().is_none_or(|ids| ids.fence().allows())
    }
    /// The node id of the watched generator.
    pub fn node_id(&self) -> Option<u16> {
        self.ids.get().map(|ids| ids.node_id())
    }
    /// Whether the intakes should consume now.
    pub fn accepting(&self) -> bool {
        self.is_ready() && !self.is_paused() && self.may_mint()
    }
}

/// Counts of what the ack tasks of an engine sent.
#[derive(Debug, Default)]
pub struct AckCounts {
    messages: AtomicU64,
    frames: AtomicU64,
}

impl AckCounts {
    /// Deliveries acked.
    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }
    /// `basic.ack` frames that acked them.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }
    /// One frame sent that acked `messages` deliveries.
    pub(crate) fn record_frame(&self, messages: u64) {
        self.frames.fetch_add(1, Ordering::Relaxed);
        self.messages.fetch_add(messages, Ordering::Relaxed);
    }
}
