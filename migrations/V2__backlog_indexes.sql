-- The engine's backlog gauges (src/store/ops.rs, every telemetry.sample_interval_ms)
-- count dead outbox events and compensation tasks waiting for review. Without an
-- index those counts read the whole table: the outbox keeps SENT rows for
-- outbox.retention_secs (a day by default), millions of rows after a big sale.
-- These partial indexes hold only the rare terminal rows, so they cost nothing on
-- the order path (new rows are PENDING) and keep each count to the rows it counts.
SET LOCAL search_path = seckill, public;
CREATE INDEX idx_outbox_dead
ON event_outbox (created_at)
WHERE status = 40;
CREATE INDEX idx_compensation_review
ON compensation_task (created_at)
WHERE status IN (40, 50);
