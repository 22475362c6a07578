//! Messages checked against the JSON Schemas the engine generates
//! (`seckill_engine::contracts`, committed under docs/contracts/): what a test's
//! engine wrote to its outbox and what its front stage published.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::Client;

/// A validator per message name (`order.create`, `order.created`, ...).
pub fn validators() -> BTreeMap<&'static str, jsonschema::Validator> {
    seckill_engine::contracts::message_schemas()
        .into_iter()
        .map(|m| {
            // Formats (`uuid`, `date-time`) asserted, as the intake asserts them: in
            // draft 2020-12 they are annotations unless a validator is asked to.
            let validator = jsonschema::options()
                .should_validate_formats(true)
                .build(&m.schema)
                .unwrap_or_else(|e| panic!("the schema of {} does not compile: {e}", m.name));
            (m.name, validator)
        })
        .collect()
}

/// Panics, saying where, unless `value` is a valid `name` message.
pub fn assert_valid(name: &str, value: &serde_json::Value) {
    let validators = validators();
    let validator = validators
        .get(name)
        .unwrap_or_else(|| panic!("no schema for {name}"));
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "a {name} message does not match docs/contracts/schemas: {errors:#?}\n{value:#}"
    );
}

/// Every event in the database's outbox (and its history) and every refund request
/// the compensation worker will publish, checked against its schema; the names of
/// the events seen.
pub async fn assert_events_match_contracts(db: &Client) -> BTreeSet<String> {
    let rows = db
        .query(
            "SELECT tag, payload FROM event_outbox
             UNION ALL SELECT tag, payload FROM event_outbox_history
             UNION ALL SELECT 'PAYMENT_REFUND_REQUESTED', payload FROM compensation_task
                       WHERE task_type = 20",
            &[],
        )
        .await
        .expect("read the outbox");
    let mut seen = BTreeSet::new();
    for row in rows {
        let tag: Option<String> = row.get(0);
        let payload: serde_json::Value = row.get(1);
        let tag = tag.expect("every event has a tag");
        let name = seckill_engine::store::outbox::routing_key(&tag);
        assert_valid(&name, &payload);
        seen.insert(name);
    }
    seen
}
