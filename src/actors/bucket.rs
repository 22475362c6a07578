//! The bucket actor owns all database work for one inventory row (activity, sku,
//! bucket) and the order in which its orders get units. Group commit lives here:
//! while transactions run, the orders that arrive wait in the actor, and the next
//! transaction takes up to `engine.batch_max_size` of them in arrival order (one
//! COMMIT for all). Up to `engine.bucket_pipeline` transactions run at once, so one's
//! inserts overlap another's inventory UPDATE and COMMIT, but a new one starts only
//! once the last one started has the row (or none runs), so that it takes every
//! order that waited meanwhile rather than the first, and the last of those slots
//! only with a full batch; an `AllocationTurn` chain
//! gives them the inventory row one at a time, from UPDATE to COMMIT, in the order
//! the batches were formed, so inside one instance the hot row never waits on a
//! PostgreSQL row lock. Orders related to a running transaction (a shared message,
//! reservation, request, order or user key) wait for it to end: the transactions
//! that overlap never wait on each other's rows. While batches end with every
//! order new and created, the next is sent speculatively, the whole transaction at
//! once (`store::orders::whole`); once one ends with a new order sold out, the
//! next is sent whole as sold out, since its bucket is empty; after any other, the
//! next goes the careful way. Over all buckets, at most `engine.order_transactions`
//! run at once (a slot taken right before the pooled connection): while a
//! transaction waits for one, its bucket's next orders gather into a bigger batch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::prelude::*;

use crate::domain::ids::IdGenerator;
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{ErrorClass, OrderOutcome, ResultCode};
use crate::status::Live;
use crate::store::orders::{
    create_orders, load_bucket_sku, AllocationTurn, OrderInput, OrderKey, OrderTxContext,
    SkuSnapshot, Speculation, Stage,
};
use crate::store::{Pool, StoreError};
use futures_util::future::LocalBoxFuture;
use tokio::sync::{oneshot, watch};

/// Identifies one inventory row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketKey {
    pub activity_id: i64,
    pub sku_id: i64,
    pub bucket: i16,
}

impl BucketKey {
    pub fn of(msg: &OrderCreateMessage) -> Self {
        Self {
            activity_id: msg.activity_id,
            sku_id: msg.sku_id,
            bucket: msg.inventory_bucket,
        }
    }
}

/// Settings shared by every bucket actor.
pub struct BucketShared {
    pub pool: Pool,
    pub ids: Arc<IdGenerator>,
    pub consumer_group: String,
    pub lock_timeout: String,
    pub statement_timeout: String,
    pub max_attempts: u32,
    /// Orders per transaction at most (1: one transaction per message).
    pub batch_max_size: usize,
    /// Transactions of one bucket running at once.
    pub pipeline: usize,
    /// Order transactions running at once over all buckets
    /// (`engine.order_transactions`), taken right before a pooled connection.
    pub tx_slots: tokio::sync::Semaphore,
    /// What each bucket's last batch suggested of its next (`next_speculation`),
    /// where it is not the default `Fresh`. Kept here, across the actors' lives:
    /// the registry stops a bucket actor whenever its mailbox runs dry, and an
    /// empty bucket's next actor would otherwise try the fresh way first again.
    pub speculation: SpeculationHints,
    /// The engine's live figures: the latency windows each commit records into and
    /// the activities whose orders are logged at INFO.
    pub live: Arc<Live>,
}

/// `BucketShared::speculation`: hints only, so bounded by forgetting them all.
#[derive(Default)]
pub struct SpeculationHints(Mutex<HashMap<BucketKey, Speculation>>);

impl SpeculationHints {
    /// More buckets than this holding a hint (sold out, say, over many sales) and
    /// the hints are forgotten: each such bucket pays one rolled-back attempt again.
    const MAX: usize = 65_536;

    fn get(&self, key: BucketKey) -> Speculation {
        self.0.lock().map_or(Speculation::Fresh, |hints| {
            hints.get(&key).copied().unwrap_or(Speculation::Fresh)
        })
    }

    fn set(&self, key: BucketKey, next: Speculation) {
        // A poisoned lock only loses hints.
        let Ok(mut hints) = self.0.lock() else {
            return;
        };
        if next == Speculation::Fresh {
            hints.remove(&key);
            return;
        }
        if hints.len() >= Self::MAX {
            hints.clear();
        }
        hints.insert(key, next);
    }
}

