-- The backlog gauges (src/store/ops.rs) take the age of the oldest waiting outbox
-- event and compensation task without reading the backlog: a PENDING row's
-- available_at/next_run_at is its created_at, so the ready index's first entry is
-- the oldest PENDING row, but a RETRY row waits behind its backoff and may be older
-- than everything ahead of it. These partial indexes give the oldest RETRY row in
-- one probe. They hold only RETRY rows, rare and never written by an order
-- transaction (new rows are PENDING).
SET LOCAL search_path = seckill, public;
CREATE INDEX idx_outbox_retry_created
ON event_outbox (created_at)
WHERE status = 30;
CREATE INDEX idx_compensation_retry_created
ON compensation_task (created_at)
WHERE status = 30;
