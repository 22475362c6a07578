//! Shared status that the engine's parts report and HTTP, telemetry and the outbox
//! publisher read: deliveries in flight (`IntakeStats`, with the acks that
//! settled them, `AckCounts`), whether the engine takes work (`Readiness`, with the
//! shards it owns, `Shards`), and the live figures its pages show (`Live`). The one
//! home of an engine's live state: each engine creates its own handles and passes
//! them down, so two engines of one process share nothing. It sits low so that
//! readers need not import the actors that write it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::domain::ids::IdGenerator;
use crate::telemetry::recent::Recent;
use crate::telemetry::sampled::Sampled;
use crate::telemetry::trace::Traced;

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

/// What the readiness monitor found of the engine's dependencies on its last check,
/// each `None` when fine, else why not. The monitor is the only one that probes
/// them; `/readyz` shows this, with its age.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checks {
    /// Why orders may not run on the database now (`store::primary`): no writable
    /// primary, a stalled COMMIT, no synchronous standby, no connection.
    pub postgres: Option<String>,
    /// Why the database's schema is not this build's (shown by `/readyz`; intake
    /// does not stop for it).
    pub schema: Option<String>,
    /// Why Redis did not answer.
    pub redis: Option<String>,
    /// When the monitor made these checks; `None` before its first.
    pub at: Option<std::time::Instant>,
    /// Since when PostgreSQL has been failing (ms since the Unix epoch), carried
    /// from check to check while it fails: the live page says how long.
    pub postgres_since_ms: Option<i64>,
    /// Since when Redis has been failing, likewise.
    pub redis_since_ms: Option<i64>,
}

/// The shared answer; starts ready (the engine checked everything while starting).
/// An operator may also pause intake (admin API); the intakes consume only while
/// the engine is ready, not paused, and may mint ids (its node id lease is current).
#[derive(Debug)]
pub struct Readiness {
    ready: AtomicBool,
    paused: AtomicBool,
    /// The readiness monitor's last findings (before its first check, only what
    /// the engine found of the primary while starting).
    checks: std::sync::Mutex<Checks>,
    /// The front stage's own Redis and broker links, when one runs in this process:
    /// `None` until it reports, then its problem, if any (`http::front`).
    frontstage: std::sync::Mutex<Option<Option<String>>>,
    ids: OnceLock<Arc<IdGenerator>>,
    shards: Shards,
    /// The engine's live figures: carried here so that every holder of the one
    /// handle the engine passes around (its listeners included) reaches them.
    live: Arc<Live>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new(Arc::default())
    }
}

