//! Redis, the front stage's fast pre-filter: connections, key layout, the stock it
//! is loaded with, and whether it answers (`health`). PostgreSQL stays the source
//! of truth; Redis only says "probably yes".

pub mod commands;
pub mod health;
pub mod keys;
pub mod scripts;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

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
    current: std::sync::Arc<std::sync::RwLock<Master>>,
}

/// The master as last followed: its address, its client (for more connections to
/// it, `WorkerLink`), the shared connection, and how many times the link moved.
struct Master {
    address: String,
    client: ::redis::Client,
    conn: ::redis::aio::ConnectionManager,
    epoch: u64,
}

impl MasterLink {
    pub async fn open(settings: &RedisSettings) -> Result<Self, ::redis::RedisError> {
        let client = master_client(settings).await?;
        let address = client.get_connection_info().addr().to_string();
        let conn = connect_managed(client.clone())
            .await
            .map_err(|e| in_tls(settings, e))?;
        Ok(Self {
            settings: std::sync::Arc::new(settings.clone()),
            current: std::sync::Arc::new(std::sync::RwLock::new(Master {
                address,
                client,
                conn,
                epoch: 0,
            })),
        })
    }

    fn master(&self) -> std::sync::RwLockReadGuard<'_, Master> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The connection to the master as last followed.
    pub fn conn(&self) -> ::redis::aio::ConnectionManager {
        self.master().conn.clone()
    }

    /// The master's client and how many times the link has moved so far: a
    /// connection opened with this client is current until the epoch changes.
    fn client(&self) -> (u64, ::redis::Client) {
        let master = self.master();
        (master.epoch, master.client.clone())
    }

    /// How many times the link has moved to another master.
    fn epoch(&self) -> u64 {
        self.master().epoch
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
        if address == self.master().address {
            return Ok(None);
        }
        let conn = connect_managed(client.clone()).await?;
        let mut master = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *master = Master {
            address: address.clone(),
            client,
            conn,
            epoch: master.epoch + 1,
        };
        Ok(Some(address))
    }
}

/// After a failed attempt, the worker uses the shared connection this long before
/// it tries to open its own again (a Redis outage must not cost a connect per
/// request).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The worker's own connection, and whether one is being opened.
enum Slot {
    Unopened,
    Opening,
    /// Opened to the master of this `MasterLink` epoch.
    Open(u64, ::redis::aio::ConnectionManager),
    Failed(Instant),
}

/// A worker thread's own connection to the master that a `MasterLink` follows.
///
/// The front stage's HTTP workers each run a single-threaded runtime. A command sent
/// through the shared `MasterLink` connection is written and answered by the thread
/// that drives that connection: two thread wake-ups per command, on a path that
/// sends about one command per request (docs/BENCHMARKS.md, "CPU per order"). A
/// connection opened on the worker is driven by the worker itself, between its
/// requests. The shared connection stays the fallback: while the worker's own is
/// being opened, after it could not be, and before the first request.
///
/// Made once per worker (in the HTTP server's app factory) and used only on that
/// worker's thread: it opens its connection with `tokio::task::spawn_local`, so it
/// needs the worker's `LocalSet`, which every actix-web handler runs in.
pub struct WorkerLink {
    link: MasterLink,
    slot: Rc<RefCell<Slot>>,
}

impl WorkerLink {
    pub fn new(link: MasterLink) -> Self {
        Self {
            link,
            slot: Rc::new(RefCell::new(Slot::Unopened)),
        }
    }

    /// The worker's own connection when it is open to the current master; otherwise
    /// the shared one, and the worker's own is opened in the background. A Sentinel
    /// fail-over (`MasterLink::follow`) makes the worker open a new one.
    pub fn conn(&self) -> ::redis::aio::ConnectionManager {
        let epoch = self.link.epoch();
        let open_now = {
            let mut slot = self.slot.borrow_mut();
            match &*slot {
                Slot::Open(opened, conn) if *opened == epoch => return conn.clone(),
                Slot::Opening => false,
                Slot::Failed(at) if at.elapsed() < RETRY_AFTER => false,
                Slot::Open(..) | Slot::Failed(_) | Slot::Unopened => {
                    *slot = Slot::Opening;
                    true
                }
            }
        };
        if open_now {
            self.open();
        }
        self.link.conn()
    }

    fn open(&self) {
        let (epoch, client) = self.link.client();
        let slot = Rc::clone(&self.slot);
        tokio::task::spawn_local(async move {
            let next = match connect_managed(client).await {
                Ok(conn) => Slot::Open(epoch, conn),
                Err(e) => {
                    tracing::debug!(error = %e, "a worker's own Redis connection did not open; it uses the shared one");
                    Slot::Failed(Instant::now())
                }
            };
            *slot.borrow_mut() = next;
        });
    }

    /// Whether the worker's own connection is open (tests).
    pub fn is_open(&self) -> bool {
        matches!(&*self.slot.borrow(), Slot::Open(..))
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
const MANAGED_TIMEOUT: Duration = Duration::from_secs(2);

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
        .set_max_delay(Duration::from_millis(500));
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
    let started = Instant::now();
    let result = call.await;
    metrics::histogram!(crate::telemetry::names::REDIS_COMMAND_DURATION_SECONDS, "command" => command)
        .record(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!(crate::telemetry::names::REDIS_ERRORS_TOTAL, "command" => command)
            .increment(1);
    }
    result
}
