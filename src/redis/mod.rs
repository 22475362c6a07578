//! Redis, the front stage's fast pre-filter: connections, key layout, the stock it
//! is loaded with, and whether it answers (`health`). PostgreSQL stays the source
//! of truth; Redis only says "probably yes".

pub mod commands;
pub mod health;
pub mod keys;
pub mod scripts;

use secrecy::ExposeSecret;

use crate::config::RedisSettings;
use keys::SkuKeys;

/// A connection any Redis call here can go through: a multiplexed connection, or a
/// `ConnectionManager` that reconnects.
pub trait Conn: ::redis::aio::ConnectionLike + Send {}
impl<T: ::redis::aio::ConnectionLike + Send> Conn for T {}

/// Opens a multiplexed connection (cheap to clone) to the master: `redis.url`, or in
/// Sentinel mode the server the sentinels name now. It does not reconnect: once
/// the server closed it (a restart, `CLIENT KILL`), every call on it fails. For a
/// long-lived connection use `MasterLink`.
pub async fn connect(
    settings: &RedisSettings,
) -> Result<::redis::aio::MultiplexedConnection, ::redis::RedisError> {
    master_client(settings)
        .await?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| in_tls(settings, e))
}

/// The client of the master: `client(settings)`, or in Sentinel mode (`redis.sentinels`)
/// a client of the server the sentinels name for `redis.master_name`, with
/// `redis.url`'s credentials and database.
pub async fn master_client(
    settings: &RedisSettings,
) -> Result<::redis::Client, ::redis::RedisError> {
    let Some(name) = settings
        .master_name
        .as_deref()
        .filter(|_| !settings.sentinels.is_empty())
    else {
        return client(settings);
    };
    crate::tls::install_provider();
    let url = ::redis::IntoConnectionInfo::into_connection_info(settings.url.expose_secret())?;
    let mut node = ::redis::sentinel::SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(url.redis_settings().clone());
    if matches!(url.addr(), ::redis::ConnectionAddr::TcpTls { .. }) {
        node = node.set_tls_mode(::redis::TlsMode::Secure);
    }
    let sentinels: Vec<&str> = settings
        .sentinels
        .iter()
        .map(|s| s.expose_secret())
        .collect();
    let mut sentinel = ::redis::sentinel::SentinelClient::build(
        sentinels,
        name,
        Some(node),
        ::redis::sentinel::SentinelServerType::Master,
    )?;
    sentinel.async_get_client().await
}

/// A long-lived connection to the master (`connect_managed`), which in Sentinel
/// mode moves to the new master after a fail-over (`follow`). Cheap to clone; the
/// clones share it.
#[derive(Clone)]
pub struct MasterLink {
    settings: std::sync::Arc<RedisSettings>,
    current: std::sync::Arc<std::sync::RwLock<(String, ::redis::aio::ConnectionManager)>>,
}

impl MasterLink {
    pub async fn open(settings: &RedisSettings) -> Result<Self, ::redis::RedisError> {
        let client = master_client(settings).await?;
        let address = client.get_connection_info().addr().to_string();
        let conn = connect_managed(client)
            .await
            .map_err(|e| in_tls(settings, e))?;
        Ok(Self {
            settings: std::sync::Arc::new(settings.clone()),
            current: std::sync::Arc::new(std::sync::RwLock::new((address, conn))),
        })
    }

    /// The connection to the master as last followed.
    pub fn conn(&self) -> ::redis::aio::ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .clone()
    }

    /// In Sentinel mode: asks the sentinels which server is the master and, when it
    /// is another than the one connected, connects to it and returns its address.
    /// Without sentinels: nothing to follow (`ConnectionManager` reconnects by itself).
    pub async fn follow(&self) -> Result<Option<String>, ::redis::RedisError> {
        if self.settings.sentinels.is_empty() {
            return Ok(None);
        }
        let client = master_client(&self.settings).await?;
        let address = client.get_connection_info().addr().to_string();
        let known = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone();
        if address == known {
            return Ok(None);
        }
        let conn = connect_managed(client).await?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (address.clone(), conn);
        Ok(Some(address))
    }
}

