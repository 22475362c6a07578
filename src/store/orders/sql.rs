//! Every statement of the order transaction, static and parameterized. The
//! conditional inventory UPDATE of seed §9.4 is one macro wrapped by the per-message
//! and the set-based statements, so each stays one static string.

/// The conditional inventory UPDATE of seed §9.4 that takes $4 units from the bucket
/// ($1, $2, $3) if it holds them, returning the values before. Shared by
/// `ALLOCATE_UNITS` and the set-based statements, which wrap it; a macro so that every
/// one of them stays static SQL.
macro_rules! allocate_units {
    () => {
        "
UPDATE sku_inventory
SET available_stock = available_stock - $4,
    allocated_stock = allocated_stock + $4,
    version = version + $4,
    updated_at = statement_timestamp()
WHERE activity_id = $1
  AND sku_id = $2
  AND bucket_no = $3
  AND available_stock >= $4
RETURNING available_stock + $4 AS before_available,
          allocated_stock - $4 AS before_allocated"
    };
}

pub(super) const LOAD_BUCKET_SKU: &str = "
SELECT s.sku_title, s.unit_price, s.currency,
       coalesce((a.rules->>'order_ttl_ms')::bigint, 900000)
FROM sku_inventory AS i
JOIN seckill_sku AS s ON s.activity_id = i.activity_id AND s.sku_id = i.sku_id
JOIN seckill_activity AS a ON a.activity_id = s.activity_id
WHERE i.activity_id = $1 AND i.sku_id = $2 AND i.bucket_no = $3";

/// The transaction's timeouts (seed §9.11), and its planner settings. A prepared
/// statement runs on a generic plan from its sixth execution on, planned for the
/// table as it was then: on a sale's fresh tables that is a few pages, where hashing
/// the batch against a sequential scan is cheapest, and the plan stays until
/// autovacuum analyzes the table, up to a minute later, while every batch scans a
/// table that grows by thousands of rows a second. The order transaction touches at
/// most a batch of rows, each by key, so it rules out sequential scans and hash and
/// merge joins: a batch joins its array to a table by probing a unique index, at any
/// table size (docs/BENCHMARKS.md). And `synchronous_commit = on`, locally: the
/// session already has it (`store::target`), and no default or session `SET` of
/// anyone's may weaken the transaction whose COMMIT acks an order (seed §14.2).
pub(super) const SET_TX_SETTINGS: &str = "
SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true),
       set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true),
       set_config('synchronous_commit', 'on', true)";

pub(super) const INSERT_RESERVATION: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, redis_reserved_at, expires_at
)
VALUES ($1, $2, $3, $4, $5, $6, $7, 1, 0, $8, $9)
ON CONFLICT DO NOTHING";

pub(super) const LOCK_RESERVATION: &str = "
SELECT request_id, activity_id, sku_id, user_id, inventory_bucket, order_id, status
FROM inventory_reservation
WHERE reservation_id = $1
FOR UPDATE";

pub(super) const INSERT_ORDER: &str = "
INSERT INTO orders (
    order_id, order_no, request_id, reservation_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, quantity,
    unit_price, total_amount, currency, status, expire_at
)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1, $10, $10, $11, 10, $12)
ON CONFLICT DO NOTHING
RETURNING order_id";

pub(super) const FIND_SAME_REQUEST_ORDER: &str = "
SELECT order_id
FROM orders
WHERE reservation_id = $1 OR (request_id = $2 AND user_id = $4) OR source_message_id = $3
LIMIT 1";

pub(super) const FIND_USER_ORDER: &str = "
SELECT order_id
FROM orders
WHERE activity_id = $1 AND sku_id = $2 AND user_id = $3";

/// $4 units at once (the per-message path takes 1; `set_based::TAKE_UNITS` is the
/// same UPDATE with the ledger rows); `version` counts units taken.
pub(super) const ALLOCATE_UNITS: &str = allocate_units!();

/// Through migration V9's function: the runtime role has no DELETE on orders, and
/// the function deletes only rows this transaction inserted. One row per order
/// deleted, so the affected-row count is the deleted count.
pub(super) const DELETE_PROVISIONAL_ORDER: &str =
    "SELECT * FROM drop_provisional_orders(ARRAY[$1::int8])";

pub(super) const INSERT_ORDER_ITEM: &str = "
INSERT INTO order_items (
    order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price, line_amount
)
VALUES ($1, 1, $2, $3, $4, 1, $5, $5)";

pub(super) const INSERT_ALLOCATE_LEDGER: &str = "
INSERT INTO inventory_ledger (
    ledger_id, idempotency_key, reservation_id, order_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, ledger_type,
    available_delta, allocated_delta,
    before_available, after_available, before_allocated, after_allocated, reason
)
VALUES (
    $1, 'ALLOCATE:' || $2::uuid::text, $2, $3, $4, $5, $6, $7, $8, $9,
    -1, 1, $10, $11, $12, $13, 'ORDER_CREATED'
)
ON CONFLICT (idempotency_key) DO NOTHING";

