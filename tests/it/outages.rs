//! Losing a server other than PostgreSQL (issue 48): the engine makes orders from
//! PostgreSQL alone, so a Redis outage stops the front stage's reservations and
//! nothing else.

use std::time::{Duration, Instant};

use crate::common::builders;
use crate::common::engine::EngineHandle;
use crate::common::{count, wait_for, PrivateRedis, Sale};

/// Redis down for up to 20 s while 2,000 reserved messages wait in the queue: every
/// one becomes an order during the outage, the engine stays ready and names Redis,
/// and nothing waits for Redis to come back.
#[actix_rt::test]
async fn every_queued_order_is_made_while_redis_is_down() {
    let mut private = PrivateRedis::start().await;
    let (env, db) = Sale::new()
        .set("redis.url", private.url())
        .activity(4801, 2_000, 8)
        .open()
        .await;
    let engine = EngineHandle::start(&env.settings).await;
    private.stop().await;
    let outage = Instant::now();
    // Publish only once the readiness monitor has found Redis down: from then on,
    // an engine that waited for Redis would take nothing.
    wait_for(
        Duration::from_secs(5),
        "the monitor to find Redis down",
        || async { engine.readiness.checks().redis.is_some() },
    )
    .await;
    let msgs: Vec<_> = (1..=2_000)
        .map(|user| builders::order(4801, 1, user, (user % 8) as i16))
        .collect();
    let amqp = env.amqp().await;
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(
        Duration::from_secs(20),
        "2,000 orders with Redis down",
        || async { count(&db, "SELECT count(*) FROM orders").await == 2_000 },
    )
    .await;
    let took = outage.elapsed();
    let checks = engine.readiness.checks();
    assert!(checks.redis.is_some(), "Redis came back early: {checks:?}");
    assert!(engine.readiness.is_ready(), "{checks:?}");
    assert!(
        took < Duration::from_secs(20),
        "the orders took {took:?}, longer than the outage"
    );
    private.run().await;
    let _ = amqp.close(200, "done".into()).await;
    engine.stop().await;
    crate::common::assert_invariants(&db).await;
    env.cleanup().await;
}