pub struct BucketActor {
    key: BucketKey,
    shared: Arc<BucketShared>,
    /// SKU snapshot (title, price, order TTL), loaded with the first order of this
    /// actor's life.
    sku_title: Option<SkuSnapshot>,
    /// What the last batch to end suggests of the next (`next_speculation`): it
    /// is sent in one round trip, as if that held for it (`OrderTxContext::speculate`).
    speculate: Speculation,
    /// Orders waiting for the next transaction, in arrival order. Bounded by the
    /// DB permits: an order is routed here only under a permit.
    waiting: VecDeque<Waiting>,
    /// Transactions running.
    running: usize,
    /// The keys of the orders in running transactions, with how many hold each. An
    /// order that shares one waits until they are done: an earlier transaction must
    /// never wait on a row of a later one, which waits for its allocation turn.
    running_keys: HashMap<OrderKey, usize>,
    /// What the next transaction's allocation turn waits on.
    last_turn: Option<watch::Receiver<Stage>>,
    /// What the last transaction started waits on for its turn.
    ahead_of_last: Option<watch::Receiver<Stage>>,
}

/// An order waiting for a transaction, with its keys and where its answer goes.
struct Waiting {
    run: RunOrder,
    keys: [OrderKey; 6],
    reply: oneshot::Sender<Result<OrderOutcome, ErrorClass>>,
}

/// Run the order transaction for one message of this bucket.
#[derive(Message)]
#[rtype(result = "Result<OrderOutcome, ErrorClass>")]
pub struct RunOrder {
    pub msg: OrderCreateMessage,
    /// The queue the message was consumed from (recorded in the inbox).
    pub topic: Arc<str>,
}

impl BucketActor {
    pub fn new(key: BucketKey, shared: Arc<BucketShared>) -> Self {
        Self {
            key,
            speculate: shared.speculation.get(key),
            shared,
            sku_title: None,
            waiting: VecDeque::new(),
            running: 0,
            running_keys: HashMap::new(),
            last_turn: None,
            ahead_of_last: None,
        }
    }

    /// Whether a new transaction may start now. One started while another still
    /// waits for the inventory row would wait behind it anyway, holding only the
    /// orders that arrived meanwhile (often one), and every transaction costs
    /// PostgreSQL a fixed price whatever it holds: so orders wait here until the
    /// last transaction started has the row, and then go together
    /// (docs/benchmarks-history.md, 2026-12-01, e25e0b5; reverted there, back since c21a6aa).
    fn may_start(&self) -> bool {
        self.running == 0
            || self.shared.batch_max_size <= 1
            || self.ahead_of_last.as_ref().is_none_or(has_passed)
    }

    /// Whether a pipeline slot is free for a transaction starting now. The last
    /// slot takes only a full batch: a backlog needs every slot, but at a moderate
    /// load the orders that arrive while the last slot would be taken are better
    /// off waiting for the oldest transaction to end and going with more others
    /// (docs/benchmarks-history.md, 2026-12-02, 95ee118). With one order per transaction every
    /// waiting order is a full batch.
    fn slot_free(&self) -> bool {
        slot_free(
            self.running,
            self.shared.pipeline,
            self.waiting.len(),
            self.shared.batch_max_size,
        )
    }

    /// Starts transactions while a pipeline slot is free and orders wait.
    fn next_batch(&mut self, ctx: &mut Context<Self>) {
        while self.slot_free() && self.may_start() && self.start_batch(ctx) {}
    }

    /// Starts a transaction with the orders at the head of the queue, up to the
    /// first one related to a running transaction; false if there is none to take.
    fn start_batch(&mut self, ctx: &mut Context<Self>) -> bool {
        let n = self
            .waiting
            .iter()
            .take(self.shared.batch_max_size.max(1))
            .take_while(|w| w.keys.iter().all(|k| !self.running_keys.contains_key(k)))
            .count();
        if n == 0 {
            return false;
        }
        self.running += 1;
        metrics::histogram!(crate::telemetry::names::ORDER_BATCH_SIZE).record(n as f64);
        let mut runs = Vec::with_capacity(n);
        let mut replies = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n * 6);
        for w in self.waiting.drain(..n) {
            runs.push(w.run);
            replies.push(w.reply);
            keys.extend(w.keys);
        }
        for k in &keys {
            *self.running_keys.entry(*k).or_default() += 1;
        }
        let (shared, key, cached) = (self.shared.clone(), self.key, self.sku_title.clone());
        // One message per transaction is the seed's per-message path, unchanged.
        let speculate = if self.shared.batch_max_size > 1 {
            self.speculate
        } else {
            Speculation::Careful
        };
        let ahead = self.last_turn.take();
        self.ahead_of_last = ahead.clone();
        let (mut turn, next) = AllocationTurn::after(ahead);
        self.last_turn = Some(next);
        // When this transaction gets the row, the orders that waited meanwhile go.
        if let Some(mut ahead) = self.ahead_of_last.clone() {
            ctx.spawn(
                async move {
                    let _ = ahead.wait_for(|s| *s >= Stage::Passed).await;
                }
                .into_actor(self)
                .map(|(), actor, ctx| actor.next_batch(ctx)),
            );
        }
        let work = async move {
            let mut title = cached;
            let results = run_group(&shared, key, speculate, &mut title, &mut turn, &runs).await;
            let next = next_speculation(&results);
            for (reply, result) in replies.into_iter().zip(results) {
                // The asker may have gone (shutdown); its message is redelivered.
                let _ = reply.send(result);
            }
            turn.finish().await;
            (title, next)
        };
        ctx.spawn(work.into_actor(self).map(|(title, next), actor, ctx| {
            if title.is_some() {
                actor.sku_title = title;
            }
            actor.speculate = next;
            actor.shared.speculation.set(actor.key, next);
            actor.running -= 1;
            for k in keys {
                if let Some(n) = actor.running_keys.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        actor.running_keys.remove(&k);
                    }
                }
            }
            actor.next_batch(ctx);
        }));
        true
    }
}

