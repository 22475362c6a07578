-- :batch ORDER_CREATED orders in one transaction (group commit): the statements of
-- order_tx.sql made set-based. Every order writes the same rows as in order_tx.sql
-- (inbox, reservation inserted then updated to ORDERED, order, item, ledger, outbox);
-- the inventory row of the chosen bucket is updated ONCE per transaction, taking
-- :batch units with one conditional UPDATE. All orders of a transaction share one
-- bucket.
-- Run with: pgbench -n -M prepared -D buckets=N -D batch=B -f order_tx_batch.sql
-- Statement numbers refer to order_tx.sql / README.md.

\set bucket random(0, :buckets - 1)
\set activity_id 1
\set sku_id 1
\set unit_price 9900
\set ledger_type_allocate 10
\set reservation_ordered 10
\set reservation_pending_db 0

-- [0]
BEGIN;

-- [1] SET_TIMEOUTS (no lock timeout, as in order_tx.sql) + the :batch messages, as
--     parallel arrays (one element per order; order_ids from the global sequence,
--     so they are unique whatever else runs).
SELECT set_config('lock_timeout', '0', true) AS lock_timeout,
       set_config('statement_timeout', '1200ms', true) AS statement_timeout,
       'order-create-consumer' AS consumer_group,
       'seckill.order.create.0' AS topic,
       'CNY' AS currency,
       'bench' AS sku_title,
       'ORDER' AS aggregate_type,
       'SECKILL_EVENTS' AS event_topic,
       'ORDER_CREATED' AS event_tag,
       array_agg(m.order_id ORDER BY m.n) AS order_ids,
       array_agg('SK' || reverse(lpad(m.order_id::text, 18, '0')) ORDER BY m.n) AS order_nos,
       array_agg(m.message_id ORDER BY m.n) AS message_ids,
       array_agg(m.request_id ORDER BY m.n) AS request_ids,
       array_agg(m.reservation_id ORDER BY m.n) AS reservation_ids,
       array_agg(m.event_id ORDER BY m.n) AS event_ids,
       array_agg(sha256(uuid_send(m.message_id)) ORDER BY m.n) AS payload_hashes,
       array_agg(json_build_object(
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
       )::jsonb ORDER BY m.n) AS payloads,
       min(m.reserved_at) AS reserved_at,
       min(m.reserved_at) + interval '600000 milliseconds' AS reservation_expires_at,
       min(m.reserved_at) + interval '1 hour' AS order_expire_at
FROM (
    SELECT n,
           nextval('pgbench_order_id') AS order_id,
           gen_random_uuid() AS message_id,
           gen_random_uuid() AS request_id,
           gen_random_uuid() AS reservation_id,
           gen_random_uuid() AS event_id,
           statement_timestamp() AS reserved_at
    FROM generate_series(1, :batch) AS n
) AS m
\gset

-- [2] INSERT_INBOX
INSERT INTO consumer_inbox (
    consumer_group, message_id, topic, tag, message_key, reservation_id, payload_hash,
    status, result_code, order_id
)
SELECT :consumer_group, m.message_id, :topic, 'ORDER_CREATE', m.reservation_id::text, m.reservation_id, m.payload_hash, 20, 'ORDER_CREATED', m.order_id
FROM unnest(:message_ids::uuid[], :reservation_ids::uuid[], :payload_hashes::bytea[], :order_ids::bigint[])
     AS m(message_id, reservation_id, payload_hash, order_id)
ON CONFLICT (consumer_group, message_id) DO NOTHING;

-- [3] INSERT_RESERVATION (user_id = order_id, as in order_tx.sql)
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, redis_reserved_at, expires_at
)
SELECT m.reservation_id, m.request_id, m.message_id, :activity_id, :sku_id, m.order_id, :bucket, 1, 0, :reserved_at, :reservation_expires_at
FROM unnest(:reservation_ids::uuid[], :request_ids::uuid[], :message_ids::uuid[], :order_ids::bigint[])
     AS m(reservation_id, request_id, message_id, order_id)
ON CONFLICT DO NOTHING;

