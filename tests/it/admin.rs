//! The operator API on the admin listener: the token, pause and resume, dead-letter
//! replay, DEAD outbox retry and the compensation review list.

use std::time::Duration;

use actix_web::dev::ServerHandle;
use awc::http::StatusCode;
use figment::providers::Serialized;
use seckill_engine::config::Settings;
use serde_json::{json, Value};

use crate::common::builders::{self, order};
use crate::common::engine::EngineHandle;
use crate::common::{assert_invariants, consumers, count, settle, wait_until, TestEnv};

const TOKEN: &str = "test-admin-token-0123456789";

/// A client for one admin listener.
struct AdminClient {
    base: String,
    client: awc::Client,
}

impl AdminClient {
    fn new(addr: std::net::SocketAddr) -> Self {
        Self {
            base: format!("http://{addr}"),
            client: awc::Client::builder()
                .timeout(Duration::from_secs(30))
                .finish(),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let url = format!("{}{path}", self.base);
        let mut req = match method {
            "GET" => self.client.get(url),
            _ => self.client.post(url),
        };
        if let Some(token) = token {
            req = req.insert_header(("Authorization", format!("Bearer {token}")));
        }
        req = req.insert_header(("X-Seckill-Operator", "integration-test"));
        let mut resp = match body {
            Some(body) => req.send_json(&body).await,
            None => req.send().await,
        }
        .expect("admin request");
        let status = resp.status();
        let bytes = resp.body().await.expect("admin body");
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, value)
    }

    async fn get(&self, path: &str) -> Value {
        let (status, body) = self.call("GET", path, Some(TOKEN), None).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let (status, body) = self.call("POST", path, Some(TOKEN), Some(body)).await;
        assert_eq!(status, StatusCode::OK, "POST {path}: {body}");
        body
    }
}

/// An engine and its admin listener, served from the test's runtime.
async fn start(settings: &Settings) -> (EngineHandle, ServerHandle, AdminClient) {
    let engine = EngineHandle::start(settings).await;
    let (handle, api) = listen(&engine, settings).await;
    (engine, handle, api)
}

async fn listen(engine: &EngineHandle, settings: &Settings) -> (ServerHandle, AdminClient) {
    let admin = engine.admin(settings).await;
    let handle = admin.server.handle();
    actix_rt::spawn(admin.server);
    (handle, AdminClient::new(admin.addr))
}

fn with_token(f: figment::Figment) -> figment::Figment {
    f.merge(Serialized::default("admin.token", TOKEN))
}

