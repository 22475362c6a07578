//! Payment callbacks (seed §9.9, §7.6): one transaction dedups the callback in the
//! inbox, records the payment, and pays the order with a conditional UPDATE that races
//! the sweeper's conditional cancel on the same row; a 0-row result is classified by
//! re-reading the order. A late payment never revives stock that may be resold: it
//! is refunded.

use serde_json::json;
use uuid::Uuid;

use super::compensation::{insert_task, NewTask};
use super::outbox::{event_payload, insert_event, Event};
use super::tx::commit;
use super::{PgConn, StatementCache, StoreError, Warnings};
use crate::domain::events::{OrderPaid, RefundRequired};
use crate::domain::payment::{PaymentCallback, PaymentResult};
use crate::domain::status::{CompensationType, OrderStatus, PaymentStatus};
use tokio_postgres::{Row, Transaction};

/// The committed result of one callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentOutcome {
    pub result: PaymentResult,
    /// The inbox already held this callback.
    pub duplicate: bool,
}

/// Applies one payment callback in one transaction: dedup in the inbox, then pay
/// the order or record why not, then the inbox result and COMMIT.
pub async fn apply_callback(
    conn: &mut PgConn,
    consumer_group: &str,
    topic: &str,
    cb: &PaymentCallback,
) -> Result<PaymentOutcome, StoreError> {
    let PgConn {
        client,
        statements,
        warnings,
        ..
    } = conn;
    let tx = client.transaction().await?;
    let st = statements;
    let message_id = cb.inbox_message_id();

    let order = tx
        .query_opt(&st.get(&tx, READ_ORDER).await?, &[&cb.order_id])
        .await?;
    let inbox = Inbox {
        consumer_group,
        topic,
        message_id,
    };
    if let Some(row) = claim_inbox(&tx, st, &inbox, cb, order.as_ref()).await? {
        commit(tx, warnings).await?;
        return stored_outcome(&row);
    }

    let result = match order {
        None => {
            manual_review(&tx, st, cb, "payment for an unknown order").await?;
            PaymentResult::UnknownOrder
        }
        Some(order) => settle(&tx, st, cb, &order).await?,
    };
    finish(tx, st, warnings, consumer_group, message_id, result).await
}

/// Where this callback's inbox row is: its consumer group, topic and message id.
struct Inbox<'a> {
    consumer_group: &'a str,
    topic: &'a str,
    message_id: Uuid,
}

/// Inserts the callback's inbox row; `Some(stored row)` for a redelivery, answered from it.
async fn claim_inbox(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    inbox: &Inbox<'_>,
    cb: &PaymentCallback,
    order: Option<&Row>,
) -> Result<Option<Row>, StoreError> {
    let reservation_id: Uuid = order.map(|o| o.get(0)).unwrap_or_else(Uuid::nil);
    let inserted = tx
        .execute(
            &st.get(tx, INSERT_INBOX).await?,
            &[
                &inbox.consumer_group,
                &inbox.message_id,
                &inbox.topic,
                &cb.callback_id,
                &reservation_id,
                &cb.order_id,
            ],
        )
        .await?;
    if inserted != 0 {
        return Ok(None);
    }
    let row = tx
        .query_one(
            &st.get(tx, LOAD_INBOX).await?,
            &[&inbox.consumer_group, &inbox.message_id],
        )
        .await?;
    Ok(Some(row))
}

/// The outcome of a redelivered callback, from the result its inbox row holds.
fn stored_outcome(row: &Row) -> Result<PaymentOutcome, StoreError> {
    let stored: String = row.get(0);
    let result = PaymentResult::parse(&stored).ok_or_else(|| {
        StoreError::Anomaly(format!("inbox holds unknown payment result {stored:?}"))
    })?;
    Ok(PaymentOutcome {
        result,
        duplicate: true,
    })
}