/// The client of `redis.url`; for `rediss://` with `redis.tls`'s CA (instead of
/// the system's roots) and client certificate, through rustls on the process's
/// provider (`crate::tls`).
pub fn client(settings: &RedisSettings) -> Result<::redis::Client, ::redis::RedisError> {
    crate::tls::install_provider();
    let url = settings.url.expose_secret();
    if !settings.tls.is_set() {
        return ::redis::Client::open(url);
    }
    let unusable = |e: crate::tls::TlsError| {
        ::redis::RedisError::from((
            ::redis::ErrorKind::InvalidClientConfig,
            "redis.tls cannot be used",
            format!("`{}`: {}", e.key, e.reason),
        ))
    };
    let root_cert = settings.tls.ca_pem("redis").map_err(unusable)?;
    let client_tls =
        settings
            .tls
            .identity("redis")
            .map_err(unusable)?
            .map(|id| ::redis::ClientTlsConfig {
                client_cert: id.chain_pem,
                client_key: id.key_pem,
            });
    ::redis::Client::build_with_tls(
        url,
        ::redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
}

/// A failure to connect to a `rediss://` URL says so: against a plaintext port the
/// handshake only times out.
fn in_tls(settings: &RedisSettings, e: ::redis::RedisError) -> ::redis::RedisError {
    if !settings.url.expose_secret().starts_with("rediss://") {
        return e;
    }
    ::redis::RedisError::from((
        e.kind(),
        "no TLS session with the server (redis.url is rediss://)",
        e.to_string(),
    ))
}

/// How long a long-lived connection waits for one answer, and to connect.
const MANAGED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens a connection that reconnects by itself after the server closed it (the
/// crate's `ConnectionManager`): the call that saw the break fails, and the ones
/// after it go through a new connection as soon as one can be opened. Cheap to
/// clone; the clones share the connection. Every call is bounded by
/// `MANAGED_TIMEOUT`, so a server that hangs is an error, not a stuck request.
async fn connect_managed(
    client: ::redis::Client,
) -> Result<::redis::aio::ConnectionManager, ::redis::RedisError> {
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(MANAGED_TIMEOUT))
        .set_response_timeout(Some(MANAGED_TIMEOUT))
        .set_max_delay(std::time::Duration::from_millis(500));
    ::redis::aio::ConnectionManager::new_with_config(client, config).await
}

/// Loads the stock of every bucket of a SKU, and the bucket count, atomically. Like
/// every key of the sale, they expire `keys::SALE_KEYS_GRACE` after the sale ends.
pub async fn load_stock(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    per_bucket: &[i32],
    sale_end: chrono::DateTime<chrono::Utc>,
) -> Result<(), ::redis::RedisError> {
    let expire_at = keys::sale_keys_expire_at_ms(sale_end.timestamp_millis());
    let mut pipe = ::redis::pipe();
    pipe.atomic();
    for (bucket, stock) in per_bucket.iter().enumerate() {
        let key = keys.stock(bucket as i16);
        pipe.set(&key, *stock).ignore();
        pipe.cmd("PEXPIREAT").arg(&key).arg(expire_at).ignore();
    }
    pipe.set(keys.bucket_count(), per_bucket.len()).ignore();
    pipe.cmd("PEXPIREAT")
        .arg(keys.bucket_count())
        .arg(expire_at)
        .ignore();
    pipe.query_async::<()>(conn).await
}

/// Runs one Redis command, recording its duration and whether it failed under the
/// command's name (a small fixed set: the scripts and the commands we send).
pub async fn timed<T>(
    command: &'static str,
    call: impl std::future::Future<Output = Result<T, ::redis::RedisError>>,
) -> Result<T, ::redis::RedisError> {
    let started = std::time::Instant::now();
    let result = call.await;
    metrics::histogram!(crate::telemetry::names::REDIS_COMMAND_DURATION_SECONDS, "command" => command)
        .record(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!(crate::telemetry::names::REDIS_ERRORS_TOTAL, "command" => command)
            .increment(1);
    }
    result
}
