//! Schema migrations (refinery, files in `migrations/`), creating the database when it
//! is missing, and the start-up check that refuses to run on an unmigrated or diverged
//! schema.

use tokio_postgres::Client;

use super::{connect, PgTarget, StoreError};

refinery::embed_migrations!("migrations");

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("migration: {0}")]
    Refinery(#[from] refinery::Error),
    #[error("the database is not migrated (applied {applied} of {known} migrations): run `seckill-engine migrate`")]
    Behind { applied: usize, known: usize },
    #[error("the database schema diverged from this build: {0}; refusing to run")]
    Diverged(String),
    #[error("`{0}` cannot prefix role names: a lower-case letter, then lower-case letters, digits or _, at most 40 (database.role_prefix)")]
    RolePrefix(String),
}

/// Creates the configured database if it does not exist (connecting to the server's
/// `postgres` maintenance database), applies pending migrations, then the roles'
/// grants (`grants`) under `role_prefix` (`database.role_prefix`; `None`: derived
/// from the database's name). Idempotent.
pub async fn migrate(
    config: &PgTarget,
    role_prefix: Option<&str>,
) -> Result<MigrationReport, MigrateError> {
    let created = ensure_database(config).await?;
    let prefix = match role_prefix {
        Some(prefix) => prefix.to_owned(),
        None => crate::domain::roles::role_prefix_for(config.get_dbname().unwrap_or_default()),
    };
    if !crate::domain::roles::is_role_prefix(&prefix) {
        return Err(MigrateError::RolePrefix(prefix));
    }
    let mut client = connect(config).await?;
    let report = migrations::runner()
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(&mut client)
        .await?;
    super::grants::apply(&mut client, &prefix).await?;
    Ok(MigrationReport {
        role_prefix: prefix,
        database_created: created,
        applied: report
            .applied_migrations()
            .iter()
            .map(|m| m.to_string())
            .collect(),
    })
}

#[derive(Debug)]
pub struct MigrationReport {
    /// The prefix of the group roles granted (`{prefix}_runtime`, `{prefix}_readonly`).
    pub role_prefix: String,
    pub database_created: bool,
    pub applied: Vec<String>,
}

async fn ensure_database(config: &PgTarget) -> Result<bool, MigrateError> {
    let Some(name) = config.get_dbname() else {
        return Err(StoreError::Url("the database URL names no database".into()).into());
    };
    let mut admin = config.clone();
    admin.dbname("postgres");
    let client = connect(&admin).await?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if exists {
        return Ok(false);
    }
    // CREATE DATABASE takes no bind parameters; the name is quoted as an identifier.
    let sql = format!("CREATE DATABASE {}", quote_ident(name));
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(true),
        // Another process created it between our check and our CREATE.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why `migrate` would fail as `config`'s role (`database.owner_url`), or `None` when
/// it can migrate: it must own the database (PostgreSQL 15 lets only the owner
/// create in `public`, where the migrations' history lives) and the `seckill`
/// schema when that exists, unless it is a superuser; and migration V8's group
/// roles must exist or it must be able to create them. A database that does not
/// exist yet is created by `migrate` itself.
pub async fn owner_problem(config: &PgTarget) -> Result<Option<String>, StoreError> {
    let Some(name) = config.get_dbname() else {
        return Err(StoreError::Url("the database URL names no database".into()));
    };
    let mut admin = config.clone();
    admin.dbname("postgres");
    let client = connect(&admin).await?;
    let row = client
        .query_opt(
            "SELECT r.rolsuper, d.datdba = r.oid, pg_get_userbyid(d.datdba), r.rolname::text
               FROM pg_database d, pg_roles r
              WHERE d.datname = $1 AND r.rolname = current_user",
            &[&name],
        )
        .await?;
    // Migration V8 creates its two group roles when missing, which needs CREATEROLE
    // (scripts/lib/roles.sql creates them for an owner without it).
    let v8_blocked: bool = client
        .query_one(
            "SELECT NOT (r.rolsuper OR r.rolcreaterole)
                    AND (SELECT count(*) FROM pg_roles
                          WHERE rolname IN ('seckill_runtime', 'seckill_readonly')) < 2
               FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await?
        .get(0);
    if v8_blocked {
        return Ok(Some(format!(
            "the roles seckill_runtime and seckill_readonly are missing and {} cannot create              them (no CREATEROLE): migrate would stop at migration V8; have a superuser run              scripts/lib/roles.sql (scripts/services up --roles does)",
            config.get_user().unwrap_or("the configured role")
        )));
    }
    let Some(row) = row else { return Ok(None) };
    let (superuser, owns, owner, me): (bool, bool, String, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if superuser || owns {
        return Ok(None);
    }
    Ok(Some(format!(
        "database {name} is owned by {owner}, not by {me} (database.owner_url): migrate \
         would fail; give it to {me} (ALTER DATABASE {name} OWNER TO {me}, and the seckill \
         schema's objects), or use a database {me} owns (scripts/services up --roles makes one)"
    )))
}

/// Fails unless every migration of this build is applied, with the same checksums,
/// and the database knows no migration this build does not.
pub async fn verify(client: &mut Client) -> Result<(), MigrateError> {
    let known = migrations::runner().get_migrations().clone();
    let has_table = client
        .query_one(
            "SELECT to_regclass('public.refinery_schema_history') IS NOT NULL",
            &[],
        )
        .await?
        .get::<_, bool>(0);
    if !has_table {
        return Err(MigrateError::Behind {
            applied: 0,
            known: known.len(),
        });
    }
    let applied = migrations::runner()
        .get_applied_migrations_async(client)
        .await?;
    for migration in &applied {
        match known.iter().find(|k| k.version() == migration.version()) {
            None => {
                return Err(MigrateError::Diverged(format!(
                    "migration {migration} is applied but unknown to this build"
                )))
            }
            Some(k) if k.checksum() != migration.checksum() || k.name() != migration.name() => {
                return Err(MigrateError::Diverged(format!(
                    "migration {migration} was applied with different contents"
                )))
            }
            Some(_) => {}
        }
    }
    if applied.len() < known.len() {
        return Err(MigrateError::Behind {
            applied: applied.len(),
            known: known.len(),
        });
    }
    Ok(())
}

/// Quotes an SQL identifier (only for DDL, which cannot take bind parameters).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A fingerprint of the embedded migrations (versions and checksums): tests key their
/// migrated template database on it.
pub fn fingerprint() -> u64 {
    migrations::runner()
        .get_migrations()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |acc, m| {
            (acc ^ m.checksum() ^ u64::from(m.version().unsigned_abs()))
                .wrapping_mul(0x100_0000_01b3)
        })
}
