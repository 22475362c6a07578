-- Seeds a scratch database that already has migrations/V1__schema.sql applied, for
-- order_tx.sql / order_tx_batch.sql:
--   psql -X -v ON_ERROR_STOP=1 -v buckets=N [-v stock_per_bucket=S] -d DB -f setup.sql
-- One running activity (activity_id 1) with one on-sale SKU (sku_id 1, 'bench',
-- 9900 CNY) whose stock is split over N inventory buckets (0..N-1), and the
-- sequence pgbench_order_id the scripts take order ids from.
-- Stock per bucket defaults to min(100,000,000, 2^31-1 / N), so planned_stock
-- (INTEGER) still equals the sum of the buckets and no bucket can run out during
-- a run.
\set ON_ERROR_STOP on
\if :{?buckets}
\else
\set buckets 1
\endif
\if :{?stock_per_bucket}
\else
SELECT least(100000000, 2147483647 / :buckets) AS stock_per_bucket \gset
\endif

SET search_path = seckill, public;

BEGIN;

INSERT INTO seckill_activity (activity_id, activity_name, status, start_at, end_at, rules)
VALUES (1, 'pgbench', 20, statement_timestamp() - interval '1 second',
        statement_timestamp() + interval '7 days', '{"order_ttl_ms": 3600000}');

INSERT INTO seckill_sku (activity_id, sku_id, sku_title, status, unit_price, currency,
                         planned_stock, inventory_bucket_count)
VALUES (1, 1, 'bench', 10, 9900, 'CNY', :stock_per_bucket * :buckets, :buckets);

INSERT INTO sku_inventory (activity_id, sku_id, bucket_no, total_stock, available_stock)
SELECT 1, 1, b, :stock_per_bucket, :stock_per_bucket
FROM generate_series(0, :buckets - 1) AS b;

-- Order ids (also user and ledger ids): global and increasing like the engine's
-- time-ordered ids. No CACHE, so concurrent sessions interleave like one node's
-- generator.
CREATE SEQUENCE pgbench_order_id;

COMMIT;

-- Statistics for the seeded rows only; the order tables start empty and are left to
-- autovacuum, as in the engine's database.
ANALYZE seckill_activity, seckill_sku, sku_inventory;