/// `BucketActor::slot_free`: with `running` transactions of at most `pipeline`
/// and `waiting` orders, whether one more may start now.
fn slot_free(running: usize, pipeline: usize, waiting: usize, batch_max_size: usize) -> bool {
    let pipeline = pipeline.max(1);
    let full = waiting >= batch_max_size;
    running + 1 < pipeline || (running + 1 == pipeline && (running == 0 || full))
}

impl Actor for BucketActor {
    type Context = Context<Self>;
}

impl Handler<RunOrder> for BucketActor {
    type Result = ResponseFuture<Result<OrderOutcome, ErrorClass>>;

    fn handle(&mut self, run: RunOrder, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.waiting.push_back(Waiting {
            keys: OrderKey::of(&run.msg),
            run,
            reply,
        });
        // While transactions run, the next starts when the last one started gets
        // the row or when one ends (`start_batch`), with every order waiting then,
        // or as soon as a full batch waits for the last pipeline slot (`slot_free`).
        // At a moderate load the last one started gets the row as it starts, before
        // any order waits, so transactions run one after another; starting the next
        // sooner was measured to cost more than it saves (docs/benchmarks-history.md,
        // 2026-12-02, 61b67c4).
        if self.running == 0 || self.waiting.len() >= self.shared.batch_max_size {
            self.next_batch(ctx);
        }
        Box::pin(async move {
            answer
                .await
                .unwrap_or(Err(ErrorClass::Unavailable("bucket_stopped")))
        })
    }
}

/// What a batch's outcomes suggest of the next batch: every order new and created,
/// the bucket likely holds units for the next ones too; any new order sold out, the
/// bucket was empty when the batch ended, and a cancelled order is the only way a
/// unit comes back. Anything else (redeliveries, repeat users, failures) is not
/// worth assuming of the next batch.
fn next_speculation(results: &[Result<OrderOutcome, ErrorClass>]) -> Speculation {
    if results
        .iter()
        .all(|r| new_with(r, ResultCode::OrderCreated))
    {
        Speculation::Fresh
    } else if results
        .iter()
        .any(|r| new_with(r, ResultCode::PostgresSoldOut))
    {
        Speculation::SoldOut
    } else {
        Speculation::Careful
    }
}

/// A message that was new and ended with `code`.
fn new_with(result: &Result<OrderOutcome, ErrorClass>, code: ResultCode) -> bool {
    matches!(result, Ok(o) if o.code == code && !o.duplicate)
}

/// Whether the turn behind `turn` has passed (a turn that is gone has).
fn has_passed(turn: &watch::Receiver<Stage>) -> bool {
    turn.has_changed().is_err() || *turn.borrow() >= Stage::Passed
}