impl Readiness {
    /// Ready, not paused, carrying the engine's `live` figures.
    pub fn new(live: Arc<Live>) -> Self {
        Self {
            ready: AtomicBool::new(true),
            paused: AtomicBool::new(false),
            checks: std::sync::Mutex::new(Checks::default()),
            frontstage: std::sync::Mutex::new(None),
            ids: OnceLock::new(),
            shards: Shards::default(),
            live,
        }
    }
    /// The engine's live figures (`Live`).
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }
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
    /// What the monitor last found wrong with the database, if anything.
    pub fn postgres_problem(&self) -> Option<String> {
        self.checks().postgres
    }
    /// The monitor's last findings, with when it made them.
    pub fn checks(&self) -> Checks {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
    /// What the engine found of the primary while starting, before the monitor's
    /// first check.
    pub(crate) fn set_postgres(&self, problem: Option<String>) {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .postgres = problem;
    }
    /// Records the monitor's findings, stamping when each failure began (kept from
    /// the findings they replace while it lasts); returns the ones they replace.
    pub(crate) fn record_checks(&self, mut checks: Checks) -> Checks {
        let mut held = self
            .checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = chrono::Utc::now().timestamp_millis();
        let since = |failing: bool, before: Option<i64>| match failing {
            true => Some(before.unwrap_or(now)),
            false => None,
        };
        checks.postgres_since_ms = since(checks.postgres.is_some(), held.postgres_since_ms);
        checks.redis_since_ms = since(checks.redis.is_some(), held.redis_since_ms);
        std::mem::replace(&mut *held, checks)
    }
    /// Waits until the monitor has checked once, or `grace` has passed; returns
    /// whether it has.
    pub async fn checked(&self, grace: std::time::Duration) -> bool {
        poll_until(grace, || self.checks().at.is_some()).await
    }
    /// The front stage's last report: `None` if none runs here, else its problem.
    pub fn frontstage_problem(&self) -> Option<Option<String>> {
        self.frontstage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
    /// Records what the front stage found of its links; whether it changed.
    pub fn set_frontstage(&self, problem: Option<String>) -> bool {
        let mut held = self
            .frontstage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = held.as_ref() != Some(&problem);
        *held = Some(problem);
        changed
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
    /// Which shards this instance owns and is active on.
    pub fn shards(&self) -> &Shards {
        &self.shards
    }
    /// Whether the intakes should consume now.
    pub fn accepting(&self) -> bool {
        self.is_ready() && !self.is_paused() && self.may_mint()
    }
}

/// What an engine's pages show of the moment, written by its parts as they run:
/// the order latency of the last seconds (the bucket actors; the live page), the
/// gauges whose series come and go (the gauge sampler and the reconciler;
/// `/metrics`), the activities followed (the settings and `POST /admin/trace`; the
/// bucket actors and the intakes log by it), and the dead-letter queues' depths (the
/// gauge sampler; the live page). The types and their rules are telemetry's.
#[derive(Debug, Default)]
pub struct Live {
    recent: Recent,
    sampled: Sampled,
    traced: Traced,
    /// Each dead-letter queue and its depth, as last sampled.
    dead_letters: Mutex<Vec<(String, u32)>>,
}

impl Live {
    /// The order latency of the last few seconds.
    pub fn recent(&self) -> &Recent {
        &self.recent
    }
    /// The gauges whose series come and go with the data.
    pub fn sampled(&self) -> &Sampled {
        &self.sampled
    }
    /// The activities whose orders are logged at INFO.
    pub fn traced(&self) -> &Traced {
        &self.traced
    }
    /// Each dead-letter queue and its depth, as last sampled (empty before the
    /// first sample).
    pub fn dead_letter_depths(&self) -> Vec<(String, u32)> {
        self.dead_letters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
    /// Records the depths the gauge sampler read.
    pub fn set_dead_letter_depths(&self, depths: Vec<(String, u32)>) {
        *self
            .dead_letters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = depths;
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

/// Shard ownership among the live instances, and the shards this one is active on
/// (docs/DESIGN.md, "Scale-out"). Every instance registers on every shard queue and
/// RabbitMQ's single active consumer picks one consumer per queue; shard `s` belongs
/// to the instance whose node id ranks `s mod K` among the K live node leases. An
/// intake that finds itself active on a shard it does not own hands it back: it
/// settles what it holds and registers again at the back of the queue's consumers.
#[derive(Debug, Default)]
pub struct Shards {
    /// Off when `amqp.owned_shards` lists the shards by hand: never hand back.
    steer: AtomicBool,
    /// Live instances (K) and this one's rank among them; K = 0 until known.
    peers: AtomicU32,
    rank: AtomicU32,
    active: Mutex<BTreeSet<u16>>,
}

impl Shards {
    /// Turns steering on (ownership by lease rank) or off (explicit shards).
    pub fn steer(&self, on: bool) {
        self.steer.store(on, Ordering::Relaxed);
    }
    /// The live instances and this one's rank among them (the lease keeper's view).
    pub fn set_peers(&self, peers: u32, rank: u32) {
        self.peers.store(peers, Ordering::Relaxed);
        self.rank.store(rank, Ordering::Relaxed);
    }
    /// (K, rank) as last seen.
    pub fn peers(&self) -> (u32, u32) {
        (
            self.peers.load(Ordering::Relaxed),
            self.rank.load(Ordering::Relaxed),
        )
    }
    /// Whether this instance owns `shard` now.
    pub fn owns(&self, shard: u16) -> bool {
        if !self.steer.load(Ordering::Relaxed) {
            return true;
        }
        let (peers, rank) = self.peers();
        peers == 0 || u32::from(shard) % peers == rank
    }
    /// The intake of `shard` received deliveries: it is the active consumer. True if
    /// it was not before.
    pub fn acquired(&self, shard: u16) -> bool {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(shard)
    }
    /// The intake of `shard` cancelled its consumer or lost its connection. True if
    /// it was active.
    pub fn lost(&self, shard: u16) -> bool {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&shard)
    }
    /// The shards this instance is active on (has received deliveries on since it
    /// last registered).
    pub fn active(&self) -> Vec<u16> {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Checks, Live, Readiness, Shards};

    #[tokio::test]
    async fn the_monitors_findings_replace_the_start_ones_with_their_time() {
        let r = Readiness::default();
        r.set_postgres(Some("no writable primary".into()));
        assert_eq!(
            r.checks().at,
            None,
            "the start's finding is not the monitor's"
        );
        assert!(
            !r.checked(std::time::Duration::from_millis(30)).await,
            "not checked yet"
        );
        let found = Checks {
            redis: Some("refused".into()),
            at: Some(std::time::Instant::now()),
            ..Checks::default()
        };
        let before = r.record_checks(found.clone());
        assert_eq!(before.postgres.as_deref(), Some("no writable primary"));
        assert_eq!(r.postgres_problem(), None);
        assert_eq!(r.checks().redis, found.redis);
        assert!(r.checked(std::time::Duration::ZERO).await);
        // A failure keeps the time it began while it lasts, and loses it after.
        let began = r.checks().redis_since_ms.expect("failing since");
        assert_eq!(r.checks().postgres_since_ms, None);
        r.record_checks(found.clone());
        assert_eq!(r.checks().redis_since_ms, Some(began));
        r.record_checks(Checks::default());
        assert_eq!(r.checks().redis_since_ms, None);
    }

    #[test]
    fn two_engines_share_no_live_state() {
        let (a, b) = (Readiness::default(), Readiness::default());
        a.live().set_dead_letter_depths(vec![("q.dead".into(), 3)]);
        a.live().traced().follow_always(&[5]);
        a.live()
            .recent()
            .record(std::time::Duration::from_millis(4));
        assert_eq!(b.live().dead_letter_depths(), vec![]);
        assert!(!b.live().traced().followed(5));
        assert_eq!(b.live().recent().summary(), None);
        assert_eq!(a.live().recent().summary().map(|s| s.0), Some(1));
        let shared = std::sync::Arc::new(Live::default());
        let c = Readiness::new(shared.clone());
        assert!(std::sync::Arc::ptr_eq(c.live(), &shared));
    }

    #[test]
    fn shards_belong_to_the_rank_s_mod_k() {
        let s = Shards::default();
        assert!(s.owns(5), "not steering: everything");
        s.steer(true);
        assert!(s.owns(5), "no peers known yet: everything");
        s.set_peers(3, 1);
        let mine: Vec<u16> = (0..6).filter(|&x| s.owns(x)).collect();
        assert_eq!(mine, vec![1, 4]);
        assert!(s.acquired(1) && !s.acquired(1));
        assert_eq!(s.active(), vec![1]);
        assert!(s.lost(1) && !s.lost(1));
    }
}
