//! `[database]`: PostgreSQL, its URLs (each with libpq's `sslmode`, which asks for
//! the TLS files of `database.tls`) and the engine's pool.

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

    /// Reads every URL and checks what it asks of `database.tls`.
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        let (pg, mode) = self.read(ctx, "database.url", &self.url)?;
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
        if mode == SslMode::Disable && self.tls.is_set() {
            return Err(ctx.invalid(
                "database.tls",
                "is set but database.url says sslmode=disable",
            ));
        }
        self.tls.check("database").map_err(|e| ctx.tls(e))?;
        for (key, url) in [
            ("database.replica_url", &self.replica_url),
            ("database.owner_url", &self.owner_url),
        ] {
            if let Some(url) = url {
                let (other, _) = self.read(ctx, key, url)?;
                if other.get_hosts().is_empty() || other.get_dbname().is_none() {
                    return Err(ctx.invalid(key, "must name a host and a database"));
                }
            }
        }
        Ok(())
    }

    /// One URL: libpq's sslmode read here (tokio-postgres knows only three of the
    /// five), and what it asks of `database.tls` checked now.
    fn read(
        &self,
        ctx: &Check,
        key: &'static str,
        url: &SecretString,
    ) -> Result<(tokio_postgres::Config, SslMode), ConfigError> {
        let (rest, mode) = crate::tls::split_sslmode(url.expose_secret(), key)
            .map_err(|reason| ctx.invalid(key, reason))?;
        let pg = rest
            .parse()
            .map_err(|e| ctx.invalid(key, format!("not a PostgreSQL URL: {e}")))?;
        PgTls::new(mode, &self.tls, key).map_err(|e| ctx.tls(e))?;
        Ok((pg, mode))
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
}
