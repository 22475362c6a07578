//! `[database]`: PostgreSQL, its URLs and pool. Each URL is read once, at load, into
//! a `PgUrl` kept here: what tokio-postgres takes of it and libpq's `sslmode`, which
//! the engine applies itself (`tls`). The store connects with those.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::check::{Check, ConfigError};
use crate::tls::{PgTls, SslMode, TlsFiles};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub pool_size: u32,
    pub connect_timeout_ms: u64,
    pub acquire_timeout_ms: u64,
    pub lock_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub tx_max_attempts: u32,
    /// Take no orders while the primary's commits do not wait for a synchronous
    /// standby (seed §14.3): readiness says why and intake stops until one is back.
    pub require_sync_standby: bool,
    /// A COMMIT waiting this long for a synchronous standby stops intake (it is
    /// never cancelled: its order may already be on the standby).
    pub commit_stall_ms: u64,
    /// A streaming replica for the reads that may be stale (seed §14.4): the
    /// buyer's order history. Unset: every read goes to the primary.
    #[serde(default)]
    pub replica_url: Option<SecretString>,
    /// The replica serves while its measured lag is at most this.
    pub replica_max_lag_ms: u64,
    /// The role that owns the schema, for `migrate` and the after-sale VACUUM;
    /// unset: `url` (docs/OPERATIONS.md, "Roles").
    #[serde(default)]
    pub owner_url: Option<SecretString>,
    /// CA and client certificate for every PostgreSQL URL (`sslmode` says whether
    /// and how they are used).
    #[serde(default)]
    pub tls: TlsFiles,
    /// The prefix of the group roles `migrate` grants to (`{prefix}_runtime`,
    /// `{prefix}_readonly`); unset: derived from the database's name
    /// (`domain::roles`).
    #[serde(default)]
    pub role_prefix: Option<String>,
    /// The URLs as read by `validate`.
    #[serde(skip)]
    parsed: ParsedUrls,
}

#[derive(Debug, Clone, Default)]
struct ParsedUrls {
    url: Option<PgUrl>,
    replica_url: Option<PgUrl>,
    owner_url: Option<PgUrl>,
}

/// A PostgreSQL URL as read: what tokio-postgres takes of it, and libpq's `sslmode`,
/// which tokio-postgres knows only three of five of (`tls::split_sslmode`).
#[derive(Debug, Clone)]
pub struct PgUrl {
    /// The configuration key it came from.
    pub key: &'static str,
    /// Everything but `sslmode`.
    pub config: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    /// The text it was read from: a URL rewritten after loading is read again.
    source: SecretString,
}

impl PgUrl {
    /// Reads `url`, the value of `key`. The error is a reason that never quotes the
    /// URL (it may hold a password).
    pub fn parse(key: &'static str, url: &SecretString) -> Result<PgUrl, String> {
        let (rest, ssl_mode) = crate::tls::split_sslmode(url.expose_secret(), key)?;
        let config = rest
            .parse()
            .map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
        Ok(PgUrl {
            key,
            config,
            ssl_mode,
            source: url.clone(),
        })
    }

    /// `url` as read at load if it is still the text `kept` was read from, else
    /// read now.
    fn of(key: &'static str, url: &SecretString, kept: Option<&PgUrl>) -> Result<PgUrl, String> {
        match kept {
            Some(kept) if kept.source.expose_secret() == url.expose_secret() => Ok(kept.clone()),
            _ => PgUrl::parse(key, url),
        }
    }
}

impl DatabaseSettings {
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn commit_stall(&self) -> Duration {
        Duration::from_millis(self.commit_stall_ms)
    }

    /// `database.url`, read. Errors (only when it was rewritten after loading) are
    /// reasons without the URL.
    pub fn parsed_url(&self) -> Result<PgUrl, String> {
        PgUrl::of("database.url", &self.url, self.parsed.url.as_ref())
    }

    /// `database.owner_url`, read; `None` when unset.
    pub fn parsed_owner_url(&self) -> Result<Option<PgUrl>, String> {
        let kept = self.parsed.owner_url.as_ref();
        let url = self.owner_url.as_ref();
        url.map(|url| PgUrl::of("database.owner_url", url, kept))
            .transpose()
    }

    /// `database.replica_url`, read; `None` when unset.
    pub fn parsed_replica_url(&self) -> Result<Option<PgUrl>, String> {
        let kept = self.parsed.replica_url.as_ref();
        let url = self.replica_url.as_ref();
        url.map(|url| PgUrl::of("database.replica_url", url, kept))
            .transpose()
    }

