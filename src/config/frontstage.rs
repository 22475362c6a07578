//! `[frontstage]` with `.auth`, `.rate_limit` and `.purchase_token`: the buyers' HTTP
//! front stage, who the buyer is (`http::auth`), how often one may ask
//! (`http::limits`) and the anti-bot token (`domain::purchase_token`).

use std::net::IpAddr;
use std::path::PathBuf;

use secrecy::SecretString;
use serde::Deserialize;

use super::check::{Check, ConfigError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontstageSettings {
    pub reservation_ttl_ms: u64,
    pub request_ttl_secs: u64,
    pub workers: usize,
    pub reconcile_interval_ms: u64,
    /// Connections of the front stage's own pool (`serve`), apart from the engine's.
    pub db_pool_size: u32,
    /// How long a SKU the reserve script found sold out is answered from memory.
    pub sold_out_recheck_ms: u64,
    pub auth: AuthSettings,
    pub rate_limit: RateLimitSettings,
    pub purchase_token: PurchaseTokenSettings,
    /// The broker user the front stage publishes order messages as (write on the
    /// order exchange only); unset: `amqp.url`. Uses `amqp.tls`.
    #[serde(default)]
    pub amqp_url: Option<SecretString>,
}

/// GCRA limits per user and per client address (`http::limits`); 0 turns one off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    pub per_user_per_s: u32,
    pub per_user_burst: u32,
    pub per_address_per_s: u32,
    pub per_address_burst: u32,
}

/// The anti-bot purchase token (`domain::purchase_token`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurchaseTokenSettings {
    pub required: bool,
    #[serde(default)]
    pub secret: Option<SecretString>,
    pub ttl_secs: u64,
    pub max_per_user: u32,
}

/// The shortest `frontstage.auth.hs256_secret`: the key is as strong as the secret
/// (RFC 7518 §3.2 asks for at least the hash's size, 256 bits).
pub const MIN_HS256_SECRET_BYTES: usize = 32;

/// How the front stage learns who the buyer is (`http::auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Jwt,
    Gateway,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub mode: AuthMode,
    #[serde(default)]
    pub hs256_secret: Option<SecretString>,
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
    pub gateway_header: String,
    pub trusted_proxies: Vec<IpAddr>,
}

impl FrontstageSettings {
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        self.rate_limit.validate(ctx)?;
        for (key, secret) in [
            (
                "frontstage.purchase_token.secret",
                &self.purchase_token.secret,
            ),
            ("frontstage.auth.hs256_secret", &self.auth.hs256_secret),
        ] {
            ctx.secret_len(key, secret.as_ref(), MIN_HS256_SECRET_BYTES, "bytes")?;
        }
        Ok(())
    }
}

impl RateLimitSettings {
    fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        for (key, rate, burst) in [
            (
                "frontstage.rate_limit.per_user_burst",
                self.per_user_per_s,
                self.per_user_burst,
            ),
            (
                "frontstage.rate_limit.per_address_burst",
                self.per_address_per_s,
                self.per_address_burst,
            ),
        ] {
            if rate > 0 && burst == 0 {
                return Err(ctx.invalid(key, "must be at least 1 while its rate is on"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.
    use crate::config::Settings;
    use figment::Jail;

    /// The load error with these variables set.
    fn refused(jail: &mut Jail, vars: &[(&str, &str)]) -> String {
        for (var, value) in vars {
            jail.set_env(var, value);
        }
        match Settings::load(None) {
            Ok(_) => format!("{vars:?} accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_bad_value_names_its_key_and_source() {
        for (vars, key) in [
            (
                &[("SECKILL__FRONTSTAGE__RATE_LIMIT__PER_USER_BURST", "0")][..],
                "frontstage.rate_limit.per_user_burst",
            ),
            (
                &[("SECKILL__FRONTSTAGE__AUTH__HS256_SECRET", "hunter2")][..],
                "frontstage.auth.hs256_secret",
            ),
            (
                &[("SECKILL__FRONTSTAGE__PURCHASE_TOKEN__TTL_SECS", "3601")][..],
                "frontstage.purchase_token.ttl_secs",
            ),
        ] {
            Jail::expect_with(|jail| {
                let err = refused(jail, vars);
                assert!(err.contains(&format!("`{key}`")), "{err}");
                assert!(err.contains(vars[vars.len() - 1].0), "{err}");
                assert!(!err.contains("hunter2"), "{err}");
                Ok(())
            });
        }
    }
}
