-- One role per job (docs/OPERATIONS.md, "Roles"). The migrations run as the role
-- that owns the schema (`database.owner_url`). Two group roles, without login, hold
-- what the other jobs may do; the login roles of a deployment are made members:
--   seckill_runtime   `serve`: read and write the engine's tables, nothing else
--                     (no DDL, no other schema); its login role also gets
--                     pg_monitor, which only a superuser can grant
--   seckill_readonly  the history reads on a replica (`database.replica_url`)
-- They are created here when missing (that needs CREATEROLE); an owner without it
-- runs this after an administrator created them (scripts/lib/roles.sql).
SET LOCAL search_path = seckill, public;

DO $$
BEGIN
    -- Roles are cluster-wide: databases migrated at once must not both create one.
    PERFORM pg_advisory_xact_lock(727274, 8);
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_runtime') THEN
        CREATE ROLE seckill_runtime NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill_readonly') THEN
        CREATE ROLE seckill_readonly NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA seckill TO seckill_runtime, seckill_readonly;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA seckill TO seckill_runtime;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA seckill TO seckill_runtime;
GRANT SELECT ON ALL TABLES IN SCHEMA seckill TO seckill_readonly;
-- V5's tables live in public; the migration history is read by the start-up check.
GRANT SELECT, INSERT, UPDATE, DELETE ON public.shard_layout, public.node_lease TO seckill_runtime;
GRANT SELECT ON public.refinery_schema_history TO seckill_runtime, seckill_readonly;
-- Tables later migrations create get the same rights.
ALTER DEFAULT PRIVILEGES IN SCHEMA seckill
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO seckill_runtime;
ALTER DEFAULT PRIVILEGES IN SCHEMA seckill
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO seckill_runtime;
ALTER DEFAULT PRIVILEGES IN SCHEMA seckill
    GRANT SELECT ON TABLES TO seckill_readonly;
