//! `[redis]`: the Redis URL, the prefix of every key, and the TLS files of a
//! `rediss://` URL.

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
        ] {
            crate::config::check::tests::refusal(var, value, key);
        }
    }
}
