//! The invariant SQL of seed §13.3 plus the engine's own consistency checks. Each check
//! counts violating rows; zero everywhere means no promise was broken.

use tokio_postgres::Client;

/// One check and how many rows violate it.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub name: &'static str,
    pub description: &'static str,
    pub violations: i64,
}

impl CheckResult {
    pub fn ok(&self) -> bool {
        self.violations == 0
    }
}

/// Every check takes `$1 = activity_id or NULL for all activities`; a check that
/// reads the inbox also takes `$2 = the inbox window in ms` (`retention.inbox_secs`)
/// and looks only within it, because retention deletes older inbox rows.
const CHECKS: &[(&str, &str, &str)] = &[
    (
        "duplicate_orders",
        "more than one order per (activity, sku, user) (§13.3)",
        "SELECT count(*) FROM (
            SELECT 1 FROM orders
            WHERE $1::bigint IS NULL OR activity_id = $1
            GROUP BY activity_id, sku_id, user_id HAVING count(*) > 1) AS v",
    ),
    (
        "bucket_conservation",
        "bucket with total <> available + allocated or a negative count (§13.3)",
        "SELECT count(*) FROM sku_inventory
         WHERE ($1::bigint IS NULL OR activity_id = $1)
           AND (total_stock <> available_stock + allocated_stock
                OR available_stock < 0 OR allocated_stock < 0)",
    ),
    (
        "sku_total_conservation",
        "SKU whose bucket totals differ from its planned stock (§13.3)",
        "SELECT count(*) FROM (
            SELECT 1 FROM seckill_sku AS s
            JOIN sku_inventory AS i ON i.activity_id = s.activity_id AND i.sku_id = s.sku_id
            WHERE $1::bigint IS NULL OR s.activity_id = $1
            GROUP BY s.activity_id, s.sku_id, s.planned_stock
            HAVING s.planned_stock <> sum(i.total_stock)) AS v",
    ),
    (
        "ledger_order_consistency",
        "live order without its ALLOCATE ledger row (§13.3)",
        "SELECT count(*) FROM orders AS o
         LEFT JOIN inventory_ledger AS l
           ON l.order_id = o.order_id
          AND l.idempotency_key = 'ALLOCATE:' || o.reservation_id::text
         WHERE ($1::bigint IS NULL OR o.activity_id = $1)
           AND o.status IN (10, 20, 30, 60)
           AND l.ledger_id IS NULL",
    ),
    (
        "cancelled_with_paid_at",
        "cancelled order that carries a payment time (§13.3)",
        "SELECT count(*) FROM orders
         WHERE ($1::bigint IS NULL OR activity_id = $1) AND status = 40 AND paid_at IS NOT NULL",
    ),
    (
        "allocated_matches_orders",
        "bucket whose allocated stock differs from the orders holding stock in it (oversell)",
        "SELECT count(*) FROM sku_inventory AS i
         LEFT JOIN (
            SELECT activity_id, sku_id, inventory_bucket, sum(quantity) AS held
            FROM orders WHERE status IN (10, 20, 30, 60)
            GROUP BY activity_id, sku_id, inventory_bucket) AS o
           ON o.activity_id = i.activity_id AND o.sku_id = i.sku_id
          AND o.inventory_bucket = i.bucket_no
         WHERE ($1::bigint IS NULL OR i.activity_id = $1)
           AND i.allocated_stock <> coalesce(o.held, 0)",
    ),
    (
        "reservation_order_consistency",
        "ORDERED reservation without its order, or order whose reservation is not ORDERED",
        "SELECT
            (SELECT count(*) FROM inventory_reservation AS r
             LEFT JOIN orders AS o ON o.order_id = r.order_id AND o.reservation_id = r.reservation_id
             WHERE ($1::bigint IS NULL OR r.activity_id = $1)
               AND r.status = 10 AND o.order_id IS NULL)
          + (SELECT count(*) FROM orders AS o
             JOIN inventory_reservation AS r ON r.reservation_id = o.reservation_id
             WHERE ($1::bigint IS NULL OR o.activity_id = $1)
               AND o.status IN (10, 20, 30, 60) AND r.status <> 10)",
    ),
];

/// The inbox check. An order's inbox row is written in the order's transaction just
/// before the order, so an order younger than the window less a second still has
/// its row (the second covers the transaction's own length).
const INBOX_CHECK: (&str, &str, &str) = (
    "inbox_order_consistency",
    "inbox result naming an order that does not exist, or an order without the inbox row of its message (within the inbox window)",
    "SELECT
        (SELECT count(*) FROM consumer_inbox AS c
         LEFT JOIN orders AS o ON o.order_id = c.order_id
         WHERE c.result_code IN ('ORDER_CREATED', 'ORDER_ALREADY_CREATED')
           AND c.processed_at > statement_timestamp() - $2::bigint * interval '1 millisecond'
           AND o.order_id IS NULL
           AND ($1::bigint IS NULL OR EXISTS (
                SELECT 1 FROM inventory_reservation AS r
                WHERE r.reservation_id = c.reservation_id AND r.activity_id = $1)))
      + (SELECT count(*) FROM orders AS o
         WHERE ($1::bigint IS NULL OR o.activity_id = $1)
           AND o.created_at > statement_timestamp()
                              - ($2::bigint - 1000) * interval '1 millisecond'
           AND NOT EXISTS (SELECT 1 FROM consumer_inbox AS c
                           WHERE c.message_id = o.source_message_id
                             AND c.order_id = o.order_id))",
);

/// The stock checks the gauge sampler runs on a schedule over each live sale
/// (`seckill_conservation_violations`): each reads one activity's buckets or orders.
const CONSERVATION: &[&str] = &[
    "duplicate_orders",
    "bucket_conservation",
    "sku_total_conservation",
    "allocated_matches_orders",
];

/// Rows of one activity violating the stock checks (`CONSERVATION`).
pub async fn conservation_violations(
    client: &Client,
    activity_id: i64,
) -> Result<i64, tokio_postgres::Error> {
    let mut total = 0;
    for (_, _, sql) in CHECKS.iter().filter(|(n, _, _)| CONSERVATION.contains(n)) {
        let violations: i64 = client.query_one(*sql, &[&Some(activity_id)]).await?.get(0);
        total += violations;
    }
    Ok(total)
}

/// Runs every check; `inbox_window` is `retention.inbox_secs` (see `INBOX_CHECK`).
pub async fn run_checks(
    client: &Client,
    activity_id: Option<i64>,
    inbox_window: std::time::Duration,
) -> Result<Vec<CheckResult>, tokio_postgres::Error> {
    let mut results = Vec::with_capacity(CHECKS.len() + 1);
    for (name, description, sql) in CHECKS {
        let violations: i64 = client.query_one(*sql, &[&activity_id]).await?.get(0);
        results.push(CheckResult {
            name,
            description,
            violations,
        });
    }
    let (name, description, sql) = INBOX_CHECK;
    let window = super::millis(inbox_window);
    let violations: i64 = client
        .query_one(sql, &[&activity_id, &window])
        .await?
        .get(0);
    results.push(CheckResult {
        name,
        description,
        violations,
    });
    Ok(results)
}
