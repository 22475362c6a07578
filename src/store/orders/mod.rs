//! The order transaction (seed §9.1–§9.7 with the branches of §9.11): per message, a
//! Read Committed transaction body that dedups it in the inbox, records the
//! reservation, creates the order, takes one unit from the message's bucket with a
//! conditional UPDATE, and writes item, ledger and outbox event. Every branch that
//! ends without an order still records its result in the inbox, so a redelivery is
//! answered from there.
//!
//! Group commit: `create_orders` runs several messages in one transaction with one
//! COMMIT. It cuts them, in arrival order, into segments in which no two messages
//! share a key the order rows are unique on (message, reservation, request, order id
//! or number, user) or differ in bucket. A segment of several messages runs with
//! set-based statements (`set_based`), one statement per step for all of them and one
//! conditional inventory UPDATE; a segment of one message runs the per-message body,
//! unless the transaction speculates (`OrderTxContext::speculate`) and holds a single
//! segment: then it is sent whole, COMMIT included, without waiting for an answer
//! (`whole::run_fresh_transaction`). Segments run one after the other, each
//! seeing the ones before it, so every message gets the outcome it would get alone;
//! one message without speculation is exactly the per-message path. A transaction
//! that assumes its messages are new and its bucket empty is sent whole the same way
//! (`whole::run_sold_out_transaction`): it records them sold out without the
//! provisional orders and reservation updates the careful way writes and undoes.
//!
//! The folder is one-way: this entry chooses the path; `per_message`, `set_based`
//! and `whole` are the paths (`whole` falls back to `set_based`); `steps` holds what
//! they share, `rows` the column arrays of the set-based statements, `allocation`
//! the turn at the bucket's row, `context` the inputs, and `sql` every statement.
//! The inbox statements live in `store::inbox`, COMMIT and its outcome in
//! `store::tx`. No file here imports from a file that imports it.

mod allocation;
mod context;
mod per_message;
mod rows;
mod set_based;
mod sql;
mod steps;
mod whole;

use std::collections::HashSet;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use self::per_message::order_body;
use self::sql::{LOAD_BUCKET_SKU, SET_TX_SETTINGS};
use crate::domain::backoff;
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::OrderOutcome;
use crate::store::sqlstate::retry_in_place;
use crate::store::tx::commit;
use crate::store::{PgConn, StoreError};

pub use allocation::{AllocationTurn, Stage};
pub use context::{OrderInput, OrderTxContext, Speculation};

