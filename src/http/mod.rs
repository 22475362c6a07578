//! HTTP: the front stage (reservations and status queries) on `http.addr`, and the
//! admin endpoints (liveness, readiness, metrics, operator API, the live page) on
//! `admin.addr`.

pub mod admin;
pub mod auth;
pub mod client;
pub mod front;
pub mod limits;
pub mod live_page;
pub mod openapi;
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

/// Connections the admin listener accepts at once (probes, scrapes, operators).
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// The process's soft and hard limits on open file descriptors.
pub fn descriptor_limits() -> Option<(u64, u64)> {
    rlimit::getrlimit(rlimit::Resource::NOFILE).ok()
}

/// Descriptors the rest of the process needs while the front stage is full: every
/// pooled PostgreSQL connection (the engine's, the front stage's, a replica's), the
/// admin listener's connections, and slack for the broker's and Redis's
/// connections, log files and sockets opened in passing.
fn reserved_descriptors(settings: &crate::config::Settings) -> u64 {
    const SLACK: u64 = 256;
    u64::from(settings.database.pool_size)
        + u64::from(settings.frontstage.db_pool_size)
        + u64::from(settings.database.pool_size.min(8))
        + ADMIN_MAX_CONNECTIONS as u64
        + SLACK
}

/// Open connections per front-stage worker: what is left of the soft descriptor
/// limit once `reserved_descriptors` is kept aside, shared by the workers, so a flood
/// of connections can never take the descriptors the order path needs;
/// `frontstage.limits.max_connections`, when set, only lowers it.
pub fn front_connection_cap(settings: &crate::config::Settings, soft_limit: u64) -> usize {
    let workers = settings.frontstage.workers.max(1) as u64;
    let spare = soft_limit.saturating_sub(reserved_descriptors(settings));
    let derived = usize::try_from((spare / workers).max(1)).unwrap_or(usize::MAX);
    match settings.frontstage.limits.max_connections {
        0 => derived,
        configured => configured.min(derived),
    }
}

/// A listener's deadlines: the request head within `header_read_ms`, an idle
/// keep-alive connection closed after `keep_alive_ms` (0: after each response).
pub(crate) struct Deadlines {
    pub header_read: std::time::Duration,
    pub keep_alive: actix_web::http::KeepAlive,
}

impl Deadlines {
    pub(crate) fn new(limits: &crate::config::ConnectionLimits) -> Self {
        use std::time::Duration;
        Self {
            header_read: Duration::from_millis(limits.header_read_ms),
            keep_alive: match limits.keep_alive_ms {
                0 => actix_web::http::KeepAlive::Disabled,
                ms => actix_web::http::KeepAlive::Timeout(Duration::from_millis(ms)),
            },
        }
    }
}

/// A client that does not take its response is let go after this.
pub(crate) const DISCONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// A running HTTP server and the address it listens on (useful with port 0).
pub struct Running {
    pub server: actix_web::dev::Server,
    pub addr: SocketAddr,
}
