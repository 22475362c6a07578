//! HTTP: the front stage (reservations and status queries) on `http.addr`, and the
//! admin endpoints (liveness, readiness, metrics, operator API, the live page) on
//! `admin.addr`.

pub mod admin;
pub mod auth;
pub mod front;
pub mod limits;
pub mod live_page;
pub mod operations;

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("Redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("RabbitMQ: {0}")]
    Mq(#[from] crate::mq::MqError),
    #[error(transparent)]
    Auth(#[from] auth::AuthConfigError),
    #[error("configuration key `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
    #[error(transparent)]
    NotReady(#[from] crate::config::ConfigError),
    #[error("PostgreSQL: {0}")]
    Store(#[from] crate::store::StoreError),
}

pub(crate) fn bind_error(addr: &str, source: std::io::Error) -> HttpError {
    HttpError::Bind {
        addr: addr.to_owned(),
        source,
    }
}

/// The address a server actually bound (the configured one may have port 0).
pub(crate) fn bound_addr(addrs: &[SocketAddr], configured: &str) -> Result<SocketAddr, HttpError> {
    addrs
        .first()
        .copied()
        .ok_or_else(|| bind_error(configured, std::io::Error::other("no address bound")))
}

/// A running HTTP server and the address it listens on (useful with port 0).
pub struct Running {
    pub server: actix_web::dev::Server,
    pub addr: SocketAddr,
}
