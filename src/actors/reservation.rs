//! The reservation actor exists while messages of one reservation are in flight. It
//! serializes them: a second message waits for the first, then resolves through the
//! inbox and reservation branches in PostgreSQL, or, when it is a copy of a message
//! whose result is already committed, is answered from that result.

use std::sync::Arc;

use actix::prelude::*;
use uuid::Uuid;

use super::bucket::{BucketActor, BucketKey, RunOrder};
use super::registry::{Registry, Route};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{ErrorClass, OrderOutcome};

pub struct ReservationActor {
    buckets: Addr<Registry<BucketKey, BucketActor>>,
    /// The last committed result, by message id.
    last: Option<(Uuid, OrderOutcome)>,
}

/// Process one `order.create` message.
#[derive(Message)]
#[rtype(result = "Result<OrderOutcome, ErrorClass>")]
pub struct ProcessOrder {
    pub msg: OrderCreateMessage,
    pub topic: Arc<str>,
}

impl ReservationActor {
    pub fn new(buckets: Addr<Registry<BucketKey, BucketActor>>) -> Self {
        Self {
            buckets,
            last: None,
        }
    }
}

impl Actor for ReservationActor {
    type Context = Context<Self>;
}

impl Handler<ProcessOrder> for ReservationActor {
    type Result = AtomicResponse<Self, Result<OrderOutcome, ErrorClass>>;

    fn handle(&mut self, p: ProcessOrder, _: &mut Self::Context) -> Self::Result {
        if let Some((message_id, outcome)) = self.last {
            if message_id == p.msg.message_id {
                // A copy of a message whose result is committed: its inbox row exists,
                // so acking the copy is exactly what the database would answer.
                return AtomicResponse::new(Box::pin(fut::ready(Ok(OrderOutcome {
                    duplicate: true,
                    ..outcome
                }))));
            }
        }
        let message_id = p.msg.message_id;
        let route = Route {
            key: BucketKey::of(&p.msg),
            msg: RunOrder {
                msg: p.msg,
                topic: p.topic,
            },
        };
        let reply = self.buckets.send(route);
        AtomicResponse::new(Box::pin(reply.into_actor(self).map(
            move |result, actor, _| {
                let result = match result {
                    Ok(Ok(inner)) => inner,
                    // The registry or the bucket actor is gone (shutdown): nothing was
                    // decided, try again later.
                    Ok(Err(_)) | Err(_) => Err(ErrorClass::Unavailable("actor_unavailable")),
                };
                if let Ok(outcome) = &result {
                    actor.last = Some((message_id, *outcome));
                }
                result
            },
        )))
    }
}
