-- Give-backs fenced in PostgreSQL (docs/DESIGN.md, "Redis give-backs"): before the
-- reconciler (or the front stage, after a publish the broker refused) hands a Redis
-- unit back, it records the reservation as RELEASED, inserting the row if no
-- message ever reached the engine. Such a row has no message, hence the NULL; a
-- message that arrives later finds the reservation RELEASED and creates no order.
SET LOCAL search_path = seckill, public;
ALTER TABLE inventory_reservation ALTER COLUMN first_message_id DROP NOT NULL;

-- A request id is the user's own (the front stage keys its replay answer by user
-- and request id): the same id from two users is two requests, not a conflict that
-- rejects the second. The request id leads, so lookups by request id alone still
-- use the index.
ALTER TABLE inventory_reservation
    DROP CONSTRAINT uq_reservation_request,
    ADD CONSTRAINT uq_reservation_request UNIQUE (request_id, user_id);

ALTER TABLE orders
    DROP CONSTRAINT uq_orders_request,
    ADD CONSTRAINT uq_orders_request UNIQUE (request_id, user_id);