pub(super) const MARK_RESERVATION_ORDERED: &str = "
UPDATE inventory_reservation
SET status = $3,
    order_id = $2,
    ordered_at = statement_timestamp(),
    version = version + 1,
    updated_at = statement_timestamp()
WHERE reservation_id = $1
  AND status = $4";

pub(super) const REJECT_RESERVATION: &str = "
UPDATE inventory_reservation
SET status = $3,
    failure_code = $2,
    version = version + 1,
    updated_at = statement_timestamp()
WHERE reservation_id = $1
  AND status = $4";

pub(super) const INSERT_RESERVATIONS: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, redis_reserved_at, expires_at
)
SELECT m.reservation_id, m.request_id, m.message_id, $1::int8, $2::int8, m.user_id,
       $3::int2, 1, 0, m.reserved_at, m.expires_at
FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::int8[], $8::timestamptz[],
            $9::timestamptz[])
     AS m(reservation_id, request_id, message_id, user_id, reserved_at, expires_at)
ON CONFLICT DO NOTHING
RETURNING reservation_id";

/// The fresh way's reservations, written as `MARK_RESERVATIONS_ORDERED` would leave
/// them after `INSERT_RESERVATIONS`: ORDERED with their order, at version 1. One
/// heap tuple per reservation instead of an inserted one and its updated copy, and
/// four index entries instead of nine (the update changes the indexed `order_id`).
/// For reservations taken to be new: one that exists fails the statement (23505).
pub(super) const INSERT_ORDERED_RESERVATIONS: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, order_id, redis_reserved_at, expires_at,
    ordered_at, version
)
SELECT m.reservation_id, m.request_id, m.message_id, $1::int8, $2::int8, m.user_id,
       $3::int2, 1, $10::int2, m.order_id, m.reserved_at, m.expires_at,
       statement_timestamp(), 1
FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::int8[], $8::timestamptz[],
            $9::timestamptz[], $11::int8[])
     AS m(reservation_id, request_id, message_id, user_id, reserved_at, expires_at,
          order_id)";

/// The sold-out way's reservations, written as `REJECT_RESERVATIONS` would leave
/// them after `INSERT_RESERVATIONS`: status $10 with failure code $11, at version 1.
/// For reservations taken to be new: one that exists fails the statement (23505).
pub(super) const INSERT_REJECTED_RESERVATIONS: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, failure_code, redis_reserved_at, expires_at,
    version
)
SELECT m.reservation_id, m.request_id, m.message_id, $1::int8, $2::int8, m.user_id,
       $3::int2, 1, $10::int2, $11::text, m.reserved_at, m.expires_at, 1
FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::int8[], $8::timestamptz[],
            $9::timestamptz[])
     AS m(reservation_id, request_id, message_id, user_id, reserved_at, expires_at)";

/// `reservation_verdict`'s columns, then the reservation id; locked in key order so
/// two transactions locking overlapping sets cannot deadlock.
pub(super) const LOCK_RESERVATIONS: &str = "
SELECT request_id, activity_id, sku_id, user_id, inventory_bucket, order_id, status,
       reservation_id
FROM inventory_reservation
WHERE reservation_id = ANY ($1::uuid[])
ORDER BY reservation_id
FOR UPDATE";

/// The orders of a segment's messages; see `INSERT_ORDERS` and `INSERT_NEW_ORDERS`.
macro_rules! insert_orders_then {
    ($tail:literal) => {
        concat!(
            "
INSERT INTO orders (
    order_id, order_no, request_id, reservation_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, quantity,
    unit_price, total_amount, currency, status, expire_at
)
SELECT m.order_id, m.order_no, m.request_id, m.reservation_id, m.message_id,
       $1::int8, $2::int8, m.user_id, $3::int2, 1,
       m.unit_price, m.unit_price, m.currency, 10, m.expire_at
FROM unnest($4::int8[], $5::text[], $6::uuid[], $7::uuid[], $8::uuid[], $9::int8[],
            $10::int8[], $11::text[], $12::timestamptz[])
     AS m(order_id, order_no, request_id, reservation_id, message_id, user_id,
          unit_price, currency, expire_at)",
            $tail
        )
    };
}

/// Returns the orders written; one that conflicts with an existing order on any of
/// its unique keys is not.
pub(super) const INSERT_ORDERS: &str = insert_orders_then!(
    "
ON CONFLICT DO NOTHING
RETURNING order_id"
);

/// For orders taken to be new: one that conflicts fails the statement (23505).
pub(super) const INSERT_NEW_ORDERS: &str = insert_orders_then!("");

/// As `DELETE_PROVISIONAL_ORDER`, for many.
pub(super) const DELETE_PROVISIONAL_ORDERS: &str =
    "SELECT * FROM drop_provisional_orders($1::int8[])";

pub(super) const INSERT_ORDER_ITEMS: &str = "
INSERT INTO order_items (
    order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price, line_amount
)
SELECT m.order_id, 1, $1::int8, $2::int8, $3::text, 1, m.unit_price, m.unit_price
FROM unnest($4::int8[], $5::int8[]) AS m(order_id, unit_price)";

