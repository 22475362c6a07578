//! Group commit is invisible: the same messages in the same order give the same
//! outcome per message and the same rows whether each runs in a transaction of its
//! own or many share one. Random mixes (duplicates, re-sends, repeat users, stock
//! shortfalls, several buckets), several seeds, fresh databases for each side.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seckill_engine::domain::message::OrderCreateMessage;
use seckill_engine::domain::outcome::OrderOutcome;
use seckill_engine::store::orders::{create_orders, OrderInput, OrderTxContext};
use seckill_engine::store::{PgConn, StatementCache};
use tokio_postgres::Client;

use crate::common::builders::{self, order, resend};
use crate::common::{assert_invariants, TestEnv};

/// A random mix for activity 61: 4 buckets with 3 units each, 40 possible users.
fn mix(seed: u64, len: usize) -> Vec<OrderCreateMessage> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut msgs: Vec<OrderCreateMessage> = Vec::new();
    while msgs.len() < len {
        let pick = rng.random_range(0..10);
        let next = match (pick, msgs.is_empty()) {
            // The same message again (a redelivery).
            (0..=1, false) => msgs[rng.random_range(0..msgs.len())].clone(),
            // The same reservation under a new message id (a re-sending producer).
            (2..=3, false) => resend(&msgs[rng.random_range(0..msgs.len())]),
            _ => order(61, 1, rng.random_range(1..=40), rng.random_range(0..4)),
        };
        msgs.push(next);
    }
    msgs
}

fn context() -> OrderTxContext {
    OrderTxContext {
        consumer_group: "seckill-engine".into(),
        sku_title: "test sku 1".into(),
        lock_timeout: "5s".into(),
        statement_timeout: "30s".into(),
        max_attempts: 3,
    }
}

/// Runs `msgs` in order, `chunks[i]` of them per transaction (cycling).
async fn run(env: &TestEnv, msgs: &[OrderCreateMessage], chunks: &[usize]) -> Vec<OrderOutcome> {
    let mut conn = PgConn {
        client: env.db().await,
        statements: StatementCache::default(),
    };
    let ctx = context();
    let mut outcomes = Vec::new();
    let mut at = 0;
    for size in chunks.iter().cycle() {
        if at >= msgs.len() {
            break;
        }
        let end = (at + size).min(msgs.len());
        let inputs: Vec<OrderInput<'_>> = msgs[at..end]
            .iter()
            .enumerate()
            .map(|(i, msg)| OrderInput {
                msg,
                topic: "test.order.create.0",
                ledger_id: ((at + i) as i64 + 1) * 1_000,
            })
            .collect();
        let (done, _) = create_orders(&mut conn, &ctx, &inputs)
            .await
            .expect("the mix has no invalid message");
        outcomes.extend(done);
        at = end;
    }
    outcomes
}

/// Every row that matters, as text, without generated ids and timestamps.
async fn snapshot(db: &Client) -> Vec<String> {
    let queries = [
        "SELECT row(reservation_id, order_id, user_id, inventory_bucket, status)::text FROM orders",
        "SELECT row(bucket_no, total_stock, available_stock, allocated_stock, version)::text FROM sku_inventory",
        "SELECT row(reservation_id, status, failure_code, order_id)::text FROM inventory_reservation",
        "SELECT row(message_id, result_code, order_id)::text FROM consumer_inbox",
        "SELECT row(order_id, reservation_id, ledger_type, before_available, after_available,
                    before_allocated, after_allocated)::text FROM inventory_ledger",
        "SELECT row(dedup_key, tag)::text FROM event_outbox",
        "SELECT row(idempotency_key, task_type)::text FROM compensation_task",
    ];
    let mut out = Vec::new();
    for q in queries {
        let mut rows: Vec<String> = db
            .query(q, &[])
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .iter()
            .map(|r| r.get(0))
            .collect();
        rows.sort();
        out.push(format!("-- {q}"));
        out.extend(rows);
    }
    out
}

#[actix_rt::test]
async fn batched_transactions_give_every_message_its_single_outcome() {
    for seed in [1u64, 2, 3, 4, 5] {
        let alone = TestEnv::new().await;
        let grouped = TestEnv::new().await;
        for env in [&alone, &grouped] {
            let mut db = env.db().await;
            builders::activity(&mut db, 61, 1, 12, 4).await;
        }
        let msgs = mix(seed, 160);
        let mut rng = StdRng::seed_from_u64(seed + 100);
        let chunks: Vec<usize> = (0..20).map(|_| rng.random_range(1..=64)).collect();
        let one_by_one = run(&alone, &msgs, &[1]).await;
        let batched = run(&grouped, &msgs, &chunks).await;
        assert_eq!(one_by_one.len(), msgs.len());
        for (i, (a, b)) in one_by_one.iter().zip(&batched).enumerate() {
            assert_eq!(
                a, b,
                "seed {seed}: message {i} ({}) differs alone vs in batches {chunks:?}",
                msgs[i].message_id
            );
        }
        let (db_a, db_b) = (alone.db().await, grouped.db().await);
        assert_eq!(snapshot(&db_a).await, snapshot(&db_b).await, "seed {seed}");
        // The mixes exercise every branch.
        let codes: std::collections::HashSet<_> = one_by_one.iter().map(|o| o.label()).collect();
        for label in [
            "created",
            "duplicate",
            "already_created",
            "user_already_ordered",
            "sold_out",
        ] {
            assert!(
                codes.contains(label),
                "seed {seed}: no {label} in {codes:?}"
            );
        }
        assert_invariants(&db_a).await;
        assert_invariants(&db_b).await;
        alone.cleanup().await;
        grouped.cleanup().await;
    }
}
