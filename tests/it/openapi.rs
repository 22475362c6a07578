//! The front stage's OpenAPI document (docs/contracts/front.openapi.json) checked by
//! an outside tool: Schemathesis (PyPI, installed by `scripts/services tools`)
//! sends generated requests, valid and invalid, to a running front stage and its
//! engine, as a buyer with a valid JWT and purchase token, and checks every answer
//! against the document: no 5xx, every status, header and body as documented,
//! invalid input refused, requests without credentials refused. A fixed seed and a
//! fixed number of examples per operation make the run the same each time.

use std::process::Command;

use figment::providers::Serialized;

use crate::common::engine::EngineHandle;
use crate::common::{builders, token, TestEnv};
use crate::front_client::Front;

/// The sale the generated reservations and token requests are aimed at (the other
/// operations get generated ids).
const ACTIVITY: i64 = 81;

/// What Schemathesis is run as: `python3 -m schemathesis.cli`, which the test
/// script installs (pinned) with the other tools.
fn schemathesis() -> Command {
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "schemathesis.cli"]);
    cmd
}

#[actix_rt::test]
async fn schemathesis_finds_the_front_stage_as_its_openapi_document_says() {
    let version = schemathesis()
        .arg("--version")
        .output()
        .expect("run python3");
    assert!(
        version.status.success(),
        "Schemathesis is not installed for python3 (scripts/services tools installs it): {}",
        String::from_utf8_lossy(&version.stderr)
    );
    // Limits far above what the run sends: what is checked is the contract, and a
    // 429 (documented) would only hide the answers behind it.
    let env = TestEnv::with(|f| {
        f.merge(Serialized::default(
            "frontstage.rate_limit.per_user_per_s",
            100_000,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_burst",
            100_000,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_address_per_s",
            100_000,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_address_burst",
            100_000,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_reads_per_s",
            100_000,
        ))
        .merge(Serialized::default(
            "frontstage.rate_limit.per_user_reads_burst",
            100_000,
        ))
        .merge(Serialized::default(
            "frontstage.purchase_token.max_per_user",
            100_000,
        ))
    })
    .await;
    let mut db = env.db().await;
    builders::activity(&mut db, ACTIVITY, 1, 50, 2).await;
    let keys =
        seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, ACTIVITY, 1);
    seckill_engine::redis::load_stock(
        &mut env.redis().await,
        &keys,
        &[25, 25],
        crate::common::sale_end(),
    )
    .await
    .unwrap();
    let engine = EngineHandle::start(&env.settings).await;
    let (front, handle) =
        Front::serve(&env.settings, engine.ids.clone(), engine.readiness.clone()).await;
    let buyer = 4242;
    let purchase = front.purchase_token(ACTIVITY, buyer).await;
    let jwt = token(&front.secret, buyer);
    let dir = tempfile_dir();
    let config = dir.join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            r#"
# Every check Schemathesis has, as `--checks all` would (a CLI option would
# override the per-operation setting below).
[checks]
enabled = true

[checks.positive_data_acceptance]
# A valid request may find the sale sold out or the buyer holding a reservation
# already (409), or another buyer's id (404): all documented, none an error.
expected-statuses = ["2xx", 404, 409]

[[operations]]
include-operation-id = ["reserve", "purchase_token_for"]
parameters = {{ activity_id = {ACTIVITY}, sku_id = 1 }}

