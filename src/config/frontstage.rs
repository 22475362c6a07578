//! `[frontstage]` with `.auth`, `.rate_limit` and `.purchase_token`: the buyers' HTTP
//! front stage, who the buyer is (`http::auth`), how often one may ask
//! (`http::limits`) and the anti-bot token (`domain::purchase_token`).
//!
//! A value that is set but cannot work is refused at load, whatever the command. A
//! key only the front stage needs and the defaults leave unset (a JWT key, the
//! purchase token secret: the defaults also serve commands that start no front
//! stage) is checked by `FrontstageSettings::ready`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use secrecy::SecretString;
use serde::Deserialize;

use super::check::{Check, ConfigError};
use super::http::HttpSettings;

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
    pub limits: ConnectionLimits,
    /// The broker user the front stage publishes order messages as (write on the
    /// order exchange only); unset: `amqp.url`. Uses `amqp.tls`.
    #[serde(default)]
    pub amqp_url: Option<SecretString>,
    /// The same user on a cluster's nodes, tried in order (`amqp.urls`' twin); when
    /// set, it wins over `amqp_url`.
    #[serde(default)]
    pub amqp_urls: Vec<SecretString>,
}

/// Deadlines and a cap for HTTP connections, so that no slow or idle client holds
/// the door (`http::front`; the admin listener takes the same deadlines).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionLimits {
    /// The request head must arrive within this.
    pub header_read_ms: u64,
    /// A reservation's body must arrive within this (it is read after the head
    /// passed the credentials and the limits).
    pub body_read_ms: u64,
    /// An idle keep-alive connection is closed after this; 0 closes every
    /// connection after its response.
    pub keep_alive_ms: u64,
    /// Open connections per worker; 0 derives it from the process's file descriptor
    /// limit (and a value above that is lowered to it).
    pub max_connections: usize,
}

/// GCRA limits per user and per client address (`http::limits`); 0 turns one off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    pub per_user_per_s: u32,
    pub per_user_burst: u32,
    pub per_address_per_s: u32,
    pub per_address_burst: u32,
    /// A buyer's reads (their reservations, orders, history), apart from what they
    /// spend: one buyer polling cannot slow the others' reads.
    pub per_user_reads_per_s: u32,
    pub per_user_reads_burst: u32,
    /// IPv6 clients are limited per network of this prefix length (a /64 is one
    /// subscriber's, and holds 2^64 addresses).
    pub ipv6_prefix_len: u8,
}

/// An IP network from the configuration: `10.0.0.0/8`, `2001:db8::/32`, or a bare
/// address (one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr(pub ipnet::IpNet);

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let text = text.trim();
        text.parse::<ipnet::IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(ipnet::IpNet::from))
            .map(|net| Cidr(net.trunc()))
            .map_err(|_| {
                format!("`{text}` is not an IP network (10.0.0.0/8, 2001:db8::/32) or address")
            })
    }
}

impl Cidr {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.0.contains(ip)
    }
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
    /// The proxies (networks) in front of the front stage: the gateway's
    /// identity header is believed only from them, and behind them the client's
    /// address is read from `X-Forwarded-For` (`http::client`).
    pub trusted_proxies: Vec<Cidr>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
    /// The longest a token may be good for (`exp − iat`, or `exp − now` without
    /// `iat`): a stolen long-lived token is refused, not honoured until 2286.
    pub max_lifetime_secs: u64,
}

impl FrontstageSettings {
    /// `http`: where the front stage listens (mode `none` needs a loopback address).
    pub(super) fn validate(&self, ctx: &Check, http: &HttpSettings) -> Result<(), ConfigError> {
        self.rate_limit.validate(ctx)?;
        ctx.secret_len(
            "frontstage.purchase_token.secret",
            self.purchase_token.secret.as_ref(),
            MIN_HS256_SECRET_BYTES,
            "bytes",
        )?;
        self.auth.validate(ctx, http)
    }

    /// Whether the front stage can authenticate buyers and sign purchase tokens:
    /// the keys `serve` needs that the defaults leave unset.
    pub fn ready(&self) -> Result<(), ConfigError> {
        let auth = &self.auth;
        if auth.mode == AuthMode::Jwt
            && auth.hs256_secret.is_none()
            && auth.public_key_file.is_none()
        {
            return Err(Check::missing(
                "frontstage.auth.hs256_secret",
                "frontstage.auth.mode = \"jwt\" needs it (at least 32 bytes, through SECKILL__FRONTSTAGE__AUTH__HS256_SECRET) or frontstage.auth.public_key_file",
            ));
        }
        let tokens = &self.purchase_token;
        if tokens.required && tokens.secret.is_none() {
            return Err(Check::missing(
                "frontstage.purchase_token.secret",
                "frontstage.purchase_token.required needs it (at least 32 bytes, shared by every front-stage instance, through SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET)",
            ));
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
            (
                "frontstage.rate_limit.per_user_reads_burst",
                self.per_user_reads_per_s,
                self.per_user_reads_burst,
            ),
        ] {
            if rate > 0 && burst == 0 {
                return Err(ctx.invalid(key, "must be at least 1 while its rate is on"));
            }
        }
        Ok(())
    }
}