/// Takes $4 units from the bucket if it holds them (`allocate_units!`) and writes
/// the ledger rows of the orders that get them. The k-th order sees the bucket as if
/// the units had been taken one at a time: its before values are the after values of
/// order k-1. A macro so that both statements below stay static SQL.
macro_rules! take_units_then {
    ($select:literal) => {
        concat!(
            "
WITH taken AS (",
            allocate_units!(),
            "
), ledger AS (
    INSERT INTO inventory_ledger (
        ledger_id, idempotency_key, reservation_id, order_id, source_message_id,
        activity_id, sku_id, user_id, inventory_bucket, ledger_type,
        available_delta, allocated_delta,
        before_available, after_available, before_allocated, after_allocated, reason
    )
    SELECT m.ledger_id, 'ALLOCATE:' || m.reservation_id::text, m.reservation_id,
           m.order_id, m.message_id, $1::int8, $2::int8, m.user_id, $3::int2, $5::int2,
           -1, 1,
           t.before_available - (m.k::int4 - 1), t.before_available - m.k::int4,
           t.before_allocated + (m.k::int4 - 1), t.before_allocated + m.k::int4,
           'ORDER_CREATED'
    FROM taken AS t
    CROSS JOIN unnest($6::int8[], $7::uuid[], $8::int8[], $9::uuid[], $10::int8[])
         WITH ORDINALITY AS m(ledger_id, reservation_id, order_id, message_id, user_id, k)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
)
",
            $select
        )
    };
}

/// `take_units_then` returning the ledger rows written; no row when the bucket
/// holds fewer than $4 units.
pub(super) const TAKE_UNITS: &str =
    take_units_then!("SELECT (SELECT count(*) FROM ledger) FROM taken");

/// `take_units_then` for all $4 orders or none: when the bucket holds fewer units
/// (or an order already has its ledger row), the statement fails with SQLSTATE
/// SK001 and aborts the transaction, so a COMMIT sent right behind it rolls back.
pub(super) const TAKE_ALL: &str = take_units_then!(
    "SELECT abort_unless((SELECT count(*) FROM ledger) = $4, 'the bucket holds fewer units than the batch takes')"
);

/// Fails with SK001 unless the bucket is empty and no order holds any of the
/// segment's order keys: then the careful way would insert every provisional order,
/// take no unit and delete them all. Each key is looked up in an index that leads
/// with it. A user's orders are found one user at a time, by user alone, and the
/// SKU is checked on the rows (`IS NOT DISTINCT FROM` is no index condition). On a
/// sale's fresh tables the generic plan PostgreSQL makes for the plain form (the
/// activity and SKU as index conditions) read every order of the SKU from
/// `idx_orders_activity_status` once per batch, and the one for `user_id = ANY`
/// read the whole of `uq_orders_user_sku` by its last column (docs/benchmarks-history.md,
/// 2026-12-01, 2ef46aa).
pub(super) const CHECK_SOLD_OUT: &str = "
SELECT abort_unless(
    (SELECT available_stock = 0 FROM sku_inventory
     WHERE activity_id = $1 AND sku_id = $2 AND bucket_no = $3)
    AND NOT EXISTS (SELECT 1 FROM orders WHERE order_id = ANY ($4::int8[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE order_no = ANY ($5::text[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE request_id = ANY ($6::uuid[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE reservation_id = ANY ($7::uuid[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE source_message_id = ANY ($8::uuid[]))
    AND NOT EXISTS (
        SELECT 1
        FROM unnest($9::int8[]) AS m(user_id)
        CROSS JOIN LATERAL (
            SELECT 1 FROM orders
            WHERE user_id = m.user_id
              AND (activity_id, sku_id) IS NOT DISTINCT FROM ($1, $2)
            OFFSET 0
        ) AS o
    ),
    'the bucket holds a unit, or an order holds a key of the batch')";

pub(super) const LOCK_INVENTORY: &str = "
SELECT available_stock
FROM sku_inventory
WHERE activity_id = $1 AND sku_id = $2 AND bucket_no = $3
FOR UPDATE";

/// See `MARK_RESERVATION_ORDERED` for why the statuses are parameters.
pub(super) const MARK_RESERVATIONS_ORDERED: &str = "
UPDATE inventory_reservation AS r
SET status = $1,
    order_id = m.order_id,
    ordered_at = statement_timestamp(),
    version = r.version + 1,
    updated_at = statement_timestamp()
FROM unnest($3::uuid[], $4::int8[]) AS m(reservation_id, order_id)
WHERE r.reservation_id = m.reservation_id
  AND r.status = $2";

pub(super) const REJECT_RESERVATIONS: &str = "
UPDATE inventory_reservation AS r
SET status = $1,
    failure_code = $3,
    version = r.version + 1,
    updated_at = statement_timestamp()
FROM unnest($4::uuid[]) AS m(reservation_id)
WHERE r.reservation_id = m.reservation_id
  AND r.status = $2";
