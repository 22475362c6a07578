//! Settling a delivery once its outcome is known: ack it (through the channel's ack
//! task), send a copy to the shard's retry queue with its retry count, or publish it
//! to the dead-letter queue with its reason. Nothing is acked before its copy is
//! confirmed; a copy the broker refuses falls back to a nack or reject that leaves the
//! message with the broker. The intake decides which; this module does it.

use lapin::message::Delivery;
use lapin::options::{BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, LongString};
use lapin::BasicProperties;
use std::sync::Arc;

use crate::domain::message::PoisonReason;
use crate::mq::acks::Acks;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::topology::Route;
use crate::mq::{
    self, DEAD_AT_HEADER, DEAD_KIND_HEADER, DEAD_QUEUE_HEADER, DEAD_REASON_HEADER, RETRIES_HEADER,
};
use crate::status::InFlight;

/// Where an intake sends what it cannot ack.
#[derive(Clone)]
pub struct IntakeRoutes {
    /// The consumed queue.
    pub queue: Arc<str>,
    /// The shard's (or the callback queue's) retry queue, through `{ns}.retry`.
    pub retry: Route,
    /// The dead-letter queue, through `{ns}.dead`.
    pub dead: Route,
    pub max_retries: u32,
    /// How long a message waits before it is tried again.
    pub retry_delay: std::time::Duration,
}

/// Where a delivery goes once its outcome is known.
pub(crate) struct Outlet {
    pub routes: IntakeRoutes,
    pub publisher: ConfirmedPublisher,
    pub acks: Acks,
}

/// Hands a delivery's ack to the channel's ack task. The in-flight count drops first,
/// so it never exceeds what the broker counts as unacked.
pub(crate) fn ack(outlet: &Outlet, delivery: &Delivery, in_flight: InFlight) {
    drop(in_flight);
    outlet.acks.ack(delivery.delivery_tag);
}

fn retries_of(delivery: &Delivery) -> u32 {
    mq::int_header(&delivery.properties, RETRIES_HEADER)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Same body and properties, with extra headers.
fn copy_properties(delivery: &Delivery, extra: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    for (name, value) in extra {
        headers.insert((*name).into(), value.clone());
    }
    delivery.properties.clone().with_headers(headers)
}

/// Whether a retry spends one of the message's `amqp.max_retries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// The message's own attempt failed (a deadlock, a lock timeout, an unexpected
    /// SQLSTATE): counted, and dead-lettered once the budget is spent.
    Spend,
    /// The database or the engine could not take the work (docs/DESIGN.md,
    /// "Failure handling"): the message waits, however long, without counting.
    Keep,
}

/// Sends the message to the shard's retry queue (it comes back after the TTL), then
/// acks the original. If the copy cannot be published, the original is requeued after
/// the delay instead: never lost, never acked early.
pub(crate) async fn retry(
    outlet: &Outlet,
    delivery: Delivery,
    reason: &'static str,
    budget: Budget,
    in_flight: InFlight,
) {
    let routes = &outlet.routes;
    let retries = retries_of(&delivery);
    if budget == Budget::Spend && retries >= routes.max_retries {
        let reason = PoisonReason::new(
            "retries_exhausted",
            format!("gave up after {retries} delayed retries; last reason: {reason}"),
        );
        dead_letter(outlet, delivery, &reason, in_flight).await;
        return;
    }
    metrics::counter!(crate::telemetry::names::ORDER_RETRIES_TOTAL, "reason" => reason)
        .increment(1);
    let counted = match budget {
        Budget::Spend => retries.saturating_add(1),
        Budget::Keep => retries,
    };
    let props = copy_properties(
        &delivery,
        &[(RETRIES_HEADER, AMQPValue::LongLongInt(i64::from(counted)))],
    );
    match outlet
        .publisher
        .publish(
            &routes.retry.exchange,
            &routes.retry.routing_key,
            &delivery.data,
            props,
        )
        .await
    {
        Ok(()) => ack(outlet, &delivery, in_flight),
        Err(e) => {
            // The broker would not take the copy; fall back to a requeue, after the
            // same delay, so a sick broker is not hammered.
            tracing::warn!(queue = %routes.queue, error = %e, reason, "could not schedule a retry; requeueing after the delay");
            tokio::time::sleep(routes.retry_delay).await;
            drop(in_flight);
            match delivery
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
            {
                Ok(_) => outlet.acks.released(delivery.delivery_tag),
                // Still unsettled for the ack task, so no `multiple` ack covers it.
                Err(e) => {
                    tracing::warn!(queue = %routes.queue, error = %e, "nack failed; the message will be redelivered")
                }
            }
        }
    }
}

/// Publishes the message to the dead-letter queue with its reason, then acks it. If
/// that publish fails, rejects it without requeue so the queue's dead-letter exchange
/// still moves it to the DLQ (without our reason header, which the log line carries).
pub(crate) async fn dead_letter(
    outlet: &Outlet,
    delivery: Delivery,
    reason: &PoisonReason,
    in_flight: InFlight,
) {
    let routes = &outlet.routes;
    let message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string());
    tracing::warn!(
        queue = %routes.queue, message_id, kind = reason.kind, reason = %reason.detail,
        "message dead-lettered"
    );
    metrics::counter!(crate::telemetry::names::DEAD_LETTERED_TOTAL, "kind" => reason.kind)
        .increment(1);
    let props = copy_properties(
        &delivery,
        &[
            (
                DEAD_REASON_HEADER,
                AMQPValue::LongString(LongString::from(reason.detail.as_bytes().to_vec())),
            ),
            (
                DEAD_KIND_HEADER,
                AMQPValue::LongString(LongString::from(reason.kind.as_bytes().to_vec())),
            ),
            (
                DEAD_QUEUE_HEADER,
                AMQPValue::LongString(LongString::from(routes.queue.as_bytes().to_vec())),
            ),
            (DEAD_AT_HEADER, AMQPValue::LongLongInt(mq::unix_millis())),
        ],
    );
    match outlet
        .publisher
        .publish(
            &routes.dead.exchange,
            &routes.dead.routing_key,
            &delivery.data,
            props,
        )
        .await
    {
        Ok(()) => ack(outlet, &delivery, in_flight),
        Err(e) => {
            tracing::warn!(queue = %routes.queue, error = %e, "dead-letter publish failed; rejecting to the queue's dead-letter exchange");
            drop(in_flight);
            match delivery
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
            {
                Ok(_) => outlet.acks.released(delivery.delivery_tag),
                // Still unsettled for the ack task, so no `multiple` ack covers it.
                Err(e) => {
                    tracing::warn!(queue = %routes.queue, error = %e, "reject failed; the message will be redelivered")
                }
            }
        }
    }
}
