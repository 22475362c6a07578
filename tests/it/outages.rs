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
