//! `[redis]`: the Redis URL, the prefix of every key, the TLS files of a
//! `rediss://` URL, and Sentinel mode (`sentinels`, `master_name`).

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::check::{Check, ConfigError};
use crate::tls::TlsFiles;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: SecretString,
    pub key_prefix: String,
    /// CA (instead of the system's roots) and client certificate of a `rediss://` URL.
    #[serde(default)]
    pub tls: TlsFiles,
    /// Sentinel mode: the sentinels' URLs; the master is the one they name for
    /// `master_name`, followed after a fail-over. `url` then gives only the
    /// master's credentials and database (its host and port are not used).
    #[serde(default)]
    pub sentinels: Vec<SecretString>,
    #[serde(default)]
    pub master_name: Option<String>,
}

impl RedisSettings {
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        let url = redis::IntoConnectionInfo::into_connection_info(self.url.expose_secret())
            .map_err(|e| ctx.invalid("redis.url", format!("not a Redis URL: {e}")))?;
        match url.addr() {
            redis::ConnectionAddr::TcpTls { insecure: true, .. } => {
                return Err(ctx.invalid(
                    "redis.url",
                    "asks for #insecure (no certificate check), which this build refuses; set redis.tls.ca_file instead",
                ))
            }
            redis::ConnectionAddr::TcpTls { .. } => {}
            _ if self.tls.is_set() => {
                return Err(ctx.invalid("redis.tls", "is set but redis.url is not rediss://"))
            }
            _ => {}
        }
        self.tls.check("redis").map_err(|e| ctx.tls(e))?;
        match (self.sentinels.is_empty(), &self.master_name) {
            (true, None) => {}
            (false, Some(name)) => {
                ctx.name("redis.master_name", name)?;
                if self.tls.is_set() {
                    return Err(ctx.invalid(
                        "redis.tls",
                        "is not supported with redis.sentinels (rediss:// with the system's roots is)",
                    ));
                }
                for sentinel in &self.sentinels {
                    redis::IntoConnectionInfo::into_connection_info(sentinel.expose_secret())
                        .map_err(|_| {
                            ctx.invalid(
                                "redis.sentinels",
                                "holds a value that is not a Redis URL (redis://host:port); the value is not shown, it may hold a password",
                            )
                        })?;
                }
            }
            (true, Some(_)) => {
                return Err(ctx.invalid("redis.master_name", "is set but redis.sentinels is empty"))
            }
            (false, None) => {
                return Err(ctx.invalid(
                    "redis.sentinels",
                    "needs redis.master_name, the name the sentinels monitor",
                ))
            }
        }
        ctx.name("redis.key_prefix", &self.key_prefix)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.

    #[test]
    fn a_bad_value_names_its_key_and_source() {
        for (var, value, key) in [
            ("SECKILL__REDIS__KEY_PREFIX", "", "redis.key_prefix"),
            (
                "SECKILL__REDIS__URL",
                "rediss://h:6379/#insecure",
                "redis.url",
            ),
            (
                "SECKILL__REDIS__SENTINELS",
                "[\"redis://127.0.0.1:26379\"]",
                "redis.sentinels",
            ),
            (
                "SECKILL__REDIS__MASTER_NAME",
                "seckill",
                "redis.master_name",
            ),
        ] {
            crate::config::check::tests::refusal(var, value, key);
        }
    }
}
