-- The login roles of the engine's jobs (docs/OPERATIONS.md, "Roles"), run as a
-- superuser by `scripts/services up --roles` and by the roles test; idempotent.
-- Passwords are not set here: the local servers trust 127.0.0.1; elsewhere set
-- them with ALTER ROLE ... PASSWORD.
DO $$
BEGIN
    PERFORM pg_advisory_xact_lock(727274, 8);
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_runtime') THEN
        CREATE ROLE seckill_runtime NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_readonly') THEN
        CREATE ROLE seckill_readonly NOLOGIN;
    END IF;
    -- migrate, maintain: owns the database it is given and what it creates there.
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_owner') THEN
        CREATE ROLE seckill_owner LOGIN;
    END IF;
    -- serve
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_engine') THEN
        CREATE ROLE seckill_engine LOGIN;
    END IF;
    -- history reads on a replica
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_history') THEN
        CREATE ROLE seckill_history LOGIN;
    END IF;
END
$$;
GRANT seckill_runtime, pg_monitor TO seckill_engine;
GRANT seckill_readonly TO seckill_history;