/// Runs `runs` in one transaction; if it fails for a reason retrying cannot fix
/// (a message the data rejects), splits it in halves and tries again, down to
/// single messages, so one bad message never takes the others with it. Transient
/// failures and unknown commits are answered for the whole group: the messages are
/// retried later, and the inbox answers any that did commit.
fn run_group<'a>(
    shared: &'a BucketShared,
    key: BucketKey,
    speculate: Speculation,
    title: &'a mut Option<SkuSnapshot>,
    turn: &'a mut AllocationTurn,
    runs: &'a [RunOrder],
) -> LocalBoxFuture<'a, Vec<Result<OrderOutcome, ErrorClass>>> {
    Box::pin(async move {
        let started = Instant::now();
        let result = run_orders(shared, key, speculate, title, turn, runs).await;
        let elapsed = started.elapsed();
        match result {
            Ok(done) => {
                let committed_at = chrono::Utc::now();
                for (run, outcome) in runs.iter().zip(&done.outcomes) {
                    log_committed(shared, key, run, outcome, &done, elapsed);
                    if !outcome.duplicate {
                        record_commit_latency(shared, &run.msg, committed_at);
                    }
                }
                done.outcomes.into_iter().map(Ok).collect()
            }
            Err(e) => {
                let class = e.class();
                if e.is_minted_id_conflict() {
                    metrics::counter!(crate::telemetry::names::MINTED_ID_CONFLICTS_TOTAL)
                        .increment(1);
                    tracing::warn!(
                        node_id = shared.ids.node_id(), error = %e,
                        "an id this engine minted was already taken; the messages are retried with fresh ids"
                    );
                }
                for run in runs {
                    log_failed(shared, key, run, &e, elapsed);
                }
                if runs.len() > 1 && matches!(class, ErrorClass::Fatal(_)) {
                    // The parts run after each other; later batches wait for all.
                    turn.hold();
                    let (left, right) = runs.split_at(runs.len() / 2);
                    // A batch that failed this way is not the common case.
                    let careful = Speculation::Careful;
                    let mut results = run_group(shared, key, careful, title, turn, left).await;
                    results.extend(run_group(shared, key, careful, title, turn, right).await);
                    results
                } else {
                    runs.iter().map(|_| Err(class.clone())).collect()
                }
            }
        }
    })
}

/// The fields of seed §12.1, one DEBUG line per message (INFO while its activity is
/// followed by this engine, `telemetry::trace`).
fn log_committed(
    shared: &BucketShared,
    key: BucketKey,
    run: &RunOrder,
    outcome: &OrderOutcome,
    done: &Done,
    elapsed: std::time::Duration,
) {
    let msg = &run.msg;
    metrics::histogram!(crate::telemetry::names::ORDER_TX_DURATION_SECONDS, "outcome" => outcome.label())
        .record(elapsed.as_secs_f64());
    crate::order_log!(
        shared.live.traced(),
        key.activity_id,
        request_id = %msg.request_id, reservation_id = %msg.reservation_id,
        message_id = %msg.message_id, order_id = outcome.order_id,
        activity_id = key.activity_id, sku_id = key.sku_id, user_id = msg.user_id,
        bucket = key.bucket, consumer_group = %shared.consumer_group,
        attempt = done.attempts, batch = done.outcomes.len(),
        // The conditional stock UPDATE took a unit exactly when the message created
        // its order.
        affected_rows = u8::from(outcome.code == ResultCode::OrderCreated && !outcome.duplicate),
        db_duration_ms = elapsed.as_millis() as u64,
        pool_acquire_ms = done.pool_acquire.as_millis() as u64,
        commit_result = outcome.label(),
        "order transaction committed"
    );
}

/// The end-to-end figure: from the reservation the message carries (stamped by the
/// front stage, on its clock) to the commit that decided the message, once per
/// message; a redelivery the inbox answers is not counted again.
fn record_commit_latency(
    shared: &BucketShared,
    msg: &OrderCreateMessage,
    committed_at: chrono::DateTime<chrono::Utc>,
) {
    let waited = (committed_at - msg.reserved_at)
        .to_std()
        .unwrap_or_default();
    // Spelled out: tests/it/deploy.rs reads recorded names from the macro calls.
    metrics::histogram!(crate::telemetry::names::ORDER_COMMIT_LATENCY_SECONDS)
        .record(waited.as_secs_f64());
    shared.live.recent().record(waited);
}

fn log_failed(
    shared: &BucketShared,
    key: BucketKey,
    run: &RunOrder,
    e: &StoreError,
    elapsed: std::time::Duration,
) {
    let msg = &run.msg;
    metrics::histogram!(crate::telemetry::names::ORDER_TX_DURATION_SECONDS, "outcome" => "error")
        .record(elapsed.as_secs_f64());
    if e.sqlstate() == Some("55P03") {
        metrics::counter!(crate::telemetry::names::DB_LOCK_TIMEOUTS_TOTAL).increment(1);
    }
    crate::order_log!(
        shared.live.traced(),
        key.activity_id,
        request_id = %msg.request_id, reservation_id = %msg.reservation_id,
        message_id = %msg.message_id, order_id = msg.order_id, activity_id = key.activity_id,
        sku_id = key.sku_id, user_id = msg.user_id, bucket = key.bucket,
        consumer_group = %shared.consumer_group, sqlstate = e.sqlstate(),
        db_duration_ms = elapsed.as_millis() as u64,
        commit_result = e.class().label(), error = %e,
        "order transaction failed"
    );
}

