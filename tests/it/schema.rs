//! The schema reproduces seed §8.2 and the Rust status enums agree with it.

use std::collections::BTreeSet;

use seckill_engine::domain::status::*;

use crate::common::TestEnv;

// Transcribed from seed §8.2 (the `CREATE TABLE`, `CONSTRAINT` and `CREATE INDEX`
// lines of the chapter), not generated from our migration.
const SEED_TABLES: &[&str] = &[
    "seckill_activity",
    "seckill_sku",
    "sku_inventory",
    "inventory_reservation",
    "orders",
    "order_items",
    "payment_record",
    "inventory_ledger",
    "consumer_inbox",
    "event_outbox",
    "compensation_task",
];
/// The engine's own tables beyond the seed's, with their constraints: retention's
/// history of SENT events (seed §8.5 asks for one, §8.2 does not define it).
const ENGINE_TABLES: &[&str] = &["event_outbox_history"];
const ENGINE_CONSTRAINTS: &[&str] = &["pk_outbox_history"];
const SEED_CONSTRAINTS: &[&str] = &[
    "ck_activity_status",
    "ck_activity_time",
    "ck_activity_version",
    "pk_seckill_sku",
    "fk_sku_activity",
    "ck_sku_status",
    "ck_sku_price",
    "ck_sku_stock",
    "ck_sku_limit",
    "ck_sku_bucket_count",
    "ck_sku_version",
    "pk_sku_inventory",
    "fk_inventory_sku",
    "ck_inventory_bucket",
    "ck_inventory_nonnegative",
    "ck_inventory_conservation",
    "ck_inventory_version",
    "uq_reservation_request",
    "uq_reservation_order",
    "ck_reservation_status",
    "ck_reservation_quantity",
    "ck_reservation_bucket",
    "ck_reservation_time",
    "ck_reservation_ordered",
    "ck_reservation_released",
    "ck_reservation_version",
    "uq_orders_order_no",
    "uq_orders_request",
    "uq_orders_reservation",
    "uq_orders_source_message",
    "uq_orders_user_sku",
    "ck_orders_status",
    "ck_orders_quantity",
    "ck_orders_amount",
    "ck_orders_bucket",
    "ck_orders_paid_at",
    "ck_orders_cancelled_at",
    "ck_orders_version",
    "pk_order_items",
    "fk_order_items_order",
    "ck_order_item_line",
    "ck_order_item_quantity",
    "ck_order_item_amount",
    "uq_payment_request",
    "uq_payment_provider_trade",
    "uq_payment_callback",
    "fk_payment_order",
    "ck_payment_status",
    "ck_payment_amount",
    "ck_payment_paid_at",
    "ck_payment_version",
    "uq_inventory_ledger_idempotency",
    "ck_ledger_type",
    "ck_ledger_conservation",
    "ck_ledger_available",
    "ck_ledger_allocated",
    "ck_ledger_result_nonnegative",
    "pk_consumer_inbox",
    "ck_inbox_status",
    "uq_outbox_dedup",
    "ck_outbox_status",
    "ck_outbox_retry",
    "ck_outbox_schema",
    "uq_compensation_idempotency",
    "ck_compensation_type",
    "ck_compensation_status",
    "ck_compensation_retry",
];
/// Tables whose primary key is an unnamed column constraint in the seed.
const SEED_COLUMN_PKS: &[&str] = &[
    "seckill_activity",
    "inventory_reservation",
    "orders",
    "payment_record",
    "inventory_ledger",
    "event_outbox",
    "compensation_task",
];
/// (index, table, access method, partial, has INCLUDE columns)
const SEED_INDEXES: &[(&str, &str, &str, bool, bool)] = &[
    (
        "idx_activity_status_time",
        "seckill_activity",
        "btree",
        false,
        false,
    ),
    (
        "idx_reservation_user_sku",
        "inventory_reservation",
        "btree",
        false,
        false,
    ),
    (
        "idx_reservation_pending_expire",
        "inventory_reservation",
        "btree",
        true,
        false,
    ),
    ("idx_orders_user_created", "orders", "btree", false, true),
    ("idx_orders_activity_status", "orders", "btree", false, true),
    ("idx_orders_expirable", "orders", "btree", true, false),
    (
        "idx_payment_order_created",
        "payment_record",
        "btree",
        false,
        true,
    ),
    (
        "idx_ledger_reservation",
        "inventory_ledger",
        "btree",
        false,
        false,
    ),
    ("idx_ledger_order", "inventory_ledger", "btree", true, false),
    (
        "idx_ledger_created_brin",
        "inventory_ledger",
        "brin",
        false,
        false,
    ),
    (
        "idx_inbox_reservation",
        "consumer_inbox",
        "btree",
        false,
        false,
    ),
    (
        "idx_inbox_processed_brin",
        "consumer_inbox",
        "brin",
        false,
        false,
    ),
    ("idx_outbox_ready", "event_outbox", "btree", true, true),
    (
        "idx_outbox_stale_sending",
        "event_outbox",
        "btree",
        true,
        false,
    ),
    (
        "idx_compensation_ready",
        "compensation_task",
        "btree",
        true,
        false,
    ),
    (
        "idx_compensation_stale_running",
        "compensation_task",
        "btree",
        true,
        false,
    ),
];

