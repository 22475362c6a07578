//! The machine-readable contracts under docs/contracts/ are the ones the code
//! generates: the OpenAPI documents of the two listeners and the AsyncAPI document
//! of the messages with their JSON Schemas. A change to a handler, a body type or a
//! message changes the generated text, and this test fails until the committed
//! copy is regenerated (`SECKILL_BLESS=1 cargo test --test contracts`) and
//! reviewed with the change.
//!
//! Pure generation and validation: no services needed.

use std::path::Path;

fn check(file: &str, generated: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/contracts")
        .join(file);
    if std::env::var_os("SECKILL_BLESS").is_some() {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/contracts/{file} is not what the code generates (first difference at line {}):\n\
             committed: {:?}\ngenerated: {:?}\n\
             regenerate it with `SECKILL_BLESS=1 cargo test --test contracts` and commit it",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end>"),
            generated.lines().nth(line).unwrap_or("<end>"),
        );
    }
}

#[test]
fn the_front_stage_openapi_document_is_the_generated_one() {
    check(
        "front.openapi.json",
        &seckill_engine::http::front::openapi_document(),
    );
}

#[test]
fn the_admin_openapi_document_is_the_generated_one() {
    check(
        "admin.openapi.json",
        &seckill_engine::http::admin::openapi_document(),
    );
}

#[test]
fn the_asyncapi_document_and_message_schemas_are_the_generated_ones() {
    check(
        "asyncapi.json",
        &seckill_engine::contracts::asyncapi_document(),
    );
    for m in seckill_engine::contracts::message_schemas() {
        let mut text = serde_json::to_string_pretty(&m.schema).unwrap();
        text.push('\n');
        check(&format!("schemas/{}", m.file), &text);
    }
}

/// A body the intake is given, what the schema says of it, and what the intake
/// does: the two agree, except where a rule is beyond what JSON Schema states
/// (listed, and said in the schema's description).
struct Fixture {
    what: &'static str,
    body: serde_json::Value,
    /// Beyond the schema: it passes the schema and the intake refuses it.
    semantic: bool,
}

fn order_fixtures() -> Vec<Fixture> {
    use seckill_engine::domain::message::OrderCreateMessage;
    let now = chrono::Utc::now();
    let good = serde_json::to_value(OrderCreateMessage::pre_reserved(
        7_000_001,
        (1, 2, 3),
        4,
        now,
        now + chrono::TimeDelta::minutes(15),
    ))
    .unwrap();
    let with = |what: &'static str, semantic: bool, f: &dyn Fn(&mut serde_json::Value)| {
        let mut body = good.clone();
        f(&mut body);
        Fixture {
            what,
            body,
            semantic,
        }
    };
    use serde_json::json;
    vec![
        with("as the front stage sends it", false, &|_| {}),
        with(
            "without schema_version (a version 1 producer)",
            false,
            &|b| {
                b.as_object_mut().unwrap().remove("schema_version");
            },
        ),
        with("schema_version 2", false, &|b| {
            b["schema_version"] = json!(2)
        }),
        with("an unknown field", false, &|b| b["coupon"] = json!("X")),
        with("no message_id", false, &|b| {
            b.as_object_mut().unwrap().remove("message_id");
        }),
        with("order_id as a string", false, &|b| {
            b["order_id"] = json!("7000001")
        }),
        with("user_id 0", false, &|b| b["user_id"] = json!(0)),
        with("bucket 256", false, &|b| b["inventory_bucket"] = json!(256)),
        with("bucket -1", false, &|b| b["inventory_bucket"] = json!(-1)),
        with("a negative price", false, &|b| b["unit_price"] = json!(-1)),
        with("currency cny", false, &|b| b["currency"] = json!("cny")),
        with("an order_no of 41 characters", false, &|b| {
            b["order_no"] = json!("x".repeat(41))
        }),
        with("reserved_at not a time", false, &|b| {
            b["reserved_at"] = json!("yesterday")
        }),
        with("ttl 0", false, &|b| b["reservation_ttl_ms"] = json!(0)),
        with("the nil message_id", true, &|b| {
            b["message_id"] = json!(uuid::Uuid::nil())
        }),
        with("order_expire_at before reserved_at", true, &|b| {
            b["order_expire_at"] = json!(now - chrono::TimeDelta::minutes(1))
        }),
    ]
}

