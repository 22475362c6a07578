//! `[amqp]`: RabbitMQ, its URL, names, shards and TLS files (which the front stage's
//! own broker user, `frontstage.amqp_url`, uses too).

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::check::{Check, ConfigError};
use crate::tls::TlsFiles;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    pub url: SecretString,
    /// A cluster's nodes, tried in order until one answers (on every connect and
    /// reconnect); empty: `url` alone.
    #[serde(default)]
    pub urls: Vec<SecretString>,
    pub namespace: String,
    pub shards: u16,
    pub owned_shards: Vec<u16>,
    pub prefetch: u16,
    pub retry_delay_ms: u64,
    pub max_retries: u32,
    pub consumer_group: String,
    /// AMQP heartbeat asked of the broker unless the URL sets `heartbeat`: a frozen
    /// or cut-off instance loses its connection, and so its shards, within about
    /// two of these.
    pub heartbeat_secs: u16,
    /// Opening a connection, from TCP connect to an open AMQP connection: a broker
    /// behind a network cut drops the packets, and TCP alone would keep trying for
    /// about two minutes.
    pub connect_timeout_ms: u64,
    /// CA (added to the system's roots) and client certificate of `amqps://` URLs.
    #[serde(default)]
    pub tls: TlsFiles,
    /// When set, the front stage signs each `order.create` and the engine
    /// dead-letters one whose signature is missing or wrong
    /// (`domain::signature`, docs/DESIGN.md "Signed orders").
    #[serde(default)]
    pub order_signing_secret: Option<SecretString>,
}

/// The shortest `amqp.order_signing_secret`: an HMAC-SHA256 key should hold at
/// least its output's 256 bits.
pub const MIN_SIGNING_SECRET_BYTES: usize = 32;

impl AmqpSettings {
    /// The broker's addresses in the order tried, and the key they come from:
    /// `amqp.urls`, or `amqp.url` when that list is empty.
    pub fn addresses(&self) -> (&'static str, Vec<SecretString>) {
        if self.urls.is_empty() {
            ("amqp.url", vec![self.url.clone()])
        } else {
            ("amqp.urls", self.urls.clone())
        }
    }

    /// `frontstage`: `frontstage.amqp_url` and `frontstage.amqp_urls`, which use this
    /// section's TLS files.
    pub(super) fn validate(
        &self,
        ctx: &Check,
        frontstage: (Option<&SecretString>, &[SecretString]),
    ) -> Result<(), ConfigError> {
        let mut amqps = false;
        let listed = [
            ("amqp.url", Some(&self.url)),
            ("frontstage.amqp_url", frontstage.0),
        ]
        .into_iter()
        .chain(self.urls.iter().map(|u| ("amqp.urls", Some(u))))
        .chain(
            frontstage
                .1
                .iter()
                .map(|u| ("frontstage.amqp_urls", Some(u))),
        );
        for (key, url) in listed {
            let Some(url) = url else { continue };
            let uri = url
                .expose_secret()
                .parse::<lapin::uri::AMQPUri>()
                // The parser's message quotes the URL, password included: never shown.
                .map_err(|_| {
                    ctx.invalid(
                        key,
                        "not an AMQP URL (amqp://user:password@host:port/vhost); the value is not shown, it may hold a password",
                    )
                })?;
            amqps |= uri.scheme == lapin::uri::AMQPScheme::AMQPS;
        }
        if self.tls.is_set() && !amqps {
            return Err(ctx.invalid("amqp.tls", "is set but no AMQP URL is amqps://"));
        }
        self.tls.check("amqp").map_err(|e| ctx.tls(e))?;
        ctx.secret_len(
            "amqp.order_signing_secret",
            self.order_signing_secret.as_ref(),
            MIN_SIGNING_SECRET_BYTES,
            "bytes",
        )?;
        ctx.name("amqp.namespace", &self.namespace)?;
        if let Some(shard) = self.owned_shards.iter().find(|s| **s >= self.shards) {
            return Err(ctx.invalid(
                "amqp.owned_shards",
                format!(
                    "shard {shard} does not exist (amqp.shards = {})",
                    self.shards
                ),
            ));
        }
        if self.consumer_group.is_empty() || self.consumer_group.len() > 128 {
            return Err(ctx.invalid("amqp.consumer_group", "must be 1-128 characters"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.
    use crate::config::Settings;
    use figment::Jail;

    #[test]
    fn semantic_error_names_key_and_env_source() {
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__AMQP__SHARDS", "0");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("amqp.shards"), "{err}");
            assert!(err.contains("SECKILL__AMQP__SHARDS"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn a_bad_value_names_its_key_and_source() {
        for (var, value, key) in [
            ("SECKILL__AMQP__OWNED_SHARDS", "[0, 1]", "amqp.owned_shards"),
            ("SECKILL__AMQP__NAMESPACE", "no spaces", "amqp.namespace"),
            ("SECKILL__AMQP__URL", "http://guest:hunter2@h/", "amqp.url"),
            (
                "SECKILL__FRONTSTAGE__AMQP_URL",
                "nope://guest:hunter2@h/",
                "frontstage.amqp_url",
            ),
        ] {
            let err = crate::config::check::tests::refusal(var, value, key);
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
