-- Retention (seed §8.5, docs/OPERATIONS.md "Retention"): SENT outbox rows stay in
-- event_outbox for the audit period, then the retention service moves them here in
-- small batches, so the table the publisher claims from stays small. History is
-- never read by the engine; it is kept for audits and exported or dropped by the
-- operator.
SET LOCAL search_path = seckill, public;

CREATE TABLE event_outbox_history (
    LIKE event_outbox INCLUDING DEFAULTS,
    archived_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
    CONSTRAINT pk_outbox_history PRIMARY KEY (event_id)
);
CREATE INDEX idx_outbox_history_sent_brin
ON event_outbox_history USING BRIN (sent_at);

-- The retention service's claim: SENT rows oldest first, without reading the rest
-- of the table.
CREATE INDEX idx_outbox_sent
ON event_outbox (sent_at)
WHERE status = 20;