/// A committed order transaction and what it cost.
struct Done {
    outcomes: Vec<OrderOutcome>,
    attempts: u32,
    pool_acquire: std::time::Duration,
}

async fn run_orders(
    shared: &BucketShared,
    key: BucketKey,
    speculate: Speculation,
    title: &mut Option<SkuSnapshot>,
    turn: &mut AllocationTurn,
    runs: &[RunOrder],
) -> Result<Done, StoreError> {
    turn.wait_seat().await;
    // A slot among `engine.order_transactions`, then a connection, both within
    // `database.acquire_timeout_ms` like the connection alone: a wait that cannot
    // end (a split batch's part waiting for a slot held by a later transaction of
    // its bucket that waits for the part's turn) fails as a transient error and
    // is retried, as a pool wait is.
    let acquire = Instant::now();
    let (mut conn, slot_wait) = shared.pool.get_gated(&shared.tx_slots).await?;
    let pool_acquire = acquire.elapsed().saturating_sub(slot_wait);
    metrics::histogram!(crate::telemetry::names::ORDER_TX_SLOT_WAIT_SECONDS)
        .record(slot_wait.as_secs_f64());
    turn.seated();
    metrics::histogram!(crate::telemetry::names::DB_POOL_ACQUIRE_SECONDS)
        .record(pool_acquire.as_secs_f64());
    let sku = match title {
        Some(title) => title.clone(),
        None => {
            let loaded = load_bucket_sku(&mut conn, key.activity_id, key.sku_id, key.bucket)
                .await?
                .ok_or_else(|| {
                    StoreError::Anomaly(format!(
                        "unknown inventory bucket (activity {}, sku {}, bucket {})",
                        key.activity_id, key.sku_id, key.bucket
                    ))
                })?;
            *title = Some(loaded.clone());
            loaded
        }
    };
    // A message that contradicts the SKU fails its batch as fatal: the batch is
    // split until that message is alone, and it alone is dead-lettered with why.
    if let Some(reason) = runs.iter().find_map(|run| sku.contradiction(&run.msg)) {
        return Err(StoreError::Anomaly(reason));
    }
    let ctx = OrderTxContext {
        consumer_group: shared.consumer_group.clone(),
        sku_title: sku.title,
        lock_timeout: shared.lock_timeout.clone(),
        statement_timeout: shared.statement_timeout.clone(),
        max_attempts: shared.max_attempts,
        speculate,
    };
    let inputs: Vec<OrderInput<'_>> = runs
        .iter()
        .map(|run| {
            Ok(OrderInput {
                msg: &run.msg,
                topic: &run.topic,
                ledger_id: shared.ids.next_id()?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let created = create_orders(&mut conn, &ctx, &inputs, turn).await;
    // A read-only server (25006) closes this connection rather than pool it.
    let (outcomes, attempts) = conn.observe(created)?;
    Ok(Done {
        outcomes,
        attempts,
        pool_acquire,
    })
}

#[cfg(test)]
mod tests {
    use super::slot_free;

    #[test]
    fn the_last_pipeline_slot_takes_only_a_full_batch() {
        // pipeline 3, batches of 64: two run with whatever waits, the third only with 64.
        assert!(slot_free(0, 3, 1, 64));
        assert!(slot_free(1, 3, 1, 64));
        assert!(!slot_free(2, 3, 63, 64));
        assert!(slot_free(2, 3, 64, 64));
        assert!(!slot_free(3, 3, 500, 64));
        // pipeline 2: the second slot is the last one.
        assert!(slot_free(0, 2, 1, 64));
        assert!(!slot_free(1, 2, 10, 64));
        assert!(slot_free(1, 2, 64, 64));
    }

    #[test]
    fn an_idle_bucket_always_starts_and_one_order_batches_are_always_full() {
        // pipeline 1: the only slot is the last, and an idle bucket must still start.
        assert!(slot_free(0, 1, 1, 64));
        assert!(!slot_free(1, 1, 64, 64));
        // One order per transaction (the per-message path): every slot, as before.
        assert!(slot_free(2, 3, 1, 1));
        assert!(!slot_free(3, 3, 1, 1));
        // A pipeline of 0 is read as 1.
        assert!(slot_free(0, 0, 1, 64));
    }
}
