//! `[http]` and `[admin]`: the two listeners, and the admin listener's tokens.

use std::net::SocketAddr;

use secrecy::SecretString;
use serde::Deserialize;

use super::check::{Check, ConfigError};

/// The front stage's listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: String,
}

impl HttpSettings {
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        socket_address(ctx, "http.addr", &self.addr).map(drop)
    }

    /// Whether the front stage listens on a loopback address only.
    pub fn is_loopback(&self) -> bool {
        self.addr
            .parse::<SocketAddr>()
            .is_ok_and(|addr| addr.ip().is_loopback())
    }
}

/// Health, readiness, metrics and the operator API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    pub addr: String,
    /// Bearer token for the `/admin/*` operations; without one they are off (404).
    #[serde(default)]
    pub token: Option<SecretString>,
    /// Bearer token `/metrics` requires when set (off by default: scrapers on a
    /// private network).
    #[serde(default)]
    pub metrics_token: Option<SecretString>,
    /// Host names the admin listener answers to besides IP addresses and
    /// `localhost` (a DNS-rebinding page's requests carry its own name).
    pub allowed_hosts: Vec<String>,
}

/// The shortest admin token: short tokens can be guessed, and the operator API can
/// replay and retry work.
const MIN_TOKEN_CHARS: usize = 16;

impl AdminSettings {
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        socket_address(ctx, "admin.addr", &self.addr)?;
        for (key, token) in [
            ("admin.token", &self.token),
            ("admin.metrics_token", &self.metrics_token),
        ] {
            ctx.secret_len(key, token.as_ref(), MIN_TOKEN_CHARS, "characters")?;
        }
        Ok(())
    }
}

fn socket_address(ctx: &Check, key: &str, addr: &str) -> Result<SocketAddr, ConfigError> {
    addr.parse()
        .map_err(|e| ctx.invalid(key, format!("not a socket address: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.

    #[test]
    fn a_bad_value_names_its_key_and_source() {
        for (var, value, key) in [
            ("SECKILL__HTTP__ADDR", "localhost:8080", "http.addr"),
            ("SECKILL__ADMIN__ADDR", "not-an-address", "admin.addr"),
            ("SECKILL__ADMIN__TOKEN", "short-hunter2", "admin.token"),
        ] {
            let err = crate::config::check::tests::refusal(var, value, key);
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    /// The admin listener's extra host names, as deploy/README.md sets them.
    #[test]
    fn allowed_hosts_are_read_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "SECKILL__ADMIN__ALLOWED_HOSTS",
                r#"["host.docker.internal"]"#,
            );
            let settings = crate::config::Settings::load(None).expect("valid settings");
            assert_eq!(settings.admin.allowed_hosts, ["host.docker.internal"]);
            Ok(())
        });
    }
}