    /// The prefix of the group roles: `database.role_prefix`, or derived from the
    /// database `database.url` names.
    pub fn role_prefix(&self) -> String {
        match &self.role_prefix {
            Some(prefix) => prefix.clone(),
            None => {
                let url = self.parsed_url().ok();
                let db = url.as_ref().and_then(|u| u.config.get_dbname());
                crate::domain::roles::role_prefix_for(db.unwrap_or_default())
            }
        }
    }

    /// Reads every URL, checks what it asks of `database.tls`, and keeps them.
    pub(super) fn validate(&mut self, ctx: &Check) -> Result<(), ConfigError> {
        if let Some(prefix) = &self.role_prefix {
            if !crate::domain::roles::is_role_prefix(prefix) {
                return Err(ctx.invalid(
                    "database.role_prefix",
                    "a lower-case letter, then lower-case letters, digits or _, at most 40",
                ));
            }
        }
        let url = self.read(ctx, "database.url", &self.url)?;
        let pg = &url.config;
        if pg.get_dbname().is_none() {
            return Err(ctx.invalid("database.url", "names no database"));
        }
        if pg.get_hosts().is_empty() {
            return Err(ctx.invalid("database.url", "names no host"));
        }
        // libpq's multi-host form: one port for all hosts, or one per host.
        let (hosts, ports) = (pg.get_hosts().len(), pg.get_ports().len());
        if ports > 1 && ports != hosts {
            return Err(ctx.invalid(
                "database.url",
                format!("names {hosts} hosts but {ports} ports (give one port, or one per host)"),
            ));
        }
        if url.ssl_mode == SslMode::Disable && self.tls.is_set() {
            return Err(ctx.invalid(
                "database.tls",
                "is set but database.url says sslmode=disable",
            ));
        }
        self.tls.check("database").map_err(|e| ctx.tls(e))?;
        let replica_url = self.other(ctx, "database.replica_url", self.replica_url.as_ref())?;
        let owner_url = self.other(ctx, "database.owner_url", self.owner_url.as_ref())?;
        self.parsed = ParsedUrls {
            url: Some(url),
            replica_url,
            owner_url,
        };
        Ok(())
    }

    /// One URL, read, with the TLS its `sslmode` asks for checked now.
    fn read(
        &self,
        ctx: &Check,
        key: &'static str,
        url: &SecretString,
    ) -> Result<PgUrl, ConfigError> {
        let url = PgUrl::parse(key, url).map_err(|reason| ctx.invalid(key, reason))?;
        PgTls::new(url.ssl_mode, &self.tls, key).map_err(|e| ctx.tls(e))?;
        Ok(url)
    }

    /// The replica's or the owner's URL, when set: another host and database.
    fn other(
        &self,
        ctx: &Check,
        key: &'static str,
        url: Option<&SecretString>,
    ) -> Result<Option<PgUrl>, ConfigError> {
        let Some(url) = url else { return Ok(None) };
        let url = self.read(ctx, key, url)?;
        if url.config.get_hosts().is_empty() || url.config.get_dbname().is_none() {
            return Err(ctx.invalid(key, "must name a host and a database"));
        }
        Ok(Some(url))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.
    use crate::config::Settings;
    use figment::Jail;

    #[test]
    fn a_bad_url_names_its_key_and_source_but_not_its_value() {
        Jail::expect_with(|jail| {
            jail.set_env(
                "SECKILL__DATABASE__OWNER_URL",
                "postgres://owner:hunter2@127.0.0.1:5432/seckill?sslmode=sometimes",
            );
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("`database.owner_url`"), "{err}");
            assert!(err.contains("SECKILL__DATABASE__OWNER_URL"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_urls_are_kept_as_read_and_read_again_once_rewritten() {
        Jail::expect_with(|jail| {
            jail.set_env(
                "SECKILL__DATABASE__REPLICA_URL",
                "postgres://r@127.0.0.1:5433/seckill?sslmode=require",
            );
            let mut s = Settings::load(None).expect("valid settings");
            let url = s.database.parsed_url().expect("read");
            assert_eq!(url.config.get_dbname(), Some("seckill"));
            assert_eq!(url.ssl_mode, crate::tls::SslMode::Disable);
            let replica = s.database.parsed_replica_url().expect("read");
            let replica = replica.expect("set");
            assert_eq!(replica.config.get_ports(), &[5433]);
            assert_eq!(replica.ssl_mode, crate::tls::SslMode::Require);
            assert!(s.database.parsed_owner_url().expect("unset").is_none());
            s.database.url = "postgres://u@127.0.0.1/other".to_owned().into();
            let url = s.database.parsed_url().expect("read");
            assert_eq!(url.config.get_dbname(), Some("other"));
            assert_eq!(url.ssl_mode, crate::tls::SslMode::Prefer);
            Ok(())
        });
    }
}
