//! Where the engine connects: the configured URLs parsed into a server to reach
//! (`PgTarget`) with the TLS `sslmode` and `database.tls` ask for, and the session
//! settings each role's connections get.

use std::time::Duration;

use secrecy::SecretString;

use super::error::StoreError;
use crate::config::{DatabaseSettings, PgUrl};
use crate::tls::{PgTls, TlsFiles};

/// Parses the configured URL and points the session at the `seckill` schema, so the
/// SQL in this module can name tables without a schema prefix. Every such session
/// commits with `synchronous_commit = on`, whatever the server, database or role
/// default (a startup option outranks all three): an order, its inbox row, its
/// outbox event, a payment or a compensation task is acknowledged only once it is
/// flushed, and on a synchronous standby when one is configured (seed §14.2;
/// docs/DESIGN.md, "Durability"). The order transaction sets it again, locally.
pub fn pg_config(settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
    let mut config = admin_pg_config(settings)?;
    config.options(SESSION_OPTIONS);
    Ok(config)
}

/// The engine's session settings (`pg_config`).
pub const SESSION_OPTIONS: &str = "-c search_path=seckill,public -c synchronous_commit=on";

/// The configured URL with the server's default search_path, for migrations: refinery
/// keeps its history table in `public` and must find it there on every run.
pub fn admin_pg_config(settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
    let url = settings.parsed_url().map_err(url_error("database.url"))?;
    PgTarget::new(url, settings)
}

/// `database.owner_url` (the role that owns the schema), or `database.url` when
/// unset, with the server's default search_path: what `migrate` and the after-sale
/// VACUUM connect as (docs/OPERATIONS.md, "Roles").
pub fn owner_pg_config(settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
    let owner = settings
        .parsed_owner_url()
        .map_err(url_error("database.owner_url"))?;
    match owner {
        Some(url) => PgTarget::new(url, settings),
        None => admin_pg_config(settings),
    }
}

/// A URL that could not be read, naming its key: one given to `PgTarget::from_url`,
/// or one rewritten after `Settings::load` (which refuses the others).
pub(super) fn url_error(key: &'static str) -> impl Fn(String) -> StoreError {
    move |reason| StoreError::Url(format!("`{key}`: {reason}"))
}

/// A PostgreSQL server to connect to: what tokio-postgres reads of the URL, and the
/// TLS its `sslmode` asks for (`tls::PgTls`, with `database.tls`). Dereferences to
/// the tokio-postgres settings.
#[derive(Clone, Debug)]
pub struct PgTarget {
    pub(super) config: tokio_postgres::Config,
    pub(super) tls: PgTls,
}

impl std::ops::Deref for PgTarget {
    type Target = tokio_postgres::Config;
    fn deref(&self) -> &tokio_postgres::Config {
        &self.config
    }
}

impl std::ops::DerefMut for PgTarget {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.config
    }
}

impl PgTarget {
    /// `url` (one of `settings`' URLs, as read at load) with `settings.tls`.
    pub fn new(url: PgUrl, settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
        PgTarget::with_tls(url, &settings.tls, settings.connect_timeout())
    }

    fn with_tls(
        url: PgUrl,
        files: &TlsFiles,
        connect_timeout: Duration,
    ) -> Result<PgTarget, StoreError> {
        let PgUrl {
            key,
            mut config,
            ssl_mode,
            ..
        } = url;
        let tls = PgTls::new(ssl_mode, files, key)?;
        tls.apply(&mut config);
        config
            .connect_timeout(connect_timeout)
            .application_name("seckill-engine");
        Ok(PgTarget { config, tls })
    }

    /// A URL with no `database.tls` files (its own sslmode, up to `require`).
    pub fn from_url(url: &str) -> Result<PgTarget, StoreError> {
        let url = PgUrl::parse("database.url", &SecretString::from(url.to_owned()))
            .map_err(url_error("database.url"))?;
        PgTarget::with_tls(url, &TlsFiles::default(), Duration::from_secs(10))
    }

    /// The `sslmode` of the URL.
    pub fn ssl_mode(&self) -> crate::tls::SslMode {
        self.tls.mode()
    }
}
