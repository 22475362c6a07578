-- The speculative order transaction (src/store/orders/set_based.rs) sends its COMMIT
-- right behind its inventory UPDATE, without waiting for the UPDATE's answer, so the
-- hot inventory row stays locked for the UPDATE and the COMMIT only, never for a round
-- trip to the engine between them. A speculation that does not hold (the bucket holds
-- fewer units than the batch takes) must then end the transaction inside PostgreSQL:
-- this raises SQLSTATE SK001 unless `ok` is true, which aborts the transaction, and
-- the pipelined COMMIT rolls it back.
SET LOCAL search_path = seckill, public;
CREATE FUNCTION abort_unless(ok boolean, reason text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'SK001', MESSAGE = reason;
    END IF;
    RETURN true;
END
$$;
