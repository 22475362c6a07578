//! A RabbitMQ cluster (issue 48): `scripts/services up --amqp-cluster` on free
//! ports under a directory of the test's own, the engine and the front stage given
//! every node (`amqp.urls`, `frontstage.amqp_urls`), and the node they are
//! connected to stopped mid-sale.

use std::time::{Duration, Instant};

use figment::providers::Serialized;

use crate::common::builders;
use crate::common::engine::EngineHandle;
use crate::common::{count, wait_for, TestEnv};

/// `scripts/services up --amqp-cluster`: three RabbitMQ nodes on free ports.
async fn amqp_cluster() -> crate::common::Topology {
    crate::common::Topology::start(
        "--amqp-cluster",
        "SECKILL_AMQP_CLUSTER_PORTS",
        3,
        "amqp-cluster.toml",
    )
    .await
}

/// The nodes' URLs, in order.
fn urls(cluster: &crate::common::Topology) -> Vec<String> {
    cluster
        .ports
        .iter()
        .map(|p| format!("amqp://guest:guest@127.0.0.1:{p}/%2f"))
        .collect()
}

/// The node the engine and the front stage are connected to (the first of
/// `amqp.urls` and `frontstage.amqp_urls`) is stopped mid-sale: the engine consumes
/// again from another node within 10 s, the front stage queues reservations through
/// another node, and every one of 1,200 confirmed order messages becomes exactly one
/// order (0 lost, 0 duplicated, 0 dead-lettered); the quorum queues kept them on the
/// other two nodes.
#[actix_rt::test]
async fn stopping_the_node_the_engine_uses_loses_and_duplicates_nothing() {
    let cluster = amqp_cluster().await;
    let urls = urls(&cluster);
    let env = TestEnv::with(|f| {
        f.merge(Serialized::default("amqp.url", &urls[0]))
            .merge(Serialized::default("amqp.urls", &urls))
            .merge(Serialized::default("frontstage.amqp_urls", &urls))
    })
    .await;
    let mut db = env.db().await;
    builders::activity(&mut db, 4805, 1, 1_200, 4).await;
    // A small sale through the front stage beside it.
    builders::activity(&mut db, 4806, 1, 10, 1).await;
    let keys = seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, 4806, 1);
    let mut redis = env.redis().await;
    seckill_engine::redis::load_stock(&mut redis, &keys, &[10], crate::common::sale_end())
        .await
        .unwrap();
    let engine = EngineHandle::start(&env.settings).await;
    let (front, handle) = crate::front_client::Front::serve(
        &env.settings,
        engine.ids.clone(),
        engine.readiness.clone(),
    )
    .await;
    assert_eq!(front.reserve(4806, 1, uuid::Uuid::now_v7()).await.0, 202);
    let amqp = env.amqp().await;
    let msgs: Vec<_> = (1..=1_200)
        .map(|user| builders::order(4805, 1, user, (user % 4) as i16))
        .collect();
    builders::publish(&env, &amqp, &msgs[..400]).await;
    wait_for(Duration::from_secs(30), "the first 400 orders", || async {
        count(&db, "SELECT count(*) FROM orders WHERE activity_id = 4805").await == 400
    })
    .await;

    let out = cluster
        .services(&["amqp-cluster-ctl", "1", "stop_app"])
        .await;
    let stopped = Instant::now();
    // The rest through another node, as a producer that lost its node would.
    let survivor = {
        let mut s = env.settings.amqp.clone();
        s.urls = urls[1..].iter().map(|u| u.clone().into()).collect();
        seckill_engine::mq::connect(&s, "seckill-test")
            .await
            .unwrap()
    };
    builders::publish(&env, &survivor, &msgs[400..]).await;
    // Consuming again: an order made from a message published after the stop.
    let consuming = crate::common::wait_until(Duration::from_secs(10), || async {
        count(&db, "SELECT count(*) FROM orders WHERE activity_id = 4805").await > 400
    })
    .await;
    let back_after = stopped.elapsed();
    assert!(
        consuming,
        "no order within 10 s of the node's stop; intakes consuming {} ({out})",
        engine.stats.consuming()
    );
    eprintln!("the engine consumed again {back_after:?} after its node stopped");
    // The front stage's publisher moves to another node too: a buyer retrying its
    // 503s (same request) is queued within 10 s.
    let request = uuid::Uuid::now_v7();
    let queued = crate::common::wait_until(Duration::from_secs(10), || async {
        front.reserve(4806, 2, request).await.0 == 202
    })
    .await;
    assert!(
        queued,
        "the front stage queued nothing after its node stopped"
    );
    wait_for(Duration::from_secs(60), "1,202 orders", || async {
        count(&db, "SELECT count(*) FROM orders").await == 1_202
    })
    .await;
    handle.stop(true).await;
    engine.stop().await;
    assert_eq!(
        count(
            &db,
            "SELECT count(DISTINCT user_id) FROM orders WHERE activity_id = 4805"
        )
        .await,
        1_200
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM consumer_inbox").await,
        1_202,
        "one inbox row per message"
    );
    let channel = survivor.create_channel().await.unwrap();
    assert_eq!(
        env.ready_count(&channel, &env.names.order_dead_queue())
            .await,
        0,
        "dead-lettered"
    );
    let _ = survivor.close(200, "done".into()).await;
    crate::common::assert_invariants(&db).await;
    env.cleanup().await;
}
