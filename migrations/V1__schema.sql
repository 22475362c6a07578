-- Seed §8.2: the complete data model, verbatim apart from `SET LOCAL` (refinery runs
-- each migration in its own transaction, so the search_path does not leak into the
-- session) and the per-table autovacuum settings of §10.6 at the end.
-- Status codes are SMALLINT + CHECK (§8.1); src/domain/status.rs mirrors them and
-- tests/schema.rs proves the two agree.
CREATE SCHEMA IF NOT EXISTS seckill;
SET LOCAL search_path = seckill, public;
-- =========================================================
-- 1. 秒杀活动
-- =========================================================
CREATE TABLE seckill_activity (
activity_id BIGINT PRIMARY KEY,
activity_name VARCHAR(128) NOT NULL,
status SMALLINT NOT NULL DEFAULT 0,
start_at TIMESTAMPTZ NOT NULL,
end_at TIMESTAMPTZ NOT NULL,
rules JSONB NOT NULL DEFAULT '{}'::jsonb,
version BIGINT NOT NULL DEFAULT 0,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT ck_activity_status
CHECK (status IN (0, 10, 20, 30, 40)),
CONSTRAINT ck_activity_time
CHECK (start_at < end_at),
CONSTRAINT ck_activity_version
CHECK (version >= 0)
);
CREATE INDEX idx_activity_status_time
ON seckill_activity (status, start_at, end_at);
-- =========================================================
-- 2. 活动 SKU
-- =========================================================
CREATE TABLE seckill_sku (
activity_id BIGINT NOT NULL,
sku_id BIGINT NOT NULL,
sku_title VARCHAR(256) NOT NULL,
status SMALLINT NOT NULL DEFAULT 10,
unit_price BIGINT NOT NULL,
currency VARCHAR(3) NOT NULL DEFAULT 'CNY',
planned_stock INTEGER NOT NULL,
per_user_limit SMALLINT NOT NULL DEFAULT 1,
inventory_bucket_count SMALLINT NOT NULL DEFAULT 1,
version BIGINT NOT NULL DEFAULT 0,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT pk_seckill_sku
PRIMARY KEY (activity_id, sku_id),
CONSTRAINT fk_sku_activity
FOREIGN KEY (activity_id)
REFERENCES seckill_activity (activity_id)
ON DELETE RESTRICT,
CONSTRAINT ck_sku_status
CHECK (status IN (10, 20, 30, 40)),
CONSTRAINT ck_sku_price
CHECK (unit_price >= 0),
CONSTRAINT ck_sku_stock
CHECK (planned_stock >= 0),
CONSTRAINT ck_sku_limit
CHECK (per_user_limit = 1),
CONSTRAINT ck_sku_bucket_count
CHECK (inventory_bucket_count BETWEEN 1 AND 256),
CONSTRAINT ck_sku_version
CHECK (version >= 0)
);
-- =========================================================
-- 3. PostgreSQL 最终库存
-- bucket_no = 0 时为不分桶模式
-- =========================================================
CREATE TABLE sku_inventory (
activity_id BIGINT NOT NULL,
sku_id BIGINT NOT NULL,
bucket_no SMALLINT NOT NULL DEFAULT 0,
total_stock INTEGER NOT NULL,
available_stock INTEGER NOT NULL,
allocated_stock INTEGER NOT NULL DEFAULT 0,
version BIGINT NOT NULL DEFAULT 0,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT pk_sku_inventory
PRIMARY KEY (activity_id, sku_id, bucket_no),
CONSTRAINT fk_inventory_sku
FOREIGN KEY (activity_id, sku_id)
REFERENCES seckill_sku (activity_id, sku_id)
ON DELETE RESTRICT,
CONSTRAINT ck_inventory_bucket
CHECK (bucket_no >= 0),
CONSTRAINT ck_inventory_nonnegative
CHECK (
total_stock >= 0
AND available_stock >= 0
AND allocated_stock >= 0
),
CONSTRAINT ck_inventory_conservation
CHECK (total_stock = available_stock + allocated_stock),
CONSTRAINT ck_inventory_version
CHECK (version >= 0)
)
WITH (fillfactor = 80);
-- =========================================================
-- 4. 库存预占落库记录
-- =========================================================
CREATE TABLE inventory_reservation (
reservation_id UUID PRIMARY KEY,
request_id UUID NOT NULL,
first_message_id UUID NOT NULL,
activity_id BIGINT NOT NULL,
sku_id BIGINT NOT NULL,
user_id BIGINT NOT NULL,
inventory_bucket SMALLINT NOT NULL,
quantity SMALLINT NOT NULL DEFAULT 1,
order_id BIGINT,
status SMALLINT NOT NULL DEFAULT 0,
failure_code VARCHAR(64),
redis_reserved_at TIMESTAMPTZ NOT NULL,
expires_at TIMESTAMPTZ NOT NULL,
ordered_at TIMESTAMPTZ,
released_at TIMESTAMPTZ,
version BIGINT NOT NULL DEFAULT 0,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT uq_reservation_request
UNIQUE (request_id),
CONSTRAINT uq_reservation_order
UNIQUE (order_id),
CONSTRAINT ck_reservation_status
CHECK (status IN (0, 10, 20, 30, 40, 50, 60)),
CONSTRAINT ck_reservation_quantity
CHECK (quantity = 1),
CONSTRAINT ck_reservation_bucket
CHECK (inventory_bucket >= 0),
CONSTRAINT ck_reservation_time
CHECK (redis_reserved_at < expires_at),
CONSTRAINT ck_reservation_ordered
CHECK (status <> 10 OR order_id IS NOT NULL),
CONSTRAINT ck_reservation_released
CHECK (status <> 40 OR released_at IS NOT NULL),
CONSTRAINT ck_reservation_version
CHECK (version >= 0)
);
CREATE INDEX idx_reservation_user_sku
ON inventory_reservation (activity_id, sku_id, user_id, created_at DESC);
CREATE INDEX idx_reservation_pending_expire
ON inventory_reservation (expires_at, reservation_id)
WHERE status IN (0, 30);
-- =========================================================
-- 5. 订单
-- order_id 由应用生成时间有序 BIGINT
-- order_no 用于对外展示，避免暴露连续主键
-- =========================================================
CREATE TABLE orders (
order_id BIGINT PRIMARY KEY,
order_no VARCHAR(40) NOT NULL,
request_id UUID NOT NULL,
reservation_id UUID NOT NULL,
source_message_id UUID NOT NULL,
activity_id BIGINT NOT NULL,
sku_id BIGINT NOT NULL,
user_id BIGINT NOT NULL,
inventory_bucket SMALLINT NOT NULL,
quantity SMALLINT NOT NULL DEFAULT 1,
unit_price BIGINT NOT NULL,
total_amount BIGINT NOT NULL,
currency VARCHAR(3) NOT NULL DEFAULT 'CNY',
status SMALLINT NOT NULL DEFAULT 10,
expire_at TIMESTAMPTZ NOT NULL,
paid_at TIMESTAMPTZ,
cancelled_at TIMESTAMPTZ,
cancel_reason VARCHAR(64),
version BIGINT NOT NULL DEFAULT 0,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT uq_orders_order_no
UNIQUE (order_no),
CONSTRAINT uq_orders_request
UNIQUE (request_id),
CONSTRAINT uq_orders_reservation
UNIQUE (reservation_id),
CONSTRAINT uq_orders_source_message
UNIQUE (source_message_id),
CONSTRAINT uq_orders_user_sku
UNIQUE (activity_id, sku_id, user_id),
CONSTRAINT ck_orders_status
CHECK (status IN (10, 20, 30, 40, 50, 60)),
CONSTRAINT ck_orders_quantity
CHECK (quantity = 1),
CONSTRAINT ck_orders_amount
CHECK (
unit_price >= 0
AND total_amount = unit_price * quantity
),
CONSTRAINT ck_orders_bucket
CHECK (inventory_bucket >= 0),
CONSTRAINT ck_orders_paid_at
CHECK (status <> 30 OR paid_at IS NOT NULL),
CONSTRAINT ck_orders_cancelled_at
CHECK (status <> 40 OR cancelled_at IS NOT NULL),
CONSTRAINT ck_orders_version
CHECK (version >= 0)
);
CREATE INDEX idx_orders_user_created
ON orders (user_id, created_at DESC)
INCLUDE (
order_id,
activity_id,
sku_id,
status,
total_amount,
expire_at
);
CREATE INDEX idx_orders_activity_status
ON orders (activity_id, sku_id, status)
INCLUDE (order_id, user_id, quantity);
CREATE INDEX idx_orders_expirable
ON orders (expire_at, order_id)
WHERE status IN (10, 20);
-- =========================================================
-- 6. 订单明细
-- =========================================================
CREATE TABLE order_items (
order_id BIGINT NOT NULL,
line_no SMALLINT NOT NULL,
activity_id BIGINT NOT NULL,
sku_id BIGINT NOT NULL,
sku_title VARCHAR(256) NOT NULL,
quantity SMALLINT NOT NULL,
unit_price BIGINT NOT NULL,
line_amount BIGINT NOT NULL,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT pk_order_items
PRIMARY KEY (order_id, line_no),
CONSTRAINT fk_order_items_order
FOREIGN KEY (order_id)
REFERENCES orders (order_id)
ON DELETE RESTRICT,
CONSTRAINT ck_order_item_line
CHECK (line_no > 0),
CONSTRAINT ck_order_item_quantity
CHECK (quantity > 0),
CONSTRAINT ck_order_item_amount
CHECK (
unit_price >= 0
AND line_amount = unit_price * quantity
)
);
-- =========================================================
-- 7. 支付记录
-- 允许一个订单存在多次支付尝试
-- =========================================================
CREATE TABLE payment_record (
payment_id UUID PRIMARY KEY,
payment_request_id UUID NOT NULL,
order_id BIGINT NOT NULL,
provider VARCHAR(32) NOT NULL,
provider_trade_no VARCHAR(128),
callback_id VARCHAR(128),
amount BIGINT NOT NULL,
currency VARCHAR(3) NOT NULL DEFAULT 'CNY',
status SMALLINT NOT NULL DEFAULT 0,
raw_payload JSONB NOT NULL DEFAULT '{}'::jsonb,
paid_at TIMESTAMPTZ,
version BIGINT NOT NULL DEFAULT 0,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT uq_payment_request
UNIQUE (payment_request_id),
CONSTRAINT uq_payment_provider_trade
UNIQUE (provider, provider_trade_no),
CONSTRAINT uq_payment_callback
UNIQUE (provider, callback_id),
CONSTRAINT fk_payment_order
FOREIGN KEY (order_id)
REFERENCES orders (order_id)
ON DELETE RESTRICT,
CONSTRAINT ck_payment_status
CHECK (status IN (0, 10, 20, 30, 40, 50)),
CONSTRAINT ck_payment_amount
CHECK (amount >= 0),
CONSTRAINT ck_payment_paid_at
CHECK (status <> 20 OR paid_at IS NOT NULL),
CONSTRAINT ck_payment_version
CHECK (version >= 0)
);
CREATE INDEX idx_payment_order_created
ON payment_record (order_id, created_at DESC)
INCLUDE (payment_id, provider, provider_trade_no, status, amount);
-- =========================================================
-- 8. 库存流水
-- available_delta + allocated_delta 必须为 0
-- =========================================================
CREATE TABLE inventory_ledger (
ledger_id BIGINT PRIMARY KEY,
idempotency_key VARCHAR(160) NOT NULL,
reservation_id UUID NOT NULL,
order_id BIGINT,
source_message_id UUID NOT NULL,
activity_id BIGINT NOT NULL,
sku_id BIGINT NOT NULL,
user_id BIGINT NOT NULL,
inventory_bucket SMALLINT NOT NULL,
ledger_type SMALLINT NOT NULL,
available_delta INTEGER NOT NULL,
allocated_delta INTEGER NOT NULL,
before_available INTEGER NOT NULL,
after_available INTEGER NOT NULL,
before_allocated INTEGER NOT NULL,
after_allocated INTEGER NOT NULL,
reason VARCHAR(64) NOT NULL,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT uq_inventory_ledger_idempotency
UNIQUE (idempotency_key),
CONSTRAINT ck_ledger_type
CHECK (ledger_type IN (10, 20, 30, 40)),
CONSTRAINT ck_ledger_conservation
CHECK (available_delta + allocated_delta = 0),
CONSTRAINT ck_ledger_available
CHECK (after_available = before_available + available_delta),
CONSTRAINT ck_ledger_allocated
CHECK (after_allocated = before_allocated + allocated_delta),
CONSTRAINT ck_ledger_result_nonnegative
CHECK (after_available >= 0 AND after_allocated >= 0)
);
CREATE INDEX idx_ledger_reservation
ON inventory_ledger (reservation_id, created_at);
CREATE INDEX idx_ledger_order
ON inventory_ledger (order_id, created_at)
WHERE order_id IS NOT NULL;
CREATE INDEX idx_ledger_created_brin
ON inventory_ledger USING BRIN (created_at);
-- =========================================================
-- 9. 消费 Inbox
-- 只有数据库事务成功提交后，Inbox 行才存在
-- =========================================================
CREATE TABLE consumer_inbox (
consumer_group VARCHAR(128) NOT NULL,
message_id UUID NOT NULL,
topic VARCHAR(128) NOT NULL,
tag VARCHAR(64),
message_key VARCHAR(160) NOT NULL,
reservation_id UUID NOT NULL,
payload_hash BYTEA,
status SMALLINT NOT NULL DEFAULT 20,
result_code VARCHAR(64) NOT NULL,
order_id BIGINT,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
processed_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT pk_consumer_inbox
PRIMARY KEY (consumer_group, message_id),
CONSTRAINT ck_inbox_status
CHECK (status = 20)
);
CREATE INDEX idx_inbox_reservation
ON consumer_inbox (reservation_id, processed_at DESC);
CREATE INDEX idx_inbox_processed_brin
ON consumer_inbox USING BRIN (processed_at);
-- =========================================================
-- 10. 事务 Outbox
-- =========================================================
CREATE TABLE event_outbox (
event_id UUID PRIMARY KEY,
dedup_key VARCHAR(160) NOT NULL,
aggregate_type VARCHAR(64) NOT NULL,
aggregate_id VARCHAR(128) NOT NULL,
topic VARCHAR(128) NOT NULL,
tag VARCHAR(64),
message_key VARCHAR(160) NOT NULL,
schema_version INTEGER NOT NULL,
payload JSONB NOT NULL,
headers JSONB NOT NULL DEFAULT '{}'::jsonb,
status SMALLINT NOT NULL DEFAULT 0,
available_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
retry_count INTEGER NOT NULL DEFAULT 0,
max_retry INTEGER NOT NULL DEFAULT 16,
locked_by VARCHAR(128),
locked_at TIMESTAMPTZ,
sent_at TIMESTAMPTZ,
last_error TEXT,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT uq_outbox_dedup
UNIQUE (dedup_key),
CONSTRAINT ck_outbox_status
CHECK (status IN (0, 10, 20, 30, 40)),
CONSTRAINT ck_outbox_retry
CHECK (
retry_count >= 0
AND max_retry > 0
),
CONSTRAINT ck_outbox_schema
CHECK (schema_version > 0)
)
WITH (fillfactor = 80);
CREATE INDEX idx_outbox_ready
ON event_outbox (available_at, created_at, event_id)
INCLUDE (topic, tag, message_key, aggregate_type, aggregate_id)
WHERE status IN (0, 30);
CREATE INDEX idx_outbox_stale_sending
ON event_outbox (locked_at, event_id)
WHERE status = 10;
-- =========================================================
-- 11. 补偿任务
-- =========================================================
CREATE TABLE compensation_task (
task_id UUID PRIMARY KEY,
idempotency_key VARCHAR(160) NOT NULL,
task_type SMALLINT NOT NULL,
reservation_id UUID,
order_id BIGINT,
payload JSONB NOT NULL,
status SMALLINT NOT NULL DEFAULT 0,
next_run_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
retry_count INTEGER NOT NULL DEFAULT 0,
max_retry INTEGER NOT NULL DEFAULT 20,
locked_by VARCHAR(128),
locked_at TIMESTAMPTZ,
last_error TEXT,
completed_at TIMESTAMPTZ,
created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
CONSTRAINT uq_compensation_idempotency
UNIQUE (idempotency_key),
CONSTRAINT ck_compensation_type
CHECK (task_type IN (10, 20, 30, 40)),
CONSTRAINT ck_compensation_status
CHECK (status IN (0, 10, 20, 30, 40, 50)),
CONSTRAINT ck_compensation_retry
CHECK (
retry_count >= 0
AND max_retry > 0
)
)
WITH (fillfactor = 80);
CREATE INDEX idx_compensation_ready
ON compensation_task (next_run_at, created_at, task_id)
WHERE status IN (0, 30);
CREATE INDEX idx_compensation_stale_running
ON compensation_task (locked_at, task_id)
WHERE status = 10;

-- =========================================================
-- §10.6: hot, frequently updated tables get a more eager autovacuum so dead
-- versions of the inventory rows and outbox rows are reclaimed during a sale.
-- =========================================================
ALTER TABLE event_outbox SET (
autovacuum_vacuum_scale_factor = 0.02,
autovacuum_vacuum_threshold = 500,
autovacuum_analyze_scale_factor = 0.05,
autovacuum_analyze_threshold = 500
);
ALTER TABLE sku_inventory SET (
autovacuum_vacuum_scale_factor = 0.01,
autovacuum_vacuum_threshold = 50,
autovacuum_analyze_scale_factor = 0.02,
autovacuum_analyze_threshold = 50
);
