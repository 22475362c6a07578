//! What each of the engine's links runs over, TLS or plaintext, and why (the
//! setting that decides it), for `validate` and the start-up log: an operator reads
//! it without decoding URLs. Never prints a URL (they may hold passwords).

use secrecy::ExposeSecret;

use super::amqp::AmqpSettings;
use super::database::DatabaseSettings;
use super::redis::RedisSettings;
use crate::tls::{split_sslmode, SslMode};

/// One link: its name, the key that decides it, and what it runs over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    pub link: &'static str,
    pub key: &'static str,
    pub summary: String,
}

/// PostgreSQL, RabbitMQ and Redis, each as configured.
pub(super) fn transports(
    database: &DatabaseSettings,
    amqp: &AmqpSettings,
    redis: &RedisSettings,
) -> Vec<Transport> {
    {
        let pg = match split_sslmode(database.url.expose_secret(), "database.url") {
            Ok((_, mode)) => postgres(mode),
            Err(why) => format!("unknown: {why}"),
        };
        let scheme = |url: &str, tls: &str, plain: &str, section: &str| {
            match url.split_once("://")
        {
            Some((s, _)) if s == tls => format!(
                "TLS ({tls}://), the server verified against {section}.tls.ca_file and the system's roots"
            ),
            Some((s, _)) if s == plain => {
                format!("plaintext ({plain}:// URL; {tls}:// for TLS)")
            }
            _ => "unknown scheme".to_owned(),
        }
        };
        vec![
            Transport {
                link: "postgres",
                key: "database.url",
                summary: pg,
            },
            Transport {
                link: "rabbitmq",
                key: "amqp.url",
                summary: scheme(amqp.url.expose_secret(), "amqps", "amqp", "amqp"),
            },
            Transport {
                link: "redis",
                key: "redis.url",
                summary: scheme(redis.url.expose_secret(), "rediss", "redis", "redis"),
            },
        ]
    }
}

fn postgres(mode: SslMode) -> String {
    match mode {
        SslMode::Disable => "plaintext (sslmode=disable)".to_owned(),
        SslMode::Prefer => {
            "TLS if the server offers it, else plaintext (sslmode=prefer, libpq's default; \
             verify-full requires TLS and checks the server)"
                .to_owned()
        }
        SslMode::Require => "TLS, the server not verified (sslmode=require)".to_owned(),
        SslMode::VerifyCa => {
            "TLS, the server's certificate verified against database.tls.ca_file (sslmode=verify-ca)"
                .to_owned()
        }
        SslMode::VerifyFull => {
            "TLS, the server's certificate (against database.tls.ca_file) and host name verified \
             (sslmode=verify-full)"
                .to_owned()
        }
    }
}
