-- The order path inserts an order before it takes stock, and takes it back in the
-- same transaction when the bucket turns out empty (§9.11). The runtime role has no
-- DELETE on orders (docs/OPERATIONS.md, "Roles"): it undoes its own provisional
-- orders through this function, which deletes only rows the calling transaction
-- inserted (their xmin is its transaction id; the order path uses no savepoints).
-- SECURITY DEFINER runs it as the owner; the grants step of `migrate` gives
-- EXECUTE to the runtime role only.
SET LOCAL search_path = seckill, public;

CREATE FUNCTION drop_provisional_orders(ids int8[]) RETURNS SETOF int8
    LANGUAGE sql
    SECURITY DEFINER
    SET search_path = seckill, pg_temp
AS $$
    DELETE FROM seckill.orders
     WHERE order_id = ANY (ids)
       AND xmin = pg_current_xact_id()::xid
    RETURNING order_id
$$;

REVOKE ALL ON FUNCTION drop_provisional_orders(int8[]) FROM PUBLIC;