-- [4] LOCK_RESERVATION, all :batch rows (primary-key order, as a batching engine
--     would lock them)
SELECT request_id, activity_id, sku_id, user_id, inventory_bucket, order_id, status
FROM inventory_reservation
WHERE reservation_id = ANY (:reservation_ids::uuid[])
ORDER BY reservation_id
FOR UPDATE;

-- [5] INSERT_ORDER
INSERT INTO orders (
    order_id, order_no, request_id, reservation_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, quantity,
    unit_price, total_amount, currency, status, expire_at
)
SELECT m.order_id, m.order_no, m.request_id, m.reservation_id, m.message_id, :activity_id, :sku_id, m.order_id, :bucket, 1, :unit_price, :unit_price, :currency, 10, :order_expire_at
FROM unnest(:order_ids::bigint[], :order_nos::text[], :request_ids::uuid[], :reservation_ids::uuid[], :message_ids::uuid[])
     AS m(order_id, order_no, request_id, reservation_id, message_id)
ON CONFLICT DO NOTHING
RETURNING order_id;

-- [6] ALLOCATE_INVENTORY: ONE conditional UPDATE taking :batch units (§9.4 with
--     quantity $4 = :batch). \gset fails the transaction if no row matched.
UPDATE sku_inventory
SET available_stock = available_stock - :batch,
    allocated_stock = allocated_stock + :batch,
    version = version + 1,
    updated_at = statement_timestamp()
WHERE activity_id = :activity_id
  AND sku_id = :sku_id
  AND bucket_no = :bucket
  AND available_stock >= :batch
RETURNING
    available_stock + :batch AS before_available,
    available_stock AS after_available,
    allocated_stock - :batch AS before_allocated,
    allocated_stock AS after_allocated
\gset

-- [7] INSERT_ORDER_ITEM
INSERT INTO order_items (
    order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price, line_amount
)
SELECT m.order_id, 1, :activity_id, :sku_id, :sku_title, 1, :unit_price, :unit_price
FROM unnest(:order_ids::bigint[]) AS m(order_id);

-- [8] INSERT_ALLOCATE_LEDGER: one row per order; the k-th order sees the bucket as
--     if the units had been taken one at a time (before = after of order k-1).
INSERT INTO inventory_ledger (
    ledger_id, idempotency_key, reservation_id, order_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, ledger_type,
    available_delta, allocated_delta,
    before_available, after_available, before_allocated, after_allocated, reason
)
SELECT m.order_id, 'ALLOCATE:' || m.reservation_id::text, m.reservation_id, m.order_id, m.message_id, :activity_id, :sku_id, m.order_id, :bucket, :ledger_type_allocate,
       -1, 1,
       :before_available::int - (m.k::int - 1), :before_available::int - m.k::int,
       :before_allocated::int + (m.k::int - 1), :before_allocated::int + m.k::int,
       'ORDER_CREATED'
FROM unnest(:order_ids::bigint[], :reservation_ids::uuid[], :message_ids::uuid[]) WITH ORDINALITY
     AS m(order_id, reservation_id, message_id, k)
ON CONFLICT (idempotency_key) DO NOTHING;

-- [9] MARK_RESERVATION_ORDERED
UPDATE inventory_reservation AS r
SET status = :reservation_ordered,
    order_id = m.order_id,
    ordered_at = statement_timestamp(),
    version = r.version + 1,
    updated_at = statement_timestamp()
FROM unnest(:reservation_ids::uuid[], :order_ids::bigint[]) AS m(reservation_id, order_id)
WHERE r.reservation_id = m.reservation_id
  AND r.status = :reservation_pending_db;

-- [10] INSERT_EVENT
INSERT INTO event_outbox (
    event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
    schema_version, payload, status
)
SELECT m.event_id, 'ORDER_CREATED:' || m.order_id, :aggregate_type, m.order_id::text, :event_topic, :event_tag, m.order_id::text, 1, m.payload, 0
FROM unnest(:event_ids::uuid[], :order_ids::bigint[], :payloads::jsonb[]) AS m(event_id, order_id, payload)
ON CONFLICT (dedup_key) DO NOTHING;

-- [11]
COMMIT;
