//! A keyed registry: creates the actor for a key on demand, routes messages to it, and
//! drops it when its last message in flight has been answered, so idle reservations and
//! buckets cost nothing. Used for the per-reservation and the per-bucket actors.
//!
//! The registry holds the only address of each actor; dropping it stops the actor once
//! its mailbox is empty. Because an entry is removed only when nothing is in flight,
//! a message is never routed to an actor that is stopping.

use std::collections::HashMap;
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
    /// the one each is working on), and the deepest single mailbox.
    depth: usize,
    max_depth: usize,
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
            max_depth: 0,
        }
    }

    fn publish_depth(&self) {
        metrics::gauge!("seckill_mailbox_depth", "kind" => self.kind).set(self.depth as f64);
        metrics::gauge!("seckill_mailbox_depth_max", "kind" => self.kind)
            .set(self.max_depth as f64);
    }
}

impl<K: Unpin + 'static, A: Actor> Actor for Registry<K, A> {
    type Context = Context<Self>;
}

impl<K, A, M> Handler<Route<K, M>> for Registry<K, A>
where
    K: Hash + Eq + Clone + Unpin + 'static,
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    type Result = ResponseActFuture<Self, Result<M::Result, MailboxError>>;

    fn handle(&mut self, route: Route<K, M>, _: &mut Self::Context) -> Self::Result {
        let Route { key, msg } = route;
        let spawn = &self.spawn;
        let entry = self.actors.entry(key.clone()).or_insert_with(|| Entry {
            addr: spawn(&key),
            in_flight: 0,
        });
        entry.in_flight += 1;
        self.depth += 1;
        self.max_depth = self.max_depth.max(entry.in_flight);
        let reply = entry.addr.send(msg);
        metrics::gauge!("seckill_live_actors", "kind" => self.kind).set(self.actors.len() as f64);
        self.publish_depth();
        Box::pin(reply.into_actor(self).map(move |result, registry, _| {
            if let Some(entry) = registry.actors.get_mut(&key) {
                let was = entry.in_flight;
                entry.in_flight -= 1;
                if entry.in_flight == 0 {
                    registry.actors.remove(&key);
                }
                registry.depth -= 1;
                if was == registry.max_depth {
                    registry.max_depth = registry
                        .actors
                        .values()
                        .map(|e| e.in_flight)
                        .max()
                        .unwrap_or(0);
                }
                registry.publish_depth();
            }
            result
        }))
    }
}