/// Issue 49, "one failure cannot travel": Redis gone silent (a network black hole:
/// no reset, no answer) under a front stage that buyers keep calling. Their
/// purchase-token requests wait on Redis and fail on its timeout, while the
/// engine's intakes make every queued order and `/readyz` answers within a second
/// each time, PostgreSQL and the broker "ok" (the front stage's own check says its
/// buyers cannot be served).
#[actix_rt::test]
async fn a_silent_redis_under_the_front_stage_stops_neither_orders_nor_readiness() {
    let redis_url = crate::common::base_settings().redis.url;
    let switch = crate::common::Switch::start(crate::common::target_of(
        secrecy::ExposeSecret::expose_secret(&redis_url),
        6379,
    ))
    .await;
    let (env, db) = Sale::new()
        .set(
            "redis.url",
            switch.url_through(secrecy::ExposeSecret::expose_secret(&redis_url)),
        )
        .set("frontstage.rate_limit.per_address_per_s", 0)
        .activity(4902, 600, 4)
        .open()
        .await;
    let engine = EngineHandle::start(&env.settings).await;
    let admin = engine.admin(&env.settings).await;
    let admin_handle = admin.server.handle();
    actix_rt::spawn(admin.server);
    let (front, front_handle) = crate::front_client::Front::serve(
        &env.settings,
        engine.ids.clone(),
        engine.readiness.clone(),
    )
    .await;
    switch.black_hole();

    // Buyers at the door the whole time, each waiting on Redis.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let buyers = {
        let stop = stop.clone();
        let front = &front;
        async move {
            let mut answered = 0_u32;
            let mut user = 10_000;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let path = "/v1/activities/4902/skus/1/purchase-token";
                let batch = futures_util::future::join_all(
                    (0..50).map(|i| front.get(path, Some(user + i))),
                )
                .await;
                assert!(batch.iter().all(|(status, _)| *status != 200), "{batch:?}");
                answered += batch.len() as u32;
                user += 50;
            }
            answered
        }
    };
    // Meanwhile: queued orders, and readiness probed every 250 ms.
    let work = async {
        let msgs: Vec<_> = (1..=600)
            .map(|user| builders::order(4902, 1, user, (user % 4) as i16))
            .collect();
        let amqp = env.amqp().await;
        builders::publish(&env, &amqp, &msgs).await;
        let client = awc::Client::default();
        let readyz = format!("http://{}/readyz", admin.addr);
        let started = Instant::now();
        let mut slowest = Duration::ZERO;
        let made = loop {
            let asked = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(1), async {
                let mut res = client.get(&readyz).send().await.ok()?;
                res.json::<serde_json::Value>().await.ok()
            })
            .await;
            let took = asked.elapsed();
            slowest = slowest.max(took);
            let Ok(Some(body)) = answer else {
                panic!("/readyz did not answer within 1 s ({took:?})");
            };
            assert_eq!(body["checks"]["postgres"], "ok", "{body}");
            assert_eq!(body["checks"]["rabbitmq"], "ok", "{body}");
            let made = count(&db, "SELECT count(*) FROM orders").await;
            if made == 600 || started.elapsed() > Duration::from_secs(30) {
                break made;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = amqp.close(200, "done".into()).await;
        (made, slowest)
    };
    let (answered, (made, slowest)) = futures_util::join!(buyers, work);
    assert_eq!(made, 600, "orders made with Redis silent");
    assert!(answered > 0);
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    switch.set(true);
    front_handle.stop(true).await;
    admin_handle.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

/// A buyer who retries after `Retry-After` while the answer is 503, with the same
/// request id: fetches a purchase token, then reserves. The answers, in order.
async fn persistent_buyer(
    front: &crate::front_client::Front,
    activity: i64,
    user: i64,
    first_503: &std::sync::Mutex<Option<Instant>>,
) -> Vec<u16> {
    let request = uuid::Uuid::now_v7();
    let token_path = format!("/v1/activities/{activity}/skus/1/purchase-token");
    let mut answers = Vec::new();
    let mut token = None;
    for _ in 0..40 {
        let status = match &token {
            None => {
                let (status, body) = front.get(&token_path, Some(user)).await;
                if status == 200 {
                    token = body["token"].as_str().map(str::to_owned);
                    continue;
                }
                status
            }
            Some(token) => {
                front
                    .reserve_with(activity, user, request, Some(token))
                    .await
                    .0
            }
        };
        answers.push(status);
        if status != 503 {
            break;
        }
        first_503.lock().unwrap().get_or_insert_with(Instant::now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    answers
}

/// Issue 48, "Redis lost": a 1,000-unit sale over 8 buckets through HTTP; after 300
/// are sold every key of the sale is deleted. With no operator, the front stage
/// answers 503 and rebuilds the keys from PostgreSQL; the remaining 700 sell within
/// 10 s of the first retry, exactly 1,000 orders, no user twice (the first 300 find
/// their marks restored), and the drift is zero once everything settled.
#[actix_rt::test]
async fn a_sale_whose_redis_keys_vanish_rebuilds_them_and_sells_the_rest() {
    let (env, db) = Sale::new()
        .set("frontstage.rate_limit.per_address_per_s", 0)
        .activity(4803, 1_000, 8)
        .open()
        .await;
    let keys = seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, 4803, 1);
    let mut redis = env.redis().await;
    seckill_engine::redis::load_stock(&mut redis, &keys, &[125; 8], crate::common::sale_end())
        .await
        .unwrap();
    let engine = EngineHandle::start(&env.settings).await;
    let (front, handle) = crate::front_client::Front::serve(
        &env.settings,
        engine.ids.clone(),
        engine.readiness.clone(),
    )
    .await;
    let first_503 = std::sync::Mutex::new(None);
    let first: Vec<Vec<u16>> = futures_util::future::join_all(
        (1..=300).map(|user| persistent_buyer(&front, 4803, user, &first_503)),
    )
    .await;
    assert!(first.iter().all(|a| a == &[202]), "{first:?}");
    wait_for(Duration::from_secs(30), "300 orders", || async {
        count(&db, "SELECT count(*) FROM orders").await == 300
    })
    .await;

    // Every key of the sale goes, as with a Redis restart without persistence.
    let pattern = format!("{}:*", env.settings.redis.key_prefix);
    let deleted = crate::common::redis_delete_matching(&mut redis, &pattern).await;
    assert!(deleted > 0);

    // The first 300 again, and 800 new buyers for the 700 units left.
    let second: Vec<Vec<u16>> = futures_util::future::join_all(
        (1..=1_100).map(|user| persistent_buyer(&front, 4803, user, &first_503)),
    )
    .await;
    let first_retry = first_503
        .lock()
        .unwrap()
        .expect("a 503 while the keys were gone");
    wait_for(Duration::from_secs(30), "1,000 orders", || async {
        count(&db, "SELECT count(*) FROM orders").await == 1_000
    })
    .await;
    let sold_out_after = first_retry.elapsed();
    let last = |a: &Vec<u16>| *a.last().unwrap();
    assert!(
        second[..300].iter().all(|a| last(a) == 409),
        "the first buyers' marks were not restored: {:?}",
        &second[..300]
    );
    let accepted = second[300..].iter().filter(|a| last(a) == 202).count();
    assert_eq!(accepted, 700, "{:?}", &second[300..]);
    assert!(
        second.iter().all(|a| last(a) != 503),
        "still 503 after 40 tries"
    );
    assert!(
        sold_out_after < Duration::from_secs(10),
        "the rest sold {sold_out_after:?} after the first retry"
    );
    assert_eq!(
        count(&db, "SELECT count(DISTINCT user_id) FROM orders").await,
        1_000
    );
    handle.stop(true).await;
    engine.stop().await;
    let mut redis = env.redis().await;
    let drift =
        seckill_engine::drift::measure(&db, &mut redis, &env.settings.redis.key_prefix, Some(4803))
            .await
            .unwrap();
    assert!(drift.iter().all(|b| b.drift == 0), "{drift:?}");
    crate::common::assert_invariants(&db).await;
    env.cleanup().await;
}

/// `scripts/services up --redis-ha` (r0, r1, three sentinels) on free ports.
async fn redis_ha() -> crate::common::Topology {
    crate::common::Topology::start("--redis-ha", "SECKILL_REDIS_HA_PORTS", 5, "redis-ha.toml").await
}

/// Waits until the replica has the master's writes so far (`WAIT 1`, 5 s at most).
async fn replicated(redis: &mut ::redis::aio::MultiplexedConnection) {
    let _: i64 = ::redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query_async(redis)
        .await
        .unwrap();
}

/// The sentinels' URLs of a `redis_ha` topology.
fn sentinels(ha: &crate::common::Topology) -> Vec<String> {
    ha.ports[2..]
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect()
}

/// Issue 48, "Redis master killed": a sale through HTTP on a Sentinel topology (a
/// master, a replica, three sentinels); the master is SIGKILLed mid-sale. The front
/// stage follows the promoted replica without a restart: reservations succeed again
/// within 10 s of the kill, and exactly the stock is sold, a bucket the promoted
/// replica had wrong included (rebuilt from PostgreSQL on the move).
#[actix_rt::test]
async fn the_front_stage_follows_a_promoted_redis_master_without_a_restart() {
    let ha = redis_ha().await;
    let (env, db) = Sale::new()
        .set("redis.sentinels", sentinels(&ha))
        .set("redis.master_name", "seckill")
        .set("redis.url", format!("redis://127.0.0.1:{}", ha.ports[0]))
        .set("frontstage.rate_limit.per_address_per_s", 0)
        .activity(4804, 400, 4)
        .open()
        .await;
    let keys = seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, 4804, 1);
    let mut redis = env.redis().await;
    seckill_engine::redis::load_stock(&mut redis, &keys, &[100; 4], crate::common::sale_end())
        .await
        .unwrap();
    // The replica has the stock before the master goes (WAIT: replicated writes).
    replicated(&mut redis).await;
    let engine = EngineHandle::start(&env.settings).await;
    let (front, handle) = crate::front_client::Front::serve(
        &env.settings,
        engine.ids.clone(),
        engine.readiness.clone(),
    )
    .await;
    let no_503 = std::sync::Mutex::new(None);
    let before: Vec<Vec<u16>> = futures_util::future::join_all(
        (1..=100).map(|user| persistent_buyer(&front, 4804, user, &no_503)),
    )
    .await;
    assert!(before.iter().all(|a| a == &[202]), "{before:?}");
    // What a replication gap leaves on the promoted replica: a bucket whose count
    // is wrong (here: its units gone, as if give-backs were lost). Only the rebuild
    // that follows the fail-over makes them sellable again.
    let _: () = ::redis::cmd("SET")
        .arg(keys.stock(0))
        .arg(0)
        .arg("KEEPTTL")
        .query_async(&mut redis)
        .await
        .unwrap();
    replicated(&mut redis).await;

    let killed = ha.services(&["redis-ha-kill-master"]).await;
    let kill_at = Instant::now();
    // Buyers keep coming, a few at a time, each retrying its 503s.
    let first_503 = std::sync::Mutex::new(None);
    let mut back_after = None;
    let mut answers = Vec::new();
    for wave in 0..20 {
        let users = (101 + wave * 25)..(126 + wave * 25);
        let got: Vec<Vec<u16>> = futures_util::future::join_all(
            users.map(|user| persistent_buyer(&front, 4804, user, &first_503)),
        )
        .await;
        if back_after.is_none() && got.iter().any(|a| a.contains(&202)) {
            back_after = Some(kill_at.elapsed());
        }
        answers.extend(got);
    }
    let back_after = back_after.expect("no reservation succeeded after the kill");
    eprintln!("reservations succeeded again {back_after:?} after the master was killed");
    assert!(
        back_after < Duration::from_secs(10),
        "reservations came back {back_after:?} after the kill ({killed})"
    );
    wait_for(Duration::from_secs(30), "the stock sold", || async {
        count(&db, "SELECT count(*) FROM orders").await == 400
    })
    .await;
    handle.stop(true).await;
    engine.stop().await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 400);
    assert_eq!(
        count(&db, "SELECT count(DISTINCT user_id) FROM orders").await,
        400
    );
    crate::common::assert_invariants(&db).await;
    env.cleanup().await;
}
