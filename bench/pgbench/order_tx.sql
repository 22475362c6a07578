-- One ORDER_CREATED order transaction, statement for statement the happy path of
-- create_order_once (src/store/orders.rs) with INSERT_EVENT (src/store/outbox.rs).
-- Run with: pgbench -n -M prepared -D buckets=N -f order_tx.sql
-- in a database prepared by setup.sql, search_path = seckill (PGOPTIONS or the
-- server default). Statement numbers refer to README.md.
--
-- Ids: order_id (also user_id and ledger_id, each unique per order) comes from the
-- global sequence pgbench_order_id, so B-tree inserts land at the right edge as with
-- the engine's time-ordered ids; message/request/reservation/event ids are random
-- UUIDs (gen_random_uuid()). Everything the engine computes on the client side is
-- computed by statement [1], which is the engine's SET_TIMEOUTS round trip.

\set bucket random(0, :buckets - 1)
\set activity_id 1
\set sku_id 1
\set unit_price 9900
\set ledger_type_allocate 10
\set reservation_ordered 10
\set reservation_pending_db 0

-- [0] client.transaction()
BEGIN;

-- [1] SET_TIMEOUTS (config/default.toml's database.statement_timeout_ms; no lock
--     timeout: the engine retries a transaction whose lock wait timed out, where
--     pgbench would abort its client, see README.md), plus the message fields the
--     engine gets from the order.create message and its context (ids, order_no,
--     payload hash, event payload, constants that the engine binds as parameters).
SELECT set_config('lock_timeout', '0', true) AS lock_timeout,
       set_config('statement_timeout', '1200ms', true) AS statement_timeout,
       m.order_id,
       m.order_id AS user_id,
       m.order_id AS ledger_id,
       'SK' || reverse(lpad(m.order_id::text, 18, '0')) AS order_no,
       m.message_id,
       m.request_id,
       m.reservation_id,
       m.event_id,
       m.reservation_id::text AS inbox_message_key,
       sha256(uuid_send(m.message_id)) AS payload_hash,
       m.reserved_at,
       m.reserved_at + interval '600000 milliseconds' AS reservation_expires_at,
       m.reserved_at + interval '1 hour' AS order_expire_at,
       'order-create-consumer' AS consumer_group,
       'seckill.order.create.0' AS topic,
       'CNY' AS currency,
       'bench' AS sku_title,
       'ORDER_CREATED:' || m.order_id AS dedup_key,
       'ORDER' AS aggregate_type,
       'SECKILL_EVENTS' AS event_topic,
       'ORDER_CREATED' AS event_tag,
       json_build_object(
           'order_id', m.order_id,
           'order_no', 'SK' || reverse(lpad(m.order_id::text, 18, '0')),
           'reservation_id', m.reservation_id,
           'request_id', m.request_id,
           'activity_id', :activity_id::bigint,
           'sku_id', :sku_id::bigint,
           'user_id', m.order_id,
           'inventory_bucket', :bucket::smallint,
           'unit_price', :unit_price::bigint,
           'total_amount', :unit_price::bigint,
           'currency', 'CNY',
           'status', 'Created',
           'expire_at', m.reserved_at + interval '1 hour'
       )::text AS payload
FROM (
    SELECT nextval('pgbench_order_id') AS order_id,
           gen_random_uuid() AS message_id,
           gen_random_uuid() AS request_id,
           gen_random_uuid() AS reservation_id,
           gen_random_uuid() AS event_id,
           statement_timestamp() AS reserved_at
) AS m
\gset

-- [2] INSERT_INBOX (§9.1)
INSERT INTO consumer_inbox (
    consumer_group, message_id, topic, tag, message_key, reservation_id, payload_hash,
    status, result_code, order_id
)
VALUES (:consumer_group, :message_id, :topic, 'ORDER_CREATE', :inbox_message_key, :reservation_id, :payload_hash, 20, 'ORDER_CREATED', :order_id)
ON CONFLICT (consumer_group, message_id) DO NOTHING;

-- [3] INSERT_RESERVATION (§9.2)
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, redis_reserved_at, expires_at
)
VALUES (:reservation_id, :request_id, :message_id, :activity_id, :sku_id, :user_id, :bucket, 1, 0, :reserved_at, :reservation_expires_at)
ON CONFLICT DO NOTHING;

-- [4] LOCK_RESERVATION (§9.2)
SELECT request_id, activity_id, sku_id, user_id, inventory_bucket, order_id, status
FROM inventory_reservation
WHERE reservation_id = :reservation_id
FOR UPDATE;

-- [5] INSERT_ORDER (§9.3)
INSERT INTO orders (
    order_id, order_no, request_id, reservation_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, quantity,
    unit_price, total_amount, currency, status, expire_at
)
VALUES (:order_id, :order_no, :request_id, :reservation_id, :message_id, :activity_id, :sku_id, :user_id, :bucket, 1, :unit_price, :unit_price, :currency, 10, :order_expire_at)
ON CONFLICT DO NOTHING
RETURNING order_id;

-- [6] ALLOCATE_INVENTORY (§9.4): the conditional UPDATE on the chosen bucket. \gset
--     fails the transaction if it returns no row (sold out), which setup.sql's stock
--     rules out.
UPDATE sku_inventory
SET available_stock = available_stock - 1,
    allocated_stock = allocated_stock + 1,
    version = version + 1,
    updated_at = statement_timestamp()
WHERE activity_id = :activity_id
  AND sku_id = :sku_id
  AND bucket_no = :bucket
  AND available_stock >= 1
RETURNING
    available_stock + 1 AS before_available,
    available_stock AS after_available,
    allocated_stock - 1 AS before_allocated,
    allocated_stock AS after_allocated
\gset

-- [7] INSERT_ORDER_ITEM (§9.5 order item)
INSERT INTO order_items (
    order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price, line_amount
)
VALUES (:order_id, 1, :activity_id, :sku_id, :sku_title, 1, :unit_price, :unit_price);

-- [8] INSERT_ALLOCATE_LEDGER (§9.5)
INSERT INTO inventory_ledger (
    ledger_id, idempotency_key, reservation_id, order_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, ledger_type,
    available_delta, allocated_delta,
    before_available, after_available, before_allocated, after_allocated, reason
)
VALUES (
    :ledger_id, 'ALLOCATE:' || :reservation_id::uuid::text, :reservation_id, :order_id, :message_id, :activity_id, :sku_id, :user_id, :bucket, :ledger_type_allocate,
    -1, 1, :before_available, :after_available, :before_allocated, :after_allocated, 'ORDER_CREATED'
)
ON CONFLICT (idempotency_key) DO NOTHING;

-- [9] MARK_RESERVATION_ORDERED (§9.6); statuses bound as parameters like the engine
UPDATE inventory_reservation
SET status = :reservation_ordered,
    order_id = :order_id,
    ordered_at = statement_timestamp(),
    version = version + 1,
    updated_at = statement_timestamp()
WHERE reservation_id = :reservation_id
  AND status = :reservation_pending_db;

-- [10] INSERT_EVENT (§9.7, src/store/outbox.rs)
INSERT INTO event_outbox (
    event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
    schema_version, payload, status
)
VALUES (:event_id, :dedup_key, :aggregate_type, :order_id, :event_topic, :event_tag, :order_id, 1, :payload, 0)
ON CONFLICT (dedup_key) DO NOTHING;

-- [11] commit(tx)
COMMIT;