/// Runs the messages' order bodies in one transaction, retrying the whole
/// transaction in place on serialization failures and deadlocks (bounded,
/// jittered), and once the careful way when a speculative one found its messages
/// or its bucket not as assumed; returns one outcome per message, in order, and
/// the attempts it took.
/// Any error fails the whole transaction (nothing of it committed), returned for
/// the caller to classify.
pub async fn create_orders(
    conn: &mut PgConn,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    turn: &mut AllocationTurn,
) -> Result<(Vec<OrderOutcome>, u32), StoreError> {
    let mut attempt = 1;
    // In-place retries are bounded by `max_attempts` whether or not a speculative
    // attempt came first.
    let mut in_place = 0;
    let mut speculate = ctx.speculate;
    loop {
        match create_orders_once(conn, ctx, inputs, turn, speculate).await {
            Ok(outcomes) => return Ok((outcomes, attempt)),
            Err(StoreError::Speculation) if speculate != Speculation::Careful => {
                metrics::counter!(crate::telemetry::names::ORDER_TX_RETRIES_TOTAL, "reason" => "speculation")
                    .increment(1);
                speculate = Speculation::Careful;
                attempt += 1;
            }
            Err(StoreError::Db(e))
                if in_place + 1 < ctx.max_attempts
                    && e.code().is_some_and(|c| retry_in_place(c.code())) =>
            {
                tracing::debug!(
                    messages = inputs.len(), attempt, sqlstate = ?e.code().map(|c| c.code()),
                    "order transaction retried in place"
                );
                metrics::counter!(crate::telemetry::names::ORDER_TX_RETRIES_TOTAL, "reason" => "in_place")
                    .increment(1);
                in_place += 1;
                tokio::time::sleep(retry_delay(in_place)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// 15 ms doubling per attempt (at most 6 times) plus up to 20 ms of jitter (seed
/// `retryDelay`).
fn retry_delay(attempt: u32) -> Duration {
    let exp = backoff::exponential(
        Duration::from_millis(15),
        Duration::MAX,
        attempt.saturating_sub(1).min(6),
    );
    backoff::plus_up_to(exp, Duration::from_millis(20))
}

async fn create_orders_once(
    conn: &mut PgConn,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    turn: &mut AllocationTurn,
    speculate: Speculation,
) -> Result<Vec<OrderOutcome>, StoreError> {
    let segments = segments(inputs);
    if let [segment] = segments[..] {
        match speculate {
            Speculation::Fresh => {
                return whole::run_fresh_transaction(conn, ctx, segment, turn).await
            }
            Speculation::SoldOut => {
                return whole::run_sold_out_transaction(conn, ctx, segment, turn).await
            }
            Speculation::Careful => {}
        }
    }
    let PgConn {
        client,
        statements,
        warnings,
        ..
    } = conn;
    let tx = client.transaction().await?;
    let st = statements;
    let settings = st.get(&tx, SET_TX_SETTINGS).await?;
    // Pipelined: the first statement of the body follows without waiting.
    let timeouts: [&(dyn ToSql + Sync); 2] = [&ctx.lock_timeout, &ctx.statement_timeout];
    let set = tx.execute(&settings, &timeouts);
    let body = async {
        let mut outcomes = Vec::with_capacity(inputs.len());
        for segment in segments {
            if let [input] = segment {
                outcomes.push(order_body(&tx, st, ctx, input, turn).await?);
            } else {
                outcomes.extend(set_based::run_segment(&tx, st, ctx, segment, turn).await?);
            }
        }
        Ok::<_, StoreError>(outcomes)
    };
    let (set, outcomes) = futures_util::join!(set, body);
    set?;
    let outcomes = outcomes?;
    crate::failpoint_hang!("order_tx_before_commit");
    turn.pass_on().await;
    commit(tx, warnings).await?;
    Ok(outcomes)
}

/// A value some unique key of the rows an order message writes is built from
/// (inbox, reservation, order, ledger, outbox, compensation). Two messages that share
/// none cannot wait on each other's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderKey {
    Message(Uuid),
    Reservation(Uuid),
    Request(Uuid),
    OrderId(i64),
    /// A hash of the order number: a collision only makes two messages look related.
    OrderNo(u64),
    User(i64, i64, i64),
}

impl OrderKey {
    pub fn of(m: &OrderCreateMessage) -> [OrderKey; 6] {
        let mut order_no = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&m.order_no, &mut order_no);
        [
            OrderKey::Message(m.message_id),
            OrderKey::Reservation(m.reservation_id),
            OrderKey::Request(m.request_id),
            OrderKey::OrderId(m.order_id),
            OrderKey::OrderNo(std::hash::Hasher::finish(&order_no)),
            OrderKey::User(m.activity_id, m.sku_id, m.user_id),
        ]
    }
}

/// Cuts `inputs`, in order, into the longest runs of one bucket in which no two
/// messages share a key: inside such a run no message can change another's outcome
/// except through the inventory row, which the set-based allocation hands out in
/// arrival order.
fn segments<'i, 'a>(inputs: &'i [OrderInput<'a>]) -> Vec<&'i [OrderInput<'a>]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut seen: HashSet<OrderKey> = HashSet::new();
    for (i, input) in inputs.iter().enumerate() {
        let m = input.msg;
        let keys = OrderKey::of(m);
        let first = inputs[start].msg;
        let other_bucket = (first.activity_id, first.sku_id, first.inventory_bucket)
            != (m.activity_id, m.sku_id, m.inventory_bucket);
        if i > start && (other_bucket || keys.iter().any(|k| seen.contains(k))) {
            out.push(&inputs[start..i]);
            start = i;
            seen.clear();
        }
        seen.extend(keys);
    }
    if start < inputs.len() {
        out.push(&inputs[start..]);
    }
    out
}

/// What the bucket actor caches of its SKU: the title the order rows carry, and the
/// price and order TTL a message must agree with. The engine trusts no price from
/// the queue: whoever can publish to it must not be able to set what an order costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuSnapshot {
    pub title: String,
    pub unit_price: i64,
    pub currency: String,
    /// The activity's order TTL (`rules.order_ttl_ms`).
    pub order_ttl_ms: i64,
}

impl SkuSnapshot {
    /// Why `msg` contradicts the SKU, if it does: another price or currency, or an
    /// order expiry later than its reservation time plus the activity's order TTL.
    pub fn contradiction(&self, msg: &OrderCreateMessage) -> Option<String> {
        if msg.unit_price != self.unit_price || msg.currency != self.currency {
            return Some(format!(
                "the message prices the order at {} {}, the SKU costs {} {}",
                msg.unit_price, msg.currency, self.unit_price, self.currency
            ));
        }
        let latest = msg.reserved_at + chrono::TimeDelta::milliseconds(self.order_ttl_ms);
        if msg.order_expire_at > latest {
            return Some(format!(
                "order_expire_at {} is later than reserved_at {} plus the activity's order TTL of {} ms",
                msg.order_expire_at, msg.reserved_at, self.order_ttl_ms
            ));
        }
        None
    }
}

/// The SKU snapshot the bucket actor caches: `None` when the (activity, sku, bucket)
/// does not exist, which makes the message poison.
pub async fn load_bucket_sku(
    conn: &mut PgConn,
    activity_id: i64,
    sku_id: i64,
    bucket: i16,
) -> Result<Option<SkuSnapshot>, StoreError> {
    let PgConn {
        client, statements, ..
    } = conn;
    let stmt = statements.get(&*client, LOAD_BUCKET_SKU).await?;
    let row = client
        .query_opt(&stmt, &[&activity_id, &sku_id, &bucket])
        .await?;
    Ok(row.map(|r| SkuSnapshot {
        title: r.get(0),
        unit_price: r.get(1),
        currency: r.get(2),
        order_ttl_ms: r.get(3),
    }))
}