# Schemathesis 4.32.5's coverage phase sends `X-Min-LSN: 0` (shorter than the
# header's documented minLength, and outside its pattern) as a schema-valid request
# and reports its 400 as a valid request refused. The check stays on for the other
# operations.
[[operations]]
include-operation-id = "my_orders"
checks.positive_data_acceptance.enabled = false
"#
        ),
    )
    .unwrap();
    let document = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/contracts/front.openapi.json"
    );
    let report = dir.join("report.xml");
    let mut run = schemathesis();
    run.arg("--config-file")
        .arg(&config)
        .args(["run", document, "--url", &front.base])
        .args([
            "--seed",
            "20261206",
            "--max-examples",
            "40",
            "--workers",
            "1",
        ])
        .args(["--no-color", "--report", "junit", "--report-junit-path"])
        .arg(&report)
        .args(["-H", &format!("Authorization: Bearer {jwt}")])
        .args(["-H", &format!("X-Purchase-Token: {purchase}")])
        .current_dir(&dir);
    let finished = actix_rt::task::spawn_blocking(move || run.output())
        .await
        .unwrap()
        .expect("run Schemathesis");
    let out = String::from_utf8_lossy(&finished.stdout);
    println!("{out}\n{}", String::from_utf8_lossy(&finished.stderr));
    assert!(
        finished.status.success(),
        "Schemathesis found answers the document does not describe (above)"
    );
    // It did exercise the sale: orders were made through the front stage.
    let orders = crate::common::count(&db, "SELECT count(*) FROM orders").await;
    assert!(orders >= 1, "no order was made by the generated requests");
    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of the test's own for the run's configuration and report.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("seckill-openapi-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What the front stage publishes matches the `order.create` schema of
/// docs/contracts/ (asyncapi.json), headers included, on the queue the shard
/// function names.
#[actix_rt::test]
async fn the_front_stage_publishes_order_create_messages_as_the_asyncapi_document_says() {
    use futures_util::StreamExt;
    use lapin::options::BasicConsumeOptions;
    let env = TestEnv::with(|f| {
        f.merge(Serialized::default(
            "amqp.order_signing_secret",
            "a-signing-secret-long-enough-for-the-test",
        ))
    })
    .await;
    let mut db = env.db().await;
    builders::activity(&mut db, 82, 1, 5, 1).await;
    let keys = seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, 82, 1);
    seckill_engine::redis::load_stock(
        &mut env.redis().await,
        &keys,
        &[5],
        crate::common::sale_end(),
    )
    .await
    .unwrap();
    // No engine: the message stays on its queue to be read here.
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    seckill_engine::mq::topology::declare_topology(&channel, &env.settings.amqp)
        .await
        .unwrap();
    let ids = std::sync::Arc::new(seckill_engine::domain::ids::IdGenerator::new(1082));
    let (front, handle) = Front::serve(&env.settings, ids, Default::default()).await;
    let (status, queued) = front.reserve(82, 7, uuid::Uuid::now_v7()).await;
    assert_eq!(status, 202, "{queued}");
    let shard = seckill_engine::domain::shard::shard_for(82, 1, 0, env.settings.amqp.shards);
    let queue = env.names.order_queue(shard);
    // A consumer, not basic.get: shard queues have a single active consumer.
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "contract-test".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let delivery = tokio::time::timeout(crate::common::HANG, consumer.next())
        .await
        .expect("the order message is on the queue the shard function names")
        .expect("a delivery")
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
    crate::common::contracts::assert_valid("order.create", &body);
    assert_eq!(body["order_id"], queued["order_id"]);
    // Its headers as the document states them: the signature and the publish time.
    let document: serde_json::Value =
        serde_json::from_str(&seckill_engine::contracts::asyncapi_document()).unwrap();
    let header_schema = &document["components"]["messages"]["order_create"]["headers"];
    let headers = delivery.properties.headers().clone().unwrap_or_default();
    let as_json: serde_json::Map<String, serde_json::Value> = headers
        .inner()
        .iter()
        .map(|(k, v)| {
            let v = match v {
                lapin::types::AMQPValue::LongString(s) => {
                    serde_json::json!(String::from_utf8_lossy(s.as_bytes()))
                }
                lapin::types::AMQPValue::LongLongInt(n) => serde_json::json!(n),
                lapin::types::AMQPValue::LongInt(n) => serde_json::json!(n),
                other => serde_json::json!(format!("{other:?}")),
            };
            (k.to_string(), v)
        })
        .collect();
    assert!(
        as_json.contains_key(seckill_engine::domain::signature::SIGNATURE_HEADER),
        "signed: {as_json:?}"
    );
    let validator = jsonschema::validator_for(header_schema).unwrap();
    let headers = serde_json::Value::Object(as_json);
    assert!(
        validator.is_valid(&headers),
        "headers {headers:#} do not match {header_schema:#}"
    );
    handle.stop(true).await;
    env.cleanup().await;
}