/// The order exists: review a wrong amount, else record the payment and pay the order.
async fn settle(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    cb: &PaymentCallback,
    order: &Row,
) -> Result<PaymentResult, StoreError> {
    let total_amount: i64 = order.get(2);
    let currency: String = order.get(3);
    if total_amount != cb.amount || currency != cb.currency {
        record_payment(tx, st, cb, PaymentStatus::Pending).await?;
        manual_review(
            tx,
            st,
            cb,
            &format!(
                "paid {} {} for an order of {total_amount} {currency}",
                cb.amount, cb.currency
            ),
        )
        .await?;
        return Ok(PaymentResult::AmountMismatch);
    }

    let new_payment = record_payment(tx, st, cb, PaymentStatus::Succeeded).await?;
    // §9.9: the conditional transition that races the timeout cancel.
    if let Some(paid) = tx
        .query_opt(&st.get(tx, PAY_ORDER).await?, &[&cb.order_id, &cb.paid_at])
        .await?
    {
        insert_event(tx, st, order_paid_event(cb, &paid)?).await?;
        return Ok(PaymentResult::Paid);
    }
    // 0 rows: classify by re-reading (§9.9).
    classify_unpaid(tx, st, cb, new_payment).await
}

/// The `ORDER_PAID` event of an order `PAY_ORDER` paid (its `RETURNING` row).
fn order_paid_event(cb: &PaymentCallback, paid: &Row) -> Result<Event, StoreError> {
    Ok(Event {
        dedup_key: format!("ORDER_PAID:{}", cb.order_id),
        aggregate_type: "ORDER",
        aggregate_id: cb.order_id.to_string(),
        tag: "ORDER_PAID",
        message_key: cb.order_id.to_string(),
        payload: event_payload(&OrderPaid {
            order_id: cb.order_id,
            reservation_id: paid.get::<_, Uuid>(0),
            user_id: paid.get::<_, i64>(1),
            payment_id: cb.payment_id,
            amount: cb.amount,
            currency: &cb.currency,
            paid_at: cb.paid_at,
        })?,
    })
}

/// Why `PAY_ORDER` updated no row, from the order's status: refund, review or already paid.
async fn classify_unpaid(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    cb: &PaymentCallback,
    new_payment: bool,
) -> Result<PaymentResult, StoreError> {
    let status: i16 = tx
        .query_one(&st.get(tx, ORDER_STATUS).await?, &[&cb.order_id])
        .await?
        .get(0);
    Ok(match OrderStatus::from_code(status) {
        Some(OrderStatus::Paid) if !new_payment => PaymentResult::AlreadyPaid,
        Some(OrderStatus::Paid) => {
            refund(tx, st, cb, "DOUBLE_PAYMENT").await?;
            PaymentResult::DoublePayment
        }
        Some(OrderStatus::Cancelled) => {
            refund(tx, st, cb, "PAID_AFTER_CANCEL").await?;
            PaymentResult::PaidAfterCancel
        }
        _ => {
            manual_review(
                tx,
                st,
                cb,
                &format!("payment for an order in status {status}"),
            )
            .await?;
            PaymentResult::NotPayable
        }
    })
}

/// Records the payment; returns whether it is new (unique keys decide).
async fn record_payment(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    cb: &PaymentCallback,
    status: PaymentStatus,
) -> Result<bool, StoreError> {
    let raw = cb.raw.clone().unwrap_or_else(|| json!({}));
    let paid_at = (status == PaymentStatus::Succeeded).then_some(cb.paid_at);
    let row = tx
        .query_opt(
            &st.get(tx, INSERT_PAYMENT).await?,
            &[
                &cb.payment_id,
                &cb.payment_request_id,
                &cb.order_id,
                &cb.provider,
                &cb.provider_trade_no,
                &cb.callback_id,
                &cb.amount,
                &cb.currency,
                &status.code(),
                &raw,
                &paid_at,
            ],
        )
        .await?;
    Ok(row.is_some())
}

