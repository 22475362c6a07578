//! A keyed registry: creates the actor for a key on demand, routes messages to it, and
//! drops it when its last message in flight has been answered, so idle reservations and
//! buckets cost nothing. Used for the per-reservation and the per-bucket actors.
//!
//! The registry holds the only address of each actor; dropping it stops the actor once
//! its mailbox is empty. Because an entry is removed only when nothing is in flight,
//! a message is never routed to an actor that is stopping.
//!
//! With several pipeline lanes (`actors::lanes`) each lane has its own registries;
//! their gauges add up through one `RegistryGauges` per kind.
//!
//! A reply is awaited in a task of its own, which then reports `Settled` back: actix
//! polls every future spawned into a context each time the context wakes, so with
//! hundreds of messages in flight, awaiting them inside the registry's context cost
//! time quadratic in the number in flight (it showed in the profile of issue 8).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;

/// Starts the actor for a key.
type Spawn<K, A> = Box<dyn Fn(&K) -> Addr<A>>;

/// The gauges of one kind of actor, summed over the lanes' registries: live actors
/// and messages in flight add up, the deepest mailbox is the deepest of any lane.
pub struct RegistryGauges {
    live: AtomicUsize,
    depth: AtomicUsize,
    deepest: Vec<AtomicUsize>,
    /// The three gauges' handles, looked up once: `publish` runs for every message
    /// routed, and three registry lookups each time were about 2 % of the engine's
    /// CPU in the demo sale.
    live_gauge: metrics::Gauge,
    depth_gauge: metrics::Gauge,
    deepest_gauge: metrics::Gauge,
}

impl RegistryGauges {
    pub fn new(kind: &'static str, lanes: usize) -> Arc<Self> {
        // Handles taken before the process's recorder is installed would record
        // nowhere, for good.
        crate::telemetry::metrics();
        Arc::new(Self {
            live: AtomicUsize::new(0),
            depth: AtomicUsize::new(0),
            deepest: (0..lanes.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            live_gauge: metrics::gauge!(crate::telemetry::names::LIVE_ACTORS, "kind" => kind),
            depth_gauge: metrics::gauge!(crate::telemetry::names::MAILBOX_DEPTH, "kind" => kind),
            deepest_gauge: metrics::gauge!(crate::telemetry::names::MAILBOX_DEPTH_MAX, "kind" => kind),
        })
    }

    fn publish(&self) {
        let deepest = self
            .deepest
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        self.live_gauge
            .set(self.live.load(Ordering::Relaxed) as f64);
        self.depth_gauge
            .set(self.depth.load(Ordering::Relaxed) as f64);
        self.deepest_gauge.set(deepest as f64);
    }
}

pub struct Registry<K, A: Actor> {
    gauges: Arc<RegistryGauges>,
    /// This registry's lane, its slot in `gauges.deepest`.
    lane: usize,
    actors: HashMap<K, Entry<A>>,
    spawn: Spawn<K, A>,
    /// How many actors have each number of messages in flight; the last key is the
    /// deepest single mailbox.
    actors_by_depth: BTreeMap<usize, usize>,
}

struct Entry<A: Actor> {
    addr: Addr<A>,
    in_flight: usize,
}

/// Deliver `msg` to the actor for `key`, creating it if needed.
pub struct Route<K, M> {
    pub key: K,
    pub msg: M,
}

impl<K, M> Message for Route<K, M>
where
    M: Message,
    M::Result: Send,
{
    type Result = Result<M::Result, MailboxError>;
}

impl<K, A: Actor> Registry<K, A> {
    pub fn new(
        gauges: Arc<RegistryGauges>,
        lane: usize,
        spawn: impl Fn(&K) -> Addr<A> + 'static,
    ) -> Self {
        Self {
            gauges,
            lane,
            actors: HashMap::new(),
            spawn: Box::new(spawn),
            actors_by_depth: BTreeMap::new(),
        }
    }

    /// An actor's number in flight went from `from` to `to`.
    fn moved(&mut self, from: usize, to: usize) {
        if from > 0 {
            if let Some(n) = self.actors_by_depth.get_mut(&from) {
                *n -= 1;
                if *n == 0 {
                    self.actors_by_depth.remove(&from);
                }
            }
        }
        if to > 0 {
            *self.actors_by_depth.entry(to).or_default() += 1;
        }
    }

    /// Adds this registry's change (`live` actors, `depth` in flight) to the totals
    /// and publishes them.
    fn publish(&self, live: isize, depth: isize) {
        let add = |total: &AtomicUsize, by: isize| {
            if by >= 0 {
                total.fetch_add(by.unsigned_abs(), Ordering::Relaxed);
            } else {
                total.fetch_sub(by.unsigned_abs(), Ordering::Relaxed);
            }
        };
        add(&self.gauges.live, live);
        add(&self.gauges.depth, depth);
        let deepest = self
            .actors_by_depth
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0);
        if let Some(slot) = self.gauges.deepest.get(self.lane) {
            slot.store(deepest, Ordering::Relaxed);
        }
        self.gauges.publish();
    }
}

impl<K: Unpin + 'static, A: Actor> Actor for Registry<K, A> {
    type Context = Context<Self>;
}

/// The reply to a routed message has come back.
struct Settled<K>(K);

impl<K> Message for Settled<K> {
    type Result = ();
}

impl<K, A, M> Handler<Route<K, M>> for Registry<K, A>
where
    K: Hash + Eq + Clone + Unpin + Send + 'static,
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    type Result = ResponseFuture<Result<M::Result, MailboxError>>;

    fn handle(&mut self, route: Route<K, M>, ctx: &mut Self::Context) -> Self::Result {
        let Route { key, msg } = route;
        let spawn = &self.spawn;
        let live = self.actors.len();
        let entry = self.actors.entry(key.clone()).or_insert_with(|| Entry {
            addr: spawn(&key),
            in_flight: 0,
        });
        entry.in_flight += 1;
        let (reply, now) = (entry.addr.send(msg), entry.in_flight);
        self.moved(now - 1, now);
        let born = isize::from(self.actors.len() > live);
        self.publish(born, 1);
        let registry = ctx.address();
        Box::pin(async move {
            let result = reply.await;
            // The registry only goes away at shutdown, and its books with it.
            let _ = registry.send(Settled(key)).await;
            result
        })
    }
}

impl<K, A> Handler<Settled<K>> for Registry<K, A>
where
    K: Hash + Eq + Clone + Unpin + 'static,
    A: Actor,
{
    type Result = ();

    fn handle(&mut self, Settled(key): Settled<K>, _: &mut Self::Context) {
        let Some(entry) = self.actors.get_mut(&key) else {
            return;
        };
        entry.in_flight -= 1;
        let now = entry.in_flight;
        if now == 0 {
            self.actors.remove(&key);
        }
        self.moved(now + 1, now);
        self.publish(if now == 0 { -1 } else { 0 }, -1);
    }
}