#[actix_rt::test]
async fn admin_api_is_off_without_a_token_and_refuses_requests_without_it() {
    let env = TestEnv::new().await;
    let (engine, handle, off) = start(&env.settings).await;
    let (status, body) = off.call("GET", "/admin/dlq", Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no token configured: off");
    assert!(body["error"].as_str().is_some(), "{body}");
    // A path (or method) the listener does not have: its JSON error, not an empty
    // body.
    for (method, path) in [("GET", "/nope"), ("POST", "/livez")] {
        let (status, body) = off.call(method, path, None, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("openapi.json")),
            "{method} {path}: {body}"
        );
    }
    handle.stop(true).await;

    let mut settings = env.settings.clone();
    settings.admin.token = Some(TOKEN.to_owned().into());
    let (handle, api) = listen(&engine, &settings).await;
    for (method, path) in [
        ("GET", "/admin/dlq"),
        ("POST", "/admin/dlq/replay"),
        ("POST", "/admin/intake/pause"),
        ("GET", "/admin/outbox"),
        ("POST", "/admin/outbox/dead/retry"),
        ("GET", "/admin/compensation/review"),
    ] {
        let body = (method == "POST").then(|| json!({"all": true}));
        let (status, _) = api.call(method, path, None, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path} without a token"
        );
        let (status, _) = api
            .call(method, path, Some("test-admin-token-0123456780"), body)
            .await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path} with a wrong token"
        );
    }
    assert!(
        !engine.readiness.is_paused(),
        "a refused pause changed nothing"
    );
    // The token is checked before the body is read: a body that is not even JSON
    // gets 401 without it, and 400 only with it.
    for path in ["/admin/dlq/replay", "/admin/outbox/dead/retry"] {
        let garbled = |token: Option<&str>| {
            let mut req = api
                .client
                .post(format!("{}{path}", api.base))
                .insert_header(("content-type", "application/json"));
            if let Some(token) = token {
                req = req.insert_header(("Authorization", format!("Bearer {token}")));
            }
            async move { req.send_body("{not json").await.unwrap().status() }
        };
        assert_eq!(garbled(None).await, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(
            garbled(Some(TOKEN)).await,
            StatusCode::BAD_REQUEST,
            "{path}"
        );
    }
    // Probes stay open: they are for the orchestrator, not for operators; so are the
    // metrics until admin.metrics_token is set.
    let (status, _) = api.call("GET", "/livez", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.call("GET", "/metrics", None, None).await;
    assert_ne!(status, StatusCode::UNAUTHORIZED);
    handle.stop(true).await;

    const METRICS_TOKEN: &str = "test-metrics-token-0123456789";
    settings.admin.metrics_token = Some(METRICS_TOKEN.to_owned().into());
    let (handle, api) = listen(&engine, &settings).await;
    let (status, _) = api.call("GET", "/metrics", None, None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "/metrics without its token"
    );
    let (status, _) = api.call("GET", "/metrics", Some(TOKEN), None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the admin token is not the metrics token"
    );
    let (status, _) = api.call("GET", "/metrics", Some(METRICS_TOKEN), None).await;
    assert_ne!(status, StatusCode::UNAUTHORIZED, "/metrics with its token");
    let (status, _) = api.call("GET", "/readyz", None, None).await;
    assert_ne!(status, StatusCode::UNAUTHORIZED, "probes stay open");
    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn a_replayed_dead_letter_makes_its_order_once_and_a_second_replay_nothing_more() {
    let env = TestEnv::with(with_token).await;
    let mut db = env.db().await;
    let (engine, handle, api) = start(&env.settings).await;
    let amqp = env.amqp().await;

    // The message arrives before its activity exists (a front stage ahead of the
    // configuration): it cannot be processed and is dead-lettered, twice, because
    // the broker delivered it twice.
    let msg = order(31, 1, 7, 0);
    builders::publish(&env, &amqp, &[msg.clone(), msg.clone()]).await;
    let channel = amqp.create_channel().await.unwrap();
    let dead_queue = env.names.order_dead_queue();
    assert!(
        env.wait_ready_count(&channel, &dead_queue, 2).await,
        "both copies reach the dead-letter queue"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 0);

    let listed = api.get("/admin/dlq").await;
    let messages = listed["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{listed}");
    for m in messages {
        assert_eq!(m["message_id"], json!(msg.message_id.to_string()));
        assert_eq!(m["origin_queue"], json!(env.names.order_queue(0)));
        assert_eq!(m["dead_queue"], json!(dead_queue));
        assert!(m["kind"].as_str().is_some_and(|k| !k.is_empty()), "{m}");
        assert!(
            m["reason"]
                .as_str()
                .is_some_and(|r| r.contains("unknown inventory bucket")),
            "{m}"
        );
    }
    // Listing takes nothing away: closing its channel hands both back, which a
    // quorum queue applies a moment after the close (not before the listing answers).
    assert!(
        env.wait_ready_count(&channel, &dead_queue, 2).await,
        "both copies are back in the dead-letter queue after the listing"
    );

    // Fix the cause, then replay every copy of that message id.
    builders::activity(&mut db, 31, 1, 5, 1).await;
    let report = api
        .post(
            "/admin/dlq/replay",
            json!({"message_id": msg.message_id.to_string()}),
        )
        .await;
    assert_eq!(report["replayed"], json!(2), "{report}");
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM consumer_inbox").await == 1
                && engine.stats.in_flight() == 0
                && env.ready_count(&channel, &env.names.order_queue(0)).await == 0
        })
        .await,
        "the replayed copies settle"
    );
    assert_eq!(env.ready_count(&channel, &dead_queue).await, 0);
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders WHERE user_id = 7").await,
        1,
        "two replayed copies, one order"
    );
    let inbox_id: uuid::Uuid = db
        .query_one("SELECT message_id FROM consumer_inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(inbox_id, msg.message_id, "the replay kept the message id");

    // A second replay finds nothing and changes nothing.
    let again = api.post("/admin/dlq/replay", json!({"all": true})).await;
    assert_eq!(again["replayed"], json!(0), "{again}");
    // On purpose: a moment in which a wrongly replayed copy would have been taken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(count(&db, "SELECT count(*) FROM consumer_inbox").await, 1);
    assert_invariants(&db).await;

    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

/// Retention deletes inbox rows older than `retention.inbox_secs`: a dead letter
/// first published longer ago could already have had its effect with nothing left
/// to dedup it, so a replay leaves it in place and says why, unless forced.
#[actix_rt::test]
async fn a_replay_refuses_a_dead_letter_older_than_the_inbox_window_unless_forced() {
    let env =
        TestEnv::with(|f| with_token(f).merge(Serialized::default("retention.inbox_secs", 60)))
            .await;
    let mut db = env.db().await;
    let (engine, handle, api) = start(&env.settings).await;
    let amqp = env.amqp().await;

    // Published two minutes ago (by its header), before its activity exists: it is
    // dead-lettered.
    let msg = order(33, 1, 7, 0);
    let mut props = seckill_engine::mq::message_properties(&msg.message_id.to_string());
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        seckill_engine::mq::PUBLISHED_AT_HEADER.into(),
        lapin::types::AMQPValue::LongLongInt(seckill_engine::mq::unix_millis() - 120_000),
    );
    props = props.with_headers(headers);
    let publisher = seckill_engine::mq::publisher::ConfirmedPublisher::open(&amqp)
        .await
        .unwrap();
    let shard = seckill_engine::domain::shard::shard_for(33, 1, 0, env.settings.amqp.shards);
    publisher
        .publish(
            &env.names.orders_exchange(),
            &seckill_engine::mq::topology::Names::order_routing_key(shard),
            &serde_json::to_vec(&msg).unwrap(),
            props,
        )
        .await
        .unwrap();
    let channel = amqp.create_channel().await.unwrap();
    let dead_queue = env.names.order_dead_queue();
    assert!(env.wait_ready_count(&channel, &dead_queue, 1).await);
    builders::activity(&mut db, 33, 1, 5, 1).await;

    let listed = api.get("/admin/dlq").await;
    let first = listed["messages"][0]["first_published_ms"].as_i64();
    assert!(
        first.is_some(),
        "the listing shows the publication time: {listed}"
    );

    let refused = api
        .post(
            "/admin/dlq/replay",
            json!({"message_id": msg.message_id.to_string()}),
        )
        .await;
    assert_eq!(refused["replayed"], json!(0), "{refused}");
    assert_eq!(refused["refused"], json!(1), "{refused}");
    let reason = refused["refusals"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("retention.inbox_secs") && reason.contains("force"),
        "the refusal says why and how to override: {refused}"
    );
    assert!(
        env.wait_ready_count(&channel, &dead_queue, 1).await,
        "the refused message stays in the dead-letter queue"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 0);

    let forced = api
        .post(
            "/admin/dlq/replay",
            json!({"message_id": msg.message_id.to_string(), "force": true}),
        )
        .await;
    assert_eq!(forced["replayed"], json!(1), "{forced}");
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM orders WHERE user_id = 7").await == 1
        })
        .await,
        "the forced replay makes its order"
    );
    assert_eq!(env.ready_count(&channel, &dead_queue).await, 0);
    assert_invariants(&db).await;

    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn pause_stops_consumption_and_resume_takes_the_backlog() {
    let env = TestEnv::with(with_token).await;
    let mut db = env.db().await;
    builders::activity(&mut db, 32, 1, 100, 1).await;
    let (engine, handle, api) = start(&env.settings).await;
    let amqp = env.amqp().await;
    let queue = env.names.order_queue(0);

    let paused = api.post("/admin/intake/pause", json!({})).await;
    assert_eq!(paused["was_paused"], json!(false));
    assert!(
        wait_until(settle(), || async {
            consumers(&amqp, &queue).await == Some(0)
        })
        .await,
        "the consumer was cancelled"
    );
    let (status, body) = api.call("GET", "/readyz", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["checks"]["intake"], json!("paused by an operator"));
    assert_eq!(body["ready"], json!(false));
    assert_eq!(body["checks"]["postgres"], json!("ok"));

    let msgs: Vec<_> = (1..=30).map(|user| order(32, 1, user, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    let channel = amqp.create_channel().await.unwrap();
    // On purpose: a moment in which a consumer that survived the pause would take them.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        env.ready_count(&channel, &queue).await,
        30,
        "nothing taken while paused"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM consumer_inbox").await, 0);
    assert_eq!(api.get("/admin/intake").await["paused"], json!(true));

    api.post("/admin/intake/resume", json!({})).await;
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM orders").await == 30
        })
        .await,
        "the backlog is taken after resume"
    );
    let (status, _) = api.call("GET", "/readyz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_invariants(&db).await;
    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn dead_outbox_rows_are_listed_and_retried_and_review_tasks_listed() {
    let env = TestEnv::with(with_token).await;
    let mut db = env.db().await;
    builders::activity(&mut db, 33, 1, 10, 1).await;
    let (engine, handle, api) = start(&env.settings).await;
    let amqp = env.amqp().await;

    let msgs: Vec<_> = (1..=3).map(|user| order(33, 1, user, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM event_outbox WHERE status = 20").await == 3
        })
        .await,
        "the order events are sent"
    );
    // Two rows gave up (as after a long broker outage), one task needs a person.
    db.execute(
        "UPDATE event_outbox SET status = 40, retry_count = max_retry,
             last_error = 'broker unreachable', sent_at = NULL
         WHERE event_id IN (SELECT event_id FROM event_outbox ORDER BY event_id LIMIT 2)",
        &[],
    )
    .await
    .unwrap();
    db.execute(
        "INSERT INTO compensation_task (task_id, idempotency_key, task_type, order_id,
                                        payload, status, last_error)
         VALUES (gen_random_uuid(), 'review-1', 20, 1, '{}', 50, 'refund refused')",
        &[],
    )
    .await
    .unwrap();

    let summary = api.get("/admin/outbox").await;
    let statuses = summary["statuses"].as_array().unwrap();
    let of = |name: &str| {
        statuses
            .iter()
            .find(|s| s["status"] == json!(name))
            .map_or(0, |s| s["count"].as_i64().unwrap())
    };
    assert_eq!((of("DEAD"), of("SENT")), (2, 1), "{summary}");
    let dead = api.get("/admin/outbox/dead").await;
    let dead = dead["dead"].as_array().unwrap().clone();
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0]["last_error"], json!("broker unreachable"));

    let one = dead[0]["event_id"].as_str().unwrap().to_owned();
    let retried = api
        .post("/admin/outbox/dead/retry", json!({"event_id": one}))
        .await;
    assert_eq!(retried["retried"], json!(1));
    let (status, _) = api
        .call(
            "POST",
            "/admin/outbox/dead/retry",
            Some(TOKEN),
            Some(json!({"event_id": one, "all": true})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "ambiguous selection refused"
    );
    assert_eq!(
        api.post("/admin/outbox/dead/retry", json!({"all": true}))
            .await["retried"],
        json!(1)
    );
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM event_outbox WHERE status = 20").await == 3
        })
        .await,
        "the retried rows are published"
    );

    let review = api.get("/admin/compensation/review").await;
    let tasks = review["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{review}");
    assert_eq!(tasks[0]["status"], json!("MANUAL_REVIEW"));
    assert_eq!(tasks[0]["last_error"], json!("refund refused"));

    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