fn payment_fixtures() -> Vec<Fixture> {
    use serde_json::json;
    let good = json!({
        "schema_version": 1,
        "payment_id": uuid::Uuid::now_v7(),
        "payment_request_id": uuid::Uuid::now_v7(),
        "order_id": 7_000_001,
        "provider": "alipay",
        "provider_trade_no": "T-1",
        "callback_id": "cb-1",
        "amount": 9900,
        "currency": "CNY",
        "paid_at": chrono::Utc::now(),
        "raw": {"anything": ["the provider sent"]},
    });
    let with = |what: &'static str, semantic: bool, f: &dyn Fn(&mut serde_json::Value)| {
        let mut body = good.clone();
        f(&mut body);
        Fixture {
            what,
            body,
            semantic,
        }
    };
    vec![
        with("as a provider sends it", false, &|_| {}),
        with("without raw", false, &|b| {
            b.as_object_mut().unwrap().remove("raw");
        }),
        with("schema_version 2", false, &|b| {
            b["schema_version"] = json!(2)
        }),
        with("an unknown field", false, &|b| b["tip"] = json!(1)),
        with("no callback_id", false, &|b| {
            b.as_object_mut().unwrap().remove("callback_id");
        }),
        with("an empty provider", false, &|b| b["provider"] = json!("")),
        with("a negative amount", false, &|b| b["amount"] = json!(-5)),
        with("order_id 0", false, &|b| b["order_id"] = json!(0)),
        with("the nil payment_id", true, &|b| {
            b["payment_id"] = json!(uuid::Uuid::nil())
        }),
    ]
}

/// Every fixture the intake accepts matches the schema, and every one it refuses
/// for its shape, type, range or version is refused by the schema too; the rules
/// beyond the schema are the listed ones.
#[test]
fn the_schemas_accept_what_the_intake_accepts_and_refuse_what_it_refuses() {
    use seckill_engine::domain::message::OrderCreateMessage;
    use seckill_engine::domain::payment::PaymentCallback;
    let validators = seckill_testkit::contracts::validators();
    type Decodes = fn(&[u8]) -> bool;
    let cases: [(&str, Vec<Fixture>, Decodes); 2] = [
        ("order.create", order_fixtures(), |b| {
            OrderCreateMessage::decode(b).is_ok()
        }),
        ("payment.callback", payment_fixtures(), |b| {
            PaymentCallback::decode(b).is_ok()
        }),
    ];
    for (name, fixtures, decodes) in cases {
        let schema = &validators[name];
        for f in fixtures {
            let valid = schema.is_valid(&f.body);
            let accepted = decodes(&serde_json::to_vec(&f.body).unwrap());
            if f.semantic {
                assert!(
                    valid && !accepted,
                    "{name}, {}: beyond the schema (schema {valid}, intake {accepted})",
                    f.what
                );
            } else {
                assert_eq!(
                    valid, accepted,
                    "{name}, {}: the schema says {valid}, the intake {accepted}",
                    f.what
                );
            }
        }
    }
}

/// The AsyncAPI document is a valid AsyncAPI 3.0.0 document: checked against the
/// specification's own JSON Schema (tests/data/asyncapi-3.0.0.schema.json, from
/// the npm package @asyncapi/specs 6.11.1, Apache-2.0, `3.0.0-without-$id.json`).
#[test]
fn the_asyncapi_document_is_valid_asyncapi_3() {
    let spec: serde_json::Value =
        serde_json::from_str(include_str!("data/asyncapi-3.0.0.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&spec).unwrap();
    let document: serde_json::Value =
        serde_json::from_str(&seckill_engine::contracts::asyncapi_document()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&document)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "not valid AsyncAPI 3.0.0: {errors:#?}");
    // The validator does refuse a document that is not one.
    let mut broken = document.clone();
    broken["operations"]["consumeOrders"]["action"] = serde_json::json!("consume");
    assert!(!validator.is_valid(&broken));
}
