-- The login roles of the engine's jobs (docs/OPERATIONS.md, "Roles"), run as a
-- superuser by `scripts/services up --roles` and by the roles tests; idempotent.
-- The role prefix comes from the session setting `seckill.role_prefix` (psql:
-- PGOPTIONS='-c seckill.role_prefix=shop'); it must be what the engine's
-- `database.role_prefix` says (by default the database's name):
--   {prefix}_runtime, {prefix}_readonly   group roles, granted by `migrate`
--   {prefix}_owner     migrate, maintain: owns the database and what it creates
--   {prefix}_engine    serve: {prefix}_runtime and pg_monitor
--   {prefix}_history   history reads on a replica: {prefix}_readonly
-- Passwords are not set here: the local servers trust 127.0.0.1; elsewhere set
-- them with ALTER ROLE ... PASSWORD.
DO $$
DECLARE
    prefix text := current_setting('seckill.role_prefix');
    r      record;
BEGIN
    IF prefix !~ '^[a-z][a-z0-9_]{0,39}$' THEN
        RAISE EXCEPTION 'seckill.role_prefix "%" is not a role prefix', prefix;
    END IF;
    PERFORM pg_advisory_xact_lock(727274, 8);
    FOR r IN SELECT * FROM (VALUES
        ('_runtime', false), ('_readonly', false),
        ('_owner', true), ('_engine', true), ('_history', true)) AS v(suffix, login)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = prefix || r.suffix) THEN
            EXECUTE format('CREATE ROLE %I %s', prefix || r.suffix,
                           CASE WHEN r.login THEN 'LOGIN' ELSE 'NOLOGIN' END);
        END IF;
    END LOOP;
    -- Migration V8 (of the first releases) grants to seckill_runtime and
    -- seckill_readonly whatever the prefix, and creates them when missing: an owner
    -- without CREATEROLE (as made here) could not, and `migrate` would stop at V8 on
    -- a fresh cluster. The grants step takes what V8 gave back under any other prefix.
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_runtime') THEN
        CREATE ROLE seckill_runtime NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_readonly') THEN
        CREATE ROLE seckill_readonly NOLOGIN;
    END IF;
    EXECUTE format('GRANT %I, pg_monitor TO %I', prefix || '_runtime', prefix || '_engine');
    EXECUTE format('GRANT %I TO %I', prefix || '_readonly', prefix || '_history');
END
$$;
