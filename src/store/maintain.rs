//! After a sale (seed §10.6): VACUUM (ANALYZE) the tables a sale writes, so that
//! the next sale does not start on this one's dead rows, and what it changed: dead
//! rows and size of each table (with its indexes) before and after.

use tokio_postgres::Client;

/// One table before and after.
#[derive(Debug, Clone)]
pub struct Vacuumed {
    pub table: &'static str,
    pub dead_rows_before: i64,
    pub dead_rows_after: i64,
    pub bytes_before: i64,
    pub bytes_after: i64,
}

/// Whether the activity's sale is over (ended, cancelled or past its end), still
/// on, or unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleState {
    Over,
    Live,
    Unknown,
}

pub async fn sale_state(
    client: &Client,
    activity_id: i64,
) -> Result<SaleState, tokio_postgres::Error> {
    let over = [
        crate::domain::status::ActivityStatus::Ended.code(),
        crate::domain::status::ActivityStatus::Cancelled.code(),
    ];
    Ok(
        match client
            .query_opt(SALE_OVER, &[&activity_id, &over[0], &over[1]])
            .await?
        {
            None => SaleState::Unknown,
            Some(row) if row.get::<_, bool>(0) => SaleState::Over,
            Some(_) => SaleState::Live,
        },
    )
}

/// The tables a sale writes, each with its VACUUM statement (static: VACUUM takes
/// no parameters). Each runs on its own, outside a transaction, as VACUUM must.
const TABLES: &[(&str, &str)] = &[
    ("sku_inventory", "VACUUM (ANALYZE) seckill.sku_inventory"),
    (
        "inventory_reservation",
        "VACUUM (ANALYZE) seckill.inventory_reservation",
    ),
    ("orders", "VACUUM (ANALYZE) seckill.orders"),
    ("order_items", "VACUUM (ANALYZE) seckill.order_items"),
    (
        "inventory_ledger",
        "VACUUM (ANALYZE) seckill.inventory_ledger",
    ),
    ("consumer_inbox", "VACUUM (ANALYZE) seckill.consumer_inbox"),
    ("event_outbox", "VACUUM (ANALYZE) seckill.event_outbox"),
    (
        "compensation_task",
        "VACUUM (ANALYZE) seckill.compensation_task",
    ),
    ("payment_record", "VACUUM (ANALYZE) seckill.payment_record"),
];

/// Vacuums and analyzes every table a sale writes, one after the other.
pub async fn vacuum_hot_tables(client: &Client) -> Result<Vec<Vacuumed>, tokio_postgres::Error> {
    let mut out = Vec::with_capacity(TABLES.len());
    for (table, vacuum) in TABLES {
        let (dead_rows_before, bytes_before) = table_state(client, table).await?;
        client.batch_execute(vacuum).await?;
        let (dead_rows_after, bytes_after) = table_state(client, table).await?;
        out.push(Vacuumed {
            table,
            dead_rows_before,
            dead_rows_after,
            bytes_before,
            bytes_after,
        });
    }
    Ok(out)
}

/// Dead rows as the statistics say now (the snapshot cleared first: VACUUM reports
/// its own figures), and the table's size with its indexes and TOAST.
async fn table_state(client: &Client, table: &str) -> Result<(i64, i64), tokio_postgres::Error> {
    client.batch_execute(CLEAR_STATS_SNAPSHOT).await?;
    let row = client.query_one(TABLE_STATE, &[&table]).await?;
    Ok((row.get(0), row.get(1)))
}

const SALE_OVER: &str = "
SELECT status IN ($2, $3) OR end_at <= statement_timestamp()
FROM seckill_activity WHERE activity_id = $1";

const CLEAR_STATS_SNAPSHOT: &str = "SELECT pg_stat_clear_snapshot()";

const TABLE_STATE: &str = "
SELECT coalesce(s.n_dead_tup, 0), pg_total_relation_size(c.oid)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'seckill'
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.relname = $1";