/// A refund task and the `payment.refund_required` event, once per payment.
async fn refund(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    cb: &PaymentCallback,
    reason: &str,
) -> Result<(), StoreError> {
    let payload = json!(RefundRequired {
        order_id: cb.order_id,
        payment_id: cb.payment_id,
        payment_request_id: cb.payment_request_id,
        provider: &cb.provider,
        provider_trade_no: &cb.provider_trade_no,
        amount: cb.amount,
        currency: &cb.currency,
        reason,
    });
    insert_task(
        tx,
        st,
        NewTask {
            task_type: CompensationType::Refund,
            idempotency_key: format!("REFUND:{}", cb.payment_id),
            reservation_id: None,
            order_id: Some(cb.order_id),
            payload: payload.clone(),
        },
    )
    .await?;
    insert_event(
        tx,
        st,
        Event {
            dedup_key: format!("PAYMENT_REFUND_REQUIRED:{}", cb.payment_id),
            aggregate_type: "PAYMENT",
            aggregate_id: cb.payment_id.to_string(),
            tag: "PAYMENT_REFUND_REQUIRED",
            message_key: cb.order_id.to_string(),
            payload: event_payload(&payload)?,
        },
    )
    .await
}

async fn manual_review(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    cb: &PaymentCallback,
    why: &str,
) -> Result<(), StoreError> {
    insert_task(
        tx,
        st,
        NewTask {
            task_type: CompensationType::ManualReview,
            idempotency_key: format!("MANUAL_REVIEW:PAYMENT:{}", cb.payment_id),
            reservation_id: None,
            order_id: Some(cb.order_id),
            payload: json!({
                "why": why,
                "order_id": cb.order_id,
                "payment_id": cb.payment_id,
                "provider": cb.provider,
                "provider_trade_no": cb.provider_trade_no,
                "amount": cb.amount,
                "currency": cb.currency,
            }),
        },
    )
    .await
}

async fn finish(
    tx: Transaction<'_>,
    st: &mut StatementCache,
    warnings: &Warnings,
    consumer_group: &str,
    message_id: Uuid,
    result: PaymentResult,
) -> Result<PaymentOutcome, StoreError> {
    tx.execute(
        &st.get(&tx, UPDATE_INBOX_RESULT).await?,
        &[&consumer_group, &message_id, &result.as_str()],
    )
    .await?;
    commit(tx, warnings).await?;
    Ok(PaymentOutcome {
        result,
        duplicate: false,
    })
}

const READ_ORDER: &str =
    "SELECT reservation_id, status, total_amount, currency FROM orders WHERE order_id = $1";

const ORDER_STATUS: &str = "SELECT status FROM orders WHERE order_id = $1";

const INSERT_INBOX: &str = "
INSERT INTO consumer_inbox (
    consumer_group, message_id, topic, tag, message_key, reservation_id, status,
    result_code, order_id
)
VALUES ($1, $2, $3, 'PAYMENT_CALLBACK', $4, $5, 20, 'PAID', $6)
ON CONFLICT (consumer_group, message_id) DO NOTHING";

const LOAD_INBOX: &str =
    "SELECT result_code FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2";

const UPDATE_INBOX_RESULT: &str = "
UPDATE consumer_inbox
SET result_code = $3, processed_at = statement_timestamp()
WHERE consumer_group = $1 AND message_id = $2";

const INSERT_PAYMENT: &str = "
INSERT INTO payment_record (
    payment_id, payment_request_id, order_id, provider, provider_trade_no, callback_id,
    amount, currency, status, raw_payload, paid_at
)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT DO NOTHING
RETURNING payment_id";

const PAY_ORDER: &str = "
UPDATE orders
SET status = 30,
    paid_at = $2,
    version = version + 1,
    updated_at = statement_timestamp()
WHERE order_id = $1
  AND status IN (10, 20)
RETURNING reservation_id, user_id";
