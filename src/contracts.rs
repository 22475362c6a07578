//! The AsyncAPI 3 document of the messages the engine reads and writes, and the JSON
//! Schema of each message's payload, generated from the types that are sent
//! (`domain::message`, `domain::payment`, `domain::events`) and the names that route
//! them (`mq`). docs/contracts/ holds the committed copies; `tests/contracts.rs`
//! fails when they differ, and validates messages against them.

use serde_json::{json, Map, Value};
use utoipa::PartialSchema;

use crate::domain::events::{
    InventoryReleaseRequested, OrderCancelled, OrderCreated, OrderPaid, RefundRequired,
    EVENT_SCHEMA_VERSION,
};
use crate::domain::message::{OrderCreateMessage, SCHEMA_VERSION};
use crate::domain::payment::PaymentCallback;
use crate::domain::signature::SIGNATURE_HEADER;
use crate::mq;

/// One message of the contract: its name on the wire and the file of its schema.
pub struct MessageSchema {
    /// `order.create`, `order.created`, ...: the AsyncAPI message's name.
    pub name: &'static str,
    /// The file under docs/contracts/schemas/.
    pub file: &'static str,
    /// The JSON Schema (draft 2020-12) of the payload.
    pub schema: Value,
}

/// The schema of `T` as a standalone JSON Schema document titled `name`.
fn standalone<T: PartialSchema>(name: &str, file: &str) -> Value {
    let mut schema = serde_json::to_value(T::schema()).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut schema {
        let mut out = Map::new();
        out.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        out.insert("$id".into(), json!(format!("schemas/{file}")));
        out.insert("title".into(), json!(name));
        out.append(fields);
        return Value::Object(out);
    }
    schema
}