#[tokio::test]
async fn schema_has_every_table_constraint_and_index_of_the_seed() {
    let env = TestEnv::new().await;
    let db = env.db().await;

    let tables: BTreeSet<String> = db
        .query(
            "SELECT relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'seckill' AND c.relkind = 'r'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: BTreeSet<String> = SEED_TABLES
        .iter()
        .chain(ENGINE_TABLES)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(tables, expected);

    let constraints: BTreeSet<String> = db
        .query(
            "SELECT conname::text FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
             WHERE n.nspname = 'seckill'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for name in SEED_CONSTRAINTS.iter().chain(ENGINE_CONSTRAINTS) {
        assert!(constraints.contains(*name), "constraint {name} missing");
    }
    // Column primary keys get PostgreSQL's default names.
    for table in SEED_COLUMN_PKS {
        assert!(
            constraints.contains(&format!("{table}_pkey")),
            "{table} primary key missing"
        );
    }
    assert_eq!(
        constraints.len(),
        SEED_CONSTRAINTS.len() + ENGINE_CONSTRAINTS.len() + SEED_COLUMN_PKS.len(),
        "unexpected extra constraints: {constraints:?}"
    );

    for (index, table, method, partial, include) in SEED_INDEXES {
        let row = db
            .query_opt(
                "SELECT t.relname::text, am.amname::text, x.indpred IS NOT NULL,
                        x.indnatts > x.indnkeyatts
                 FROM pg_index x
                 JOIN pg_class i ON i.oid = x.indexrelid
                 JOIN pg_class t ON t.oid = x.indrelid
                 JOIN pg_am am ON am.oid = i.relam
                 JOIN pg_namespace n ON n.oid = i.relnamespace
                 WHERE n.nspname = 'seckill' AND i.relname = $1",
                &[index],
            )
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("index {index} missing"));
        assert_eq!(row.get::<_, String>(0), *table, "{index} table");
        assert_eq!(row.get::<_, String>(1), *method, "{index} method");
        assert_eq!(row.get::<_, bool>(2), *partial, "{index} partial");
        assert_eq!(row.get::<_, bool>(3), *include, "{index} INCLUDE");
    }

    // fillfactor = 80 where the seed sets it; autovacuum settings of §10.6.
    for (table, options) in [
        (
            "sku_inventory",
            vec![
                "fillfactor=80",
                "autovacuum_vacuum_scale_factor=0.01",
                "autovacuum_vacuum_threshold=50",
                "autovacuum_analyze_scale_factor=0.02",
                "autovacuum_analyze_threshold=50",
            ],
        ),
        (
            "event_outbox",
            vec![
                "fillfactor=80",
                "autovacuum_vacuum_scale_factor=0.02",
                "autovacuum_vacuum_threshold=500",
                "autovacuum_analyze_scale_factor=0.05",
                "autovacuum_analyze_threshold=500",
            ],
        ),
        ("compensation_task", vec!["fillfactor=80"]),
    ] {
        let reloptions: Vec<String> = db
            .query_one(
                "SELECT coalesce(c.reloptions, '{}')::text[] FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = 'seckill' AND c.relname = $1",
                &[&table],
            )
            .await
            .unwrap()
            .get(0);
        for option in options {
            assert!(
                reloptions.iter().any(|o| o == option),
                "{table}: {option} missing in {reloptions:?}"
            );
        }
    }
    env.cleanup().await;
}

/// The codes a CHECK constraint allows, read from its definition.
async fn check_codes(db: &tokio_postgres::Client, constraint: &str) -> BTreeSet<i16> {
    let def: String = db
        .query_one(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
             JOIN pg_namespace n ON n.oid = c.connamespace
             WHERE n.nspname = 'seckill' AND c.conname = $1",
            &[&constraint],
        )
        .await
        .unwrap_or_else(|e| panic!("{constraint}: {e}"))
        .get(0);
    // e.g. CHECK ((status = ANY (ARRAY[10, 20, 30]))) or CHECK ((status = 20))
    let digits: String = def
        .chars()
        .map(|c| if c.is_ascii_digit() { c } else { ' ' })
        .collect();
    digits
        .split_whitespace()
        .map(|d| d.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn status_codes_match_check_constraints() {
    let env = TestEnv::new().await;
    let db = env.db().await;
    macro_rules! same {
        ($ty:ty) => {{
            let rust: BTreeSet<i16> = <$ty>::ALL.iter().map(|s| s.code()).collect();
            let db_codes = check_codes(&db, <$ty>::CONSTRAINT).await;
            assert_eq!(
                rust,
                db_codes,
                "{} vs {}",
                stringify!($ty),
                <$ty>::CONSTRAINT
            );
        }};
    }
    same!(ActivityStatus);
    same!(SkuStatus);
    same!(OrderStatus);
    same!(ReservationStatus);
    same!(OutboxStatus);
    same!(PaymentStatus);
    same!(CompensationStatus);
    same!(CompensationType);
    same!(LedgerType);
    assert_eq!(
        check_codes(&db, "ck_inbox_status").await,
        BTreeSet::from([INBOX_PROCESSED])
    );
    env.cleanup().await;
}