/// `POST /admin/maintain` vacuums after a sale, refuses a live one without
/// `"force": true` and an unknown activity, and needs the token (issue 35 pt 5).
#[actix_rt::test]
async fn maintain_over_the_operator_api_refuses_a_live_sale_and_vacuums_after_it() {
    let env = TestEnv::with(with_token).await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 35, 1, 5, 1).await;
    let (engine, handle, api) = start(&env.settings).await;
    let (status, _) = api
        .call(
            "POST",
            "/admin/maintain",
            None,
            Some(json!({"activity_id": 35})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = api
        .call(
            "POST",
            "/admin/maintain",
            Some(TOKEN),
            Some(json!({"activity_id": 35})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = api
        .call(
            "POST",
            "/admin/maintain",
            Some(TOKEN),
            Some(json!({"activity_id": 999})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    seckill_engine::store::activity::close_activity(&db, 35)
        .await
        .unwrap();
    let body = api
        .post("/admin/maintain", json!({"activity_id": 35}))
        .await;
    let tables = body["tables"].as_array().unwrap();
    assert!(
        tables.iter().any(|t| t["table"] == "sku_inventory"),
        "{body}"
    );
    let vacuumed = crate::common::count(
        &db,
        "SELECT count(*) FROM pg_stat_user_tables
         WHERE relname = 'orders' AND last_vacuum IS NOT NULL AND last_analyze IS NOT NULL",
    )
    .await;
    assert_eq!(vacuumed, 1);
    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn admin_answers_are_never_framed_and_the_live_page_runs_only_its_own_script() {
    let env = TestEnv::with(with_token).await;
    let (engine, handle, api) = start(&env.settings).await;
    let mut nonces = Vec::new();
    for path in ["/", "/", "/readyz", "/livez", "/admin/dlq"] {
        let resp = api
            .client
            .get(format!("{}{path}", api.base))
            .send()
            .await
            .expect("admin request");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        let csp = header("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        if path == "/" {
            let nonce = csp
                .split("script-src 'nonce-")
                .nth(1)
                .and_then(|rest| rest.split('\'').next())
                .unwrap_or_else(|| panic!("the live page names its script's nonce: {csp}"))
                .to_owned();
            assert!(nonce.len() >= 32, "{nonce}");
            nonces.push(nonce);
        } else {
            assert!(csp.starts_with("default-src 'none'"), "{path}: {csp}");
        }
    }
    assert_ne!(nonces[0], nonces[1], "a fresh nonce per answer");
    // A rebinding page's requests carry its own name: refused.
    let rebound = api
        .client
        .get(format!("{}/status", api.base))
        .insert_header(("host", "attacker.example:9090"))
        .send()
        .await
        .expect("admin request");
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);
    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

/// Publishes `body` straight into the order dead-letter queue with `headers`, as a
/// user with write on the default exchange could.
async fn forge_dead_letter(
    env: &TestEnv,
    amqp: &lapin::Connection,
    message_id: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) {
    use lapin::types::{AMQPValue, FieldTable};
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert((*name).into(), AMQPValue::LongString((*value).into()));
    }
    // Published just now, so the replay's inbox-window check lets it through.
    table.insert(
        seckill_engine::mq::PUBLISHED_AT_HEADER.into(),
        AMQPValue::LongLongInt(chrono::Utc::now().timestamp_millis()),
    );
    let properties = seckill_engine::mq::message_properties(message_id).with_headers(table);
    seckill_engine::mq::publisher::ConfirmedPublisher::open(amqp)
        .await
        .expect("publisher")
        .publish("", &env.names.order_dead_queue(), body, properties)
        .await
        .expect("published to the dead-letter queue");
}

/// A replay sends a message where the project routes it, whatever a header says, and
/// looks at each message once: one that fails again waits for the next replay
/// instead of looping.
#[actix_rt::test]
async fn a_replay_sends_where_the_project_routes_and_takes_each_message_once() {
    let env = TestEnv::with(with_token).await;
    let mut db = env.db().await;
    let (engine, handle, api) = start(&env.settings).await;
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let dead_queue = env.names.order_dead_queue();

    // No activity 41: the engine dead-letters this message every time it comes.
    let poison_loop = order(41, 1, 7, 0);
    builders::publish(&env, &amqp, std::slice::from_ref(&poison_loop)).await;
    assert!(env.wait_ready_count(&channel, &dead_queue, 1).await);
    for round in 0..2 {
        let report = api.post("/admin/dlq/replay", json!({"all": true})).await;
        assert_eq!(report["replayed"], json!(1), "round {round}: {report}");
        assert_eq!(
            report["replayed_ids"],
            json!([poison_loop.message_id.to_string()]),
            "{report}"
        );
        assert!(
            env.wait_ready_count(&channel, &dead_queue, 1).await,
            "round {round}: dead-lettered again, once"
        );
    }

    // A header naming another queue is not where a replay sends the message.
    builders::activity(&mut db, 42, 1, 5, 1).await;
    let forged = order(42, 1, 8, 0);
    let origin = env
        .names
        .order_queue(seckill_engine::domain::shard::shard_for(
            42,
            1,
            0,
            env.settings.amqp.shards,
        ));
    forge_dead_letter(
        &env,
        &amqp,
        &forged.message_id.to_string(),
        &serde_json::to_vec(&forged).unwrap(),
        &[("x-seckill-dead-queue", &env.names.payment_queue())],
    )
    .await;
    // A body no queue would take stays, whatever queue its header names.
    forge_dead_letter(
        &env,
        &amqp,
        "not-an-order",
        b"{not json",
        &[("x-seckill-dead-queue", &env.names.order_queue(0))],
    )
    .await;
    let report = api
        .post(
            "/admin/dlq/replay",
            json!({"message_id": forged.message_id.to_string()}),
        )
        .await;
    assert_eq!(
        report["replayed_to"],
        json!({ origin.clone(): 1 }),
        "{report}"
    );
    let report = api
        .post("/admin/dlq/replay", json!({"message_id": "not-an-order"}))
        .await;
    assert_eq!(report["replayed"], json!(0), "{report}");
    assert_eq!(report["without_origin"], json!(1), "{report}");
    assert!(
        report["refusals"][0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not an order.create message")),
        "{report}"
    );
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM orders WHERE user_id = 8").await == 1
        })
        .await,
        "the forged-header message made its order through its own shard queue"
    );
    assert_eq!(
        env.ready_count(&channel, &env.names.payment_queue()).await,
        0
    );
    assert!(
        env.wait_ready_count(&channel, &dead_queue, 2).await,
        "the looping order and the poison body stay dead-lettered"
    );
    handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}
