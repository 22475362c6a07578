//! A keyed registry: creates the actor for a key on demand, routes messages to it, and
//! drops it when its last message in flight has been answered, so idle reservations and
//! buckets cost nothing. Used for the per-reservation and the per-bucket actors.
//!
//! The registry holds the only address of each actor; dropping it stops the actor once
//! its mailbox is empty. Because an entry is removed only when nothing is in flight,
//! a message is never routed to an actor that is stopping.
//!
//! A reply is awaited in a task of its own, which then reports `Settled` back: actix
//! polls every future spawned into a context each time the context wakes, so with
//! hundreds of messages in flight, awaiting them inside the registry's context cost
//! time quadratic in the number in flight (it showed in the profile of issue 8).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use actix::dev::ToEnvelope;
use actix::prelude::*;

/// Starts the actor for a key.
type Spawn<K, A> = Box<dyn Fn(&K) -> Addr<A>>;

pub struct Registry<K, A: Actor> {
    kind: &'static str,
    actors: HashMap<K, Entry<A>>,
    spawn: Spawn<K, A>,
    /// Messages routed and not yet answered, over all actors (their mailboxes plus
    /// the one each is working on).
    depth: usize,
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
    pub fn new(kind: &'static str, spawn: impl Fn(&K) -> Addr<A> + 'static) -> Self {
        Self {
            kind,
            actors: HashMap::new(),
            spawn: Box::new(spawn),
            depth: 0,
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

    fn publish_depth(&self) {
        metrics::gauge!(crate::telemetry::names::MAILBOX_DEPTH, "kind" => self.kind)
            .set(self.depth as f64);
        metrics::gauge!(crate::telemetry::names::MAILBOX_DEPTH_MAX, "kind" => self.kind).set(
            self.actors_by_depth
                .keys()
                .next_back()
                .copied()
                .unwrap_or(0) as f64,
        );
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
        let entry = self.actors.entry(key.clone()).or_insert_with(|| Entry {
            addr: spawn(&key),
            in_flight: 0,
        });
        entry.in_flight += 1;
        let (reply, now) = (entry.addr.send(msg), entry.in_flight);
        self.moved(now - 1, now);
        self.depth += 1;
        metrics::gauge!(crate::telemetry::names::LIVE_ACTORS, "kind" => self.kind)
            .set(self.actors.len() as f64);
        self.publish_depth();
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
        self.depth -= 1;
        self.publish_depth();
    }
}
