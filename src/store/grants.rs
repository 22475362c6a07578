//! What each role may do in the project's database (docs/OPERATIONS.md, "Roles"),
//! applied by `migrate` after the migrations, in one transaction, every time (so a
//! new table or a tightened right reaches databases migrated before).
//!
//! The group roles carry a prefix, `database.role_prefix`, by default derived from
//! the database's name, so two databases on one cluster never share a runtime role:
//! `{prefix}_runtime` (what `serve` does) and `{prefix}_readonly` (history reads).
//! The database's `CONNECT` is taken from `PUBLIC` and given to those two (its owner
//! and superusers keep theirs), so one deployment's login roles cannot open
//! another's database. The runtime role gets, table by table, what the engine's SQL
//! does and no more: no `DELETE` on the ledger, payments, orders (provisional orders
//! go through migration V9's function) or the outbox history, no `UPDATE` of prices
//! or stock totals (column privileges). The first releases granted everything to
//! `seckill_runtime` (migration V8); under another prefix those rights are revoked
//! here.

use tokio_postgres::Client;

use super::StoreError;

/// The grants, as one static block; the prefix comes in through the transaction's
/// `seckill.role_prefix` setting (identifiers cannot be parameters), and every name
/// built from it is quoted with `%I`.
const GRANTS: &str = r#"
DO $grants$
DECLARE
    prefix   text := current_setting('seckill.role_prefix');
    runtime  text := prefix || '_runtime';
    readonly text := prefix || '_readonly';
    db       text := current_database();
    old      text;
    t        record;
BEGIN
    -- Roles are cluster-wide: databases migrated at once must not both create one.
    PERFORM pg_advisory_xact_lock(727274, 8);
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = runtime) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', runtime);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = readonly) THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', readonly);
    END IF;

    -- What V8 (or an earlier run) gave, then what each role gets now.
    FOR old IN SELECT rolname FROM pg_roles
                WHERE rolname IN ('seckill_runtime', 'seckill_readonly', runtime, readonly)
    LOOP
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA seckill FROM %I', old);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA seckill FROM %I', old);
        EXECUTE format('REVOKE ALL ON public.shard_layout, public.node_lease,
                        public.refinery_schema_history FROM %I', old);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA seckill REVOKE ALL ON TABLES FROM %I', old);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA seckill REVOKE ALL ON SEQUENCES FROM %I', old);
        EXECUTE format('REVOKE ALL ON FUNCTION seckill.drop_provisional_orders(int8[]) FROM %I', old);
        EXECUTE format('REVOKE ALL ON SCHEMA seckill FROM %I', old);
        EXECUTE format('REVOKE ALL ON DATABASE %I FROM %I', db, old);
    END LOOP;

    EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', db);
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I, %I', db, runtime, readonly);
    EXECUTE format('GRANT USAGE ON SCHEMA seckill TO %I, %I', runtime, readonly);

    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA seckill TO %I', readonly);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA seckill GRANT SELECT ON TABLES TO %I', readonly);

    -- The engine's SQL, table by table (src/store). A table added by a later
    -- migration gets nothing until it is listed here (tests/it/roles.rs checks
    -- every table is).
    FOR t IN SELECT * FROM (VALUES
        ('seckill.seckill_activity',      'SELECT, INSERT, UPDATE (status, updated_at, version)'),
        ('seckill.seckill_sku',           'SELECT, INSERT'),
        ('seckill.sku_inventory',         'SELECT, INSERT, UPDATE (available_stock, allocated_stock, version, updated_at)'),
        ('seckill.inventory_reservation', 'SELECT, INSERT, UPDATE'),
        ('seckill.orders',                'SELECT, INSERT, UPDATE (status, paid_at, cancelled_at, cancel_reason, version, updated_at)'),
        ('seckill.order_items',           'SELECT, INSERT'),
        ('seckill.payment_record',        'SELECT, INSERT'),
        ('seckill.inventory_ledger',      'SELECT, INSERT'),
        ('seckill.consumer_inbox',        'SELECT, INSERT, UPDATE, DELETE'),
        ('seckill.event_outbox',          'SELECT, INSERT, UPDATE, DELETE'),
        ('seckill.event_outbox_history',  'SELECT, INSERT'),
        ('seckill.compensation_task',     'SELECT, INSERT, UPDATE'),
        ('public.shard_layout',           'SELECT, INSERT, UPDATE, DELETE'),
        ('public.node_lease',             'SELECT, INSERT, UPDATE, DELETE'),
        ('public.refinery_schema_history', 'SELECT')
    ) AS v(tbl, privileges)
    LOOP
        EXECUTE format('GRANT %s ON TABLE %s TO %I', t.privileges, t.tbl, runtime);
    END LOOP;
    EXECUTE format('GRANT SELECT ON public.refinery_schema_history TO %I', readonly);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA seckill TO %I', runtime);
    EXECUTE format('GRANT EXECUTE ON FUNCTION seckill.drop_provisional_orders(int8[]) TO %I', runtime);
END
$grants$
"#;

/// Applies the grants for `prefix` (already checked with `is_role_prefix`).
pub(super) async fn apply(client: &mut Client, prefix: &str) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT set_config('seckill.role_prefix', $1, true)",
        &[&prefix],
    )
    .await?;
    tx.batch_execute(GRANTS).await?;
    tx.commit().await?;
    Ok(())
}