impl AuthSettings {
    /// What `http::auth::Authenticator` would refuse of a mode's keys once set.
    fn validate(&self, ctx: &Check, http: &HttpSettings) -> Result<(), ConfigError> {
        ctx.secret_len(
            "frontstage.auth.hs256_secret",
            self.hs256_secret.as_ref(),
            MIN_HS256_SECRET_BYTES,
            "bytes",
        )?;
        match self.mode {
            AuthMode::Jwt => match &self.public_key_file {
                Some(_) if self.hs256_secret.is_some() => Err(ctx.invalid(
                    "frontstage.auth.public_key_file",
                    "set either it or frontstage.auth.hs256_secret, not both",
                )),
                Some(path) => public_key(ctx, path),
                None => Ok(()),
            },
            AuthMode::Gateway => {
                if self.trusted_proxies.is_empty() {
                    return Err(ctx.invalid(
                        "frontstage.auth.trusted_proxies",
                        "mode \"gateway\" trusts the identity header only from these addresses; list the gateway's",
                    ));
                }
                self.header(ctx)
            }
            AuthMode::None => {
                if !http.is_loopback() {
                    return Err(ctx.invalid(
                        "frontstage.auth.mode",
                        format!(
                            "\"none\" trusts any caller's identity header: local development only, and http.addr ({}) is not a loopback address",
                            http.addr
                        ),
                    ));
                }
                self.header(ctx)
            }
        }
    }

    fn header(&self, ctx: &Check) -> Result<(), ConfigError> {
        actix_web::http::header::HeaderName::from_bytes(self.gateway_header.as_bytes())
            .map(drop)
            .map_err(|e| {
                ctx.invalid(
                    "frontstage.auth.gateway_header",
                    format!("not a header name: {e}"),
                )
            })
    }
}

/// The identity provider's public key: RS256 or ES256 (P-256), PEM.
fn public_key(ctx: &Check, path: &Path) -> Result<(), ConfigError> {
    let key = "frontstage.auth.public_key_file";
    let pem =
        std::fs::read(path).map_err(|e| ctx.invalid(key, format!("{}: {e}", path.display())))?;
    let rsa = jsonwebtoken::DecodingKey::from_rsa_pem(&pem);
    if rsa.is_err() && jsonwebtoken::DecodingKey::from_ec_pem(&pem).is_err() {
        return Err(ctx.invalid(
            key,
            format!("{}: not a PEM RSA or EC (P-256) public key", path.display()),
        ));
    }
    Ok(())
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
            (
                &[("SECKILL__FRONTSTAGE__AUTH__PUBLIC_KEY_FILE", "absent.pem")][..],
                "frontstage.auth.public_key_file",
            ),
            (
                &[
                    ("SECKILL__HTTP__ADDR", "0.0.0.0:8080"),
                    ("SECKILL__FRONTSTAGE__AUTH__MODE", "none"),
                ][..],
                "frontstage.auth.mode",
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

    #[test]
    fn what_the_auth_mode_needs_once_set_is_checked_at_load() {
        Jail::expect_with(|jail| {
            jail.create_file("not-a-key.pem", "-----BEGIN NOTHING-----\n")?;
            let err = refused(
                jail,
                &[(
                    "SECKILL__FRONTSTAGE__AUTH__PUBLIC_KEY_FILE",
                    "not-a-key.pem",
                )],
            );
            assert!(err.contains("not a PEM RSA or EC"), "{err}");
            let secret = "a-secret-that-is-long-enough-for-hs256";
            let err = refused(jail, &[("SECKILL__FRONTSTAGE__AUTH__HS256_SECRET", secret)]);
            assert!(err.contains("`frontstage.auth.public_key_file`"), "{err}");
            assert!(err.contains("not both"), "{err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__FRONTSTAGE__AUTH__MODE", "gateway");
            let err = refused(jail, &[]);
            assert!(err.contains("`frontstage.auth.trusted_proxies`"), "{err}");
            assert!(err.contains("default.toml"), "{err}");
            let err = refused(
                jail,
                &[
                    (
                        "SECKILL__FRONTSTAGE__AUTH__TRUSTED_PROXIES",
                        "[\"10.0.0.1\"]",
                    ),
                    ("SECKILL__FRONTSTAGE__AUTH__GATEWAY_HEADER", "no spaces"),
                ],
            );
            assert!(err.contains("`frontstage.auth.gateway_header`"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_defaults_load_but_are_not_ready_for_the_front_stage() {
        Jail::expect_with(|jail| {
            let ready = || {
                let settings = Settings::load(None).expect("valid settings");
                settings.frontstage_ready().map_err(|e| e.to_string())
            };
            let err = ready().unwrap_err();
            assert!(err.contains("`frontstage.auth.hs256_secret`"), "{err}");
            assert!(err.contains("no source (missing)"), "{err}");
            let secret = "a-secret-that-is-long-enough-for-hs256";
            jail.set_env("SECKILL__FRONTSTAGE__AUTH__HS256_SECRET", secret);
            let err = ready().unwrap_err();
            assert!(err.contains("`frontstage.purchase_token.secret`"), "{err}");
            assert!(!err.contains(secret), "{err}");
            jail.set_env("SECKILL__FRONTSTAGE__PURCHASE_TOKEN__REQUIRED", "false");
            assert_eq!(ready(), Ok(()));
            jail.set_env("SECKILL__FRONTSTAGE__PURCHASE_TOKEN__REQUIRED", "true");
            jail.set_env("SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET", secret);
            assert_eq!(ready(), Ok(()));
            Ok(())
        });
    }
}