/// Every message's payload schema, commands first, then the events in the order a
/// sale produces them.
pub fn message_schemas() -> Vec<MessageSchema> {
    macro_rules! schema {
        ($name:literal, $file:literal, $ty:ty) => {
            MessageSchema {
                name: $name,
                file: $file,
                schema: standalone::<$ty>($name, $file),
            }
        };
    }
    vec![
        schema!("order.create", "order.create.json", OrderCreateMessage),
        schema!("payment.callback", "payment.callback.json", PaymentCallback),
        schema!("order.created", "order.created.json", OrderCreated<'_>),
        schema!("order.paid", "order.paid.json", OrderPaid<'_>),
        schema!("order.cancelled", "order.cancelled.json", OrderCancelled),
        schema!(
            "inventory.release_requested",
            "inventory.release_requested.json",
            InventoryReleaseRequested
        ),
        schema!(
            "payment.refund_required",
            "payment.refund_required.json",
            RefundRequired<'_>
        ),
        schema!(
            "payment.refund_requested",
            "payment.refund_requested.json",
            RefundRequired<'_>
        ),
    ]
}

/// The outbox tag of an event message (`x-event-type`, the AMQP `type`).
fn event_tag(name: &str) -> String {
    name.to_ascii_uppercase().replace('.', "_")
}

/// The headers every event carries.
fn event_headers(name: &str) -> Value {
    json!({
        "type": "object",
        "required": ["x-event-type", "x-schema-version"],
        "properties": {
            "x-event-type": {"type": "string", "const": event_tag(name),
                             "description": "The event's type, also the AMQP `type` property."},
            "x-schema-version": {"type": "integer", "const": EVENT_SCHEMA_VERSION,
                                 "description": "The payload's major version; a consumer refuses one it does not know."},
        }
    })
}

/// The messages of the document, their payloads' schemas (references to the
/// files), and the events among them (the events channel's messages).
fn messages() -> (Map<String, Value>, Map<String, Value>, Map<String, Value>) {
    let schemas = message_schemas();
    let mut messages = Map::new();
    let mut components = Map::new();
    let mut event_refs = Map::new();
    for m in &schemas {
        let id = m.name.replace('.', "_");
        components.insert(id.clone(), json!({"$ref": format!("schemas/{}", m.file)}));
        let (headers, summary) = match m.name {
            "order.create" => (
                json!({
                    "type": "object",
                    "properties": {
                        SIGNATURE_HEADER: {
                            "type": "string", "pattern": "^v1=[0-9a-f]{64}$",
                            "description": "When `amqp.order_signing_secret` is set (then required): \
                                            `v1=` and the lowercase hex HMAC-SHA256 of the body bytes \
                                            exactly as published, keyed by the secret. A missing or \
                                            wrong one is dead-lettered as `unsigned`/`bad_signature`."
                        },
                        mq::PUBLISHED_AT_HEADER: {"type": "integer",
                            "description": "When the producer published it (ms since the Unix epoch)."}
                    }
                }),
                "A reservation for the engine to turn into an order (one PostgreSQL transaction).",
            ),
            "payment.callback" => (
                json!({"type": "object", "properties": {
                    mq::PUBLISHED_AT_HEADER: {"type": "integer",
                        "description": "When the producer published it (ms since the Unix epoch)."}}}),
                "A successful payment, for the engine to apply to its order once.",
            ),
            name => {
                event_refs.insert(
                    id.clone(),
                    json!({"$ref": format!("#/components/messages/{id}")}),
                );
                (
                    event_headers(name),
                    "An event of the engine, published after its transaction commits.",
                )
            }
        };
        messages.insert(
            id.clone(),
            json!({
                "name": m.name,
                "title": m.name,
                "summary": summary,
                "contentType": "application/json",
                "headers": headers,
                "payload": {"$ref": format!("#/components/schemas/{id}")},
                "bindings": {"amqp": {"bindingVersion": "0.3.0"}},
            }),
        );
    }
    messages.insert("dead_letter".into(), dead_letter());
    (messages, components, event_refs)
}

/// A dead letter: the original message and why.
fn dead_letter() -> Value {
    let dead_headers = json!({
        "type": "object",
        "required": [mq::DEAD_REASON_HEADER, mq::DEAD_KIND_HEADER, mq::DEAD_QUEUE_HEADER],
        "properties": {
            mq::DEAD_KIND_HEADER: {"type": "string", "description": "Why, as a short fixed word (a metric label): `malformed`, `invalid_value`, `unsupported_version`, `unsigned`, `bad_signature`, `too_large`, `retries_exhausted`, ..."},
            mq::DEAD_REASON_HEADER: {"type": "string", "description": "Why, for a person (never the body)."},
            mq::DEAD_QUEUE_HEADER: {"type": "string", "description": "The queue the message was consumed from: where a replay returns it."},
            mq::DEAD_AT_HEADER: {"type": "integer", "description": "When it was dead-lettered (ms since the Unix epoch)."},
            mq::RETRIES_HEADER: {"type": "integer", "description": "Delayed retries it had."},
        }
    });
    json!({
            "name": "dead letter",
            "title": "dead letter",
            "summary": "A message the engine will not apply: the original body and headers, unchanged, \
                        plus why. Replayed only by an operator (`seckill-engine dlq replay`).",
            "contentType": "application/json",
            "headers": dead_headers,
            "payload": {"description": "The original body, byte for byte (it may not be valid JSON)."},
    })
}

/// The AsyncAPI 3.0 document, as committed (pretty JSON, final newline).
pub fn asyncapi_document() -> String {
    let (messages, components, event_refs) = messages();
    let namespace =
        json!({"description": "`amqp.namespace`: every exchange and queue of one deployment."});
    let document = json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "seckill-engine messages",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "The messages seckill-engine reads (`order.create`, `payment.callback`) and \
                 writes (the events), on RabbitMQ. Commands carry their major version in the \
                 body (`schema_version`, {SCHEMA_VERSION}; absent means 1); an engine \
                 dead-letters a version it does not know as `unsupported_version`. Events \
                 carry theirs in the `x-schema-version` header ({EVENT_SCHEMA_VERSION}). Every \
                 message has an AMQP `message_id`: consumers dedup by it."
            ),
        },
        "defaultContentType": "application/json",
        "channels": {
            "orderCreate": {
                "address": "{namespace}.order.create.{shard}",
                "title": "order.create, one quorum queue per shard",
                "description": "Published to the direct exchange `{namespace}.orders` with routing key \
                                `order.create.{shard}`. One consumer per shard is active at a time.",
                "parameters": {
                    "namespace": namespace,
                    "shard": {"description": "`shard_for(activity_id, sku_id, inventory_bucket, amqp.shards)`: \
                                              (FNV-1a 64 of the decimal `activity_id:sku_id`, mod shards, plus \
                                              inventory_bucket mod shards) mod shards; pinned by the engine's tests \
                                              (`domain::shard`). Every producer must use it: a message on another \
                                              shard's queue is still applied, by that shard."}
                },
                "messages": {"order_create": {"$ref": "#/components/messages/order_create"}},
            },
            "paymentCallback": {
                "address": "{namespace}.payment.callback",
                "description": "Published to the direct exchange `{namespace}.payments` with routing key `payment.callback`.",
                "parameters": {"namespace": namespace},
                "messages": {"payment_callback": {"$ref": "#/components/messages/payment_callback"}},
            },
            "events": {
                "address": "{namespace}.events",
                "title": "the events (topic exchange)",
                "description": "Routing key: the event's name (`order.created`, `order.paid`, ...). At least \
                                once, in commit order per aggregate; dedup by `message_id` (the event id, or \
                                the compensation task id for `payment.refund_requested`).",
                "parameters": {"namespace": namespace},
                "messages": event_refs,
            },
            "deadLetters": {
                "address": "{namespace}.{queue}.dead",
                "description": "`{namespace}.order.create.dead` and `{namespace}.payment.callback.dead`, \
                                through the direct exchange `{namespace}.dead`.",
                "parameters": {"namespace": namespace, "queue": {"enum": ["order.create", "payment.callback"]}},
                "messages": {"dead_letter": {"$ref": "#/components/messages/dead_letter"}},
            },
        },
        "operations": {
            "consumeOrders": {"action": "receive", "channel": {"$ref": "#/channels/orderCreate"},
                              "summary": "The engine's intake: one transaction per message (or per batch)."},
            "consumePayments": {"action": "receive", "channel": {"$ref": "#/channels/paymentCallback"}},
            "publishEvents": {"action": "send", "channel": {"$ref": "#/channels/events"}},
            "deadLetter": {"action": "send", "channel": {"$ref": "#/channels/deadLetters"}},
        },
        "components": {
            "messages": messages,
            "schemas": components,
        },
    });
    let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
    text.push('\n');
    text
}
