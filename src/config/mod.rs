//! The typed settings tree: `config/default.toml` (compiled in, so the binary runs from
//! any directory), then an optional file named by `--config`, then environment
//! variables `SECKILL__SECTION__KEY`. Everything is validated once at start; an error
//! names the key and where its value came from. Credentials live in `SecretString`
//! and are never printed.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::tls::{SslMode, TlsError, TlsFiles};

/// The defaults, compiled into the binary.
const DEFAULTS: &str = include_str!("../../config/default.toml");
/// Keys of earlier releases and the keys that replaced them: a configuration still
/// carrying one is refused with the new name rather than an "unknown field".
const REPLACED_KEYS: &[(&str, &str)] = &[
    ("outbox.retention_secs", "retention.outbox_history_secs"),
    ("outbox.retention_batch", "retention.batch_size"),
];
/// Prefix of environment overrides; `__` separates the path segments.
pub const ENV_PREFIX: &str = "SECKILL__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read at all (e.g. a missing or unparsable file).
    #[error("configuration: {0}")]
    Load(String),
    #[error("configuration key `{key}` (from {origin}): {reason}")]
    Invalid {
        key: String,
        origin: String,
        reason: String,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub amqp: AmqpSettings,
    pub redis: RedisSettings,
    pub engine: EngineSettings,
    pub http: HttpSettings,
    pub telemetry: TelemetrySettings,
    pub outbox: OutboxSettings,
    pub retention: RetentionSettings,
    pub sweeper: SweeperSettings,
    pub compensation: CompensationSettings,
    pub payment: PaymentSettings,
    pub supervisor: SupervisorSettings,
    pub frontstage: FrontstageSettings,
    pub admin: AdminSettings,
    pub shutdown: ShutdownSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    pub grace_ms: u64,
}

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
}

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
    pub public_key_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
    pub gateway_header: String,
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
    pub busy_interval_ms: u64,
    pub max_lag_ms: u64,
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

/// `[retention]` (seed §8.5): what the retention service keeps and for how long.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
    pub inbox_secs: u64,
    pub outbox_history_secs: u64,
}

impl RetentionSettings {
    /// How long an inbox row is kept: the window in which a redelivered or replayed
    /// message is still answered by the inbox.
    pub fn inbox_window(&self) -> Duration {
        Duration::from_secs(self.inbox_secs)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweeperSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompensationSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    pub released_marker_ttl_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentSettings {
    pub consumer_group: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSettings {
    pub restart_base_ms: u64,
    pub restart_max_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub pool_size: u32,
    pub connect_timeout_ms: u64,
    pub acquire_timeout_ms: u64,
    pub lock_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub tx_max_attempts: u32,
    /// Take no orders while the primary's commits do not wait for a synchronous
    /// standby (seed §14.3): readiness says why and intake stops until one is back.
    pub require_sync_standby: bool,
    /// A COMMIT waiting this long for a synchronous standby stops intake (it is
    /// never cancelled: its order may already be on the standby).
    pub commit_stall_ms: u64,
    /// A streaming replica for the reads that may be stale (seed §14.4): the
    /// buyer's order history. Unset: every read goes to the primary.
    #[serde(default)]
    pub replica_url: Option<SecretString>,
    /// The replica serves while its measured lag is at most this.
    pub replica_max_lag_ms: u64,
    /// The role that owns the schema, for `migrate` and the after-sale VACUUM;
    /// unset: `url` (docs/OPERATIONS.md, "Roles").
    #[serde(default)]
    pub owner_url: Option<SecretString>,
    /// CA and client certificate for every PostgreSQL URL (`sslmode` says whether
    /// and how they are used).
    #[serde(default)]
    pub tls: TlsFiles,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    pub url: SecretString,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: SecretString,
    pub key_prefix: String,
    /// CA (instead of the system's roots) and client certificate of a `rediss://` URL.
    #[serde(default)]
    pub tls: TlsFiles,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    pub db_permits: u32,
    /// Unset: leased from PostgreSQL (`store::node_lease`).
    pub node_id: Option<u16>,
    pub node_lease_ttl_ms: u64,
    pub batch_max_size: u32,
    pub bucket_pipeline: u32,
    pub order_transactions: u32,
    /// Pipeline lanes (threads); 0: one per available core (`actors::lanes`).
    pub pipeline_threads: u32,
}

/// The largest `engine.pipeline_threads`: a lane costs a thread and its share of the
/// pool, and more lanes than cores only add switching.
pub const MAX_PIPELINE_THREADS: usize = 64;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    pub format: LogFormat,
    pub level: String,
    /// How often the gauges read from PostgreSQL and RabbitMQ (outbox and
    /// compensation backlog, dead-letter depth, pool state) are refreshed.
    pub sample_interval_ms: u64,
    /// How often the sampler runs the stock invariants over the live sales
    /// (`seckill_conservation_violations`).
    pub conservation_interval_ms: u64,
    /// Activities whose order transactions are logged at INFO (`telemetry::trace`).
    pub trace_activities: Vec<i64>,
}

/// Where every value may come from, in increasing priority.
pub fn figment(config_file: Option<&Path>) -> Figment {
    let mut figment = Figment::from(Named {
        name: "config/default.toml (built in)",
        inner: Toml::string(DEFAULTS),
    });
    if let Some(path) = config_file {
        // `file_exact` makes a missing --config file an error instead of a silent no-op.
        figment = figment.merge(Toml::file_exact(path));
    }
    figment.merge(Env::prefixed(ENV_PREFIX).split("__"))
}

impl Settings {
    /// Loads and validates the settings from the standard sources.
    pub fn load(config_file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::from_figment(&figment(config_file))
    }

    /// Loads and validates settings from any figment (tests layer their own values).
    pub fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        for (old, new) in REPLACED_KEYS {
            if figment.find_value(old).is_ok() {
                return Err(ConfigError::Invalid {
                    key: (*old).to_owned(),
                    origin: origin(figment, old),
                    reason: format!("this key was replaced by `{new}`"),
                });
            }
        }
        let settings: Settings = figment
            .extract()
            .map_err(|e| from_figment_error(figment, e))?;
        settings.validate(figment)?;
        Ok(settings)
    }

    fn validate(&self, figment: &Figment) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| ConfigError::Invalid {
            key: key.to_owned(),
            origin: origin(figment, key),
            reason,
        };
        let tls_invalid = |e: TlsError| ConfigError::Invalid {
            origin: origin(figment, &e.key),
            key: e.key,
            reason: e.reason,
        };
        // Every PostgreSQL URL: libpq's sslmode read here (tokio-postgres knows only
        // three of the five), and what it asks of `database.tls` checked now.
        let postgres_url = |key: &'static str, url: &SecretString| {
            let (rest, mode) = crate::tls::split_sslmode(url.expose_secret(), key)
                .map_err(|reason| invalid(key, reason))?;
            let pg: tokio_postgres::Config = rest
                .parse()
                .map_err(|e| invalid(key, format!("not a PostgreSQL URL: {e}")))?;
            crate::tls::PgTls::new(mode, &self.database.tls, key).map_err(tls_invalid)?;
            Ok::<_, ConfigError>((pg, mode))
        };
        let (pg, mode) = postgres_url("database.url", &self.database.url)?;
        if pg.get_dbname().is_none() {
            return Err(invalid("database.url", "names no database".into()));
        }
        if pg.get_hosts().is_empty() {
            return Err(invalid("database.url", "names no host".into()));
        }
        // libpq's multi-host form: one port for all hosts, or one per host.
        let (hosts, ports) = (pg.get_hosts().len(), pg.get_ports().len());
        if ports > 1 && ports != hosts {
            return Err(invalid(
                "database.url",
                format!("names {hosts} hosts but {ports} ports (give one port, or one per host)"),
            ));
        }
        if mode == SslMode::Disable && self.database.tls.is_set() {
            return Err(invalid(
                "database.tls",
                "is set but database.url says sslmode=disable".into(),
            ));
        }
        self.database.tls.check("database").map_err(tls_invalid)?;
        for (key, url) in [
            ("database.replica_url", &self.database.replica_url),
            ("database.owner_url", &self.database.owner_url),
        ] {
            if let Some(url) = url {
                let (other, _) = postgres_url(key, url)?;
                if other.get_hosts().is_empty() || other.get_dbname().is_none() {
                    return Err(invalid(key, "must name a host and a database".into()));
                }
            }
        }
        if self.database.replica_max_lag_ms > 3_600_000 {
            return Err(invalid(
                "database.replica_max_lag_ms",
                "must be at most 3600000".into(),
            ));
        }
        if self.frontstage.sold_out_recheck_ms > 5_000 {
            return Err(invalid(
                "frontstage.sold_out_recheck_ms",
                "must be at most 5000 (units can come back; 0 turns the memory off)".into(),
            ));
        }
        if !(1..=64).contains(&self.frontstage.db_pool_size) {
            return Err(invalid(
                "frontstage.db_pool_size",
                "must be between 1 and 64".into(),
            ));
        }
        let limits = &self.frontstage.rate_limit;
        for (key, rate, burst) in [
            (
                "frontstage.rate_limit.per_user_burst",
                limits.per_user_per_s,
                limits.per_user_burst,
            ),
            (
                "frontstage.rate_limit.per_address_burst",
                limits.per_address_per_s,
                limits.per_address_burst,
            ),
        ] {
            if rate > 0 && burst == 0 {
                return Err(invalid(
                    key,
                    "must be at least 1 while its rate is on".into(),
                ));
            }
        }
        let tokens = &self.frontstage.purchase_token;
        if !(1..=3600).contains(&tokens.ttl_secs) {
            return Err(invalid(
                "frontstage.purchase_token.ttl_secs",
                "must be between 1 and 3600".into(),
            ));
        }
        if tokens.max_per_user == 0 {
            return Err(invalid(
                "frontstage.purchase_token.max_per_user",
                "must be at least 1".into(),
            ));
        }
        if let Some(secret) = &tokens.secret {
            if secret.expose_secret().len() < MIN_HS256_SECRET_BYTES {
                return Err(invalid(
                    "frontstage.purchase_token.secret",
                    "must be at least 32 bytes (the value is not shown)".into(),
                ));
            }
        }
        if let Some(secret) = &self.frontstage.auth.hs256_secret {
            if secret.expose_secret().len() < MIN_HS256_SECRET_BYTES {
                return Err(invalid(
                    "frontstage.auth.hs256_secret",
                    "must be at least 32 bytes (the value is not shown)".into(),
                ));
            }
        }
        if !(100..=600_000).contains(&self.database.commit_stall_ms) {
            return Err(invalid(
                "database.commit_stall_ms",
                "must be between 100 and 600000".into(),
            ));
        }
        if self.database.pool_size == 0 {
            return Err(invalid("database.pool_size", "must be at least 1".into()));
        }
        // Every duration, TTL and batch size is bounded: zero can lose a unit or spin
        // a loop, an enormous value can overflow a timestamp or hold work forever.
        const SECOND_MS: u64 = 1_000;
        const HOUR_MS: u64 = 3_600_000;
        const DAY_MS: u64 = 86_400_000;
        const DAY_SECS: u64 = 86_400;
        let (outbox, compensation) = (&self.outbox, &self.compensation);
        for (key, value, min, max) in [
            (
                "database.connect_timeout_ms",
                self.database.connect_timeout_ms,
                1,
                10 * 60 * SECOND_MS,
            ),
            (
                "database.acquire_timeout_ms",
                self.database.acquire_timeout_ms,
                1,
                10 * 60 * SECOND_MS,
            ),
            (
                "database.lock_timeout_ms",
                self.database.lock_timeout_ms,
                1,
                10 * 60 * SECOND_MS,
            ),
            (
                "database.statement_timeout_ms",
                self.database.statement_timeout_ms,
                1,
                HOUR_MS,
            ),
            ("amqp.retry_delay_ms", self.amqp.retry_delay_ms, 1, HOUR_MS),
            ("outbox.interval_ms", outbox.interval_ms, 1, HOUR_MS),
            (
                "outbox.busy_interval_ms",
                outbox.busy_interval_ms,
                0,
                HOUR_MS,
            ),
            ("outbox.max_lag_ms", outbox.max_lag_ms, 1, DAY_MS),
            ("outbox.lease_ms", outbox.lease_ms, 1, HOUR_MS),
            ("outbox.backoff_base_ms", outbox.backoff_base_ms, 1, HOUR_MS),
            (
                "outbox.backoff_max_ms",
                outbox.backoff_max_ms,
                outbox.backoff_base_ms,
                DAY_MS,
            ),
            (
                "retention.interval_ms",
                self.retention.interval_ms,
                1,
                HOUR_MS,
            ),
            (
                "retention.batch_size",
                u64::from(self.retention.batch_size),
                1,
                100_000,
            ),
            (
                "retention.inbox_secs",
                self.retention.inbox_secs,
                1,
                400 * DAY_SECS,
            ),
            (
                "retention.outbox_history_secs",
                self.retention.outbox_history_secs,
                1,
                400 * DAY_SECS,
            ),
            (
                "outbox.batch_size",
                u64::from(outbox.batch_size),
                1,
                100_000,
            ),
            ("sweeper.interval_ms", self.sweeper.interval_ms, 1, HOUR_MS),
            (
                "sweeper.batch_size",
                u64::from(self.sweeper.batch_size),
                1,
                100_000,
            ),
            (
                "compensation.interval_ms",
                compensation.interval_ms,
                1,
                HOUR_MS,
            ),
            ("compensation.lease_ms", compensation.lease_ms, 1, HOUR_MS),
            (
                "compensation.backoff_base_ms",
                compensation.backoff_base_ms,
                1,
                HOUR_MS,
            ),
            (
                "compensation.backoff_max_ms",
                compensation.backoff_max_ms,
                compensation.backoff_base_ms,
                DAY_MS,
            ),
            // The give-back marker must outlive every retry of a give-back.
            (
                "compensation.released_marker_ttl_secs",
                compensation.released_marker_ttl_secs,
                3_600,
                400 * DAY_SECS,
            ),
            (
                "compensation.batch_size",
                u64::from(compensation.batch_size),
                1,
                100_000,
            ),
            (
                "supervisor.restart_base_ms",
                self.supervisor.restart_base_ms,
                1,
                HOUR_MS,
            ),
            (
                "supervisor.restart_max_ms",
                self.supervisor.restart_max_ms,
                self.supervisor.restart_base_ms,
                HOUR_MS,
            ),
            (
                "telemetry.sample_interval_ms",
                self.telemetry.sample_interval_ms,
                100,
                HOUR_MS,
            ),
            (
                "telemetry.conservation_interval_ms",
                self.telemetry.conservation_interval_ms,
                1_000,
                HOUR_MS,
            ),
            (
                "frontstage.reservation_ttl_ms",
                self.frontstage.reservation_ttl_ms,
                SECOND_MS,
                DAY_MS,
            ),
            (
                "frontstage.request_ttl_secs",
                self.frontstage.request_ttl_secs,
                1,
                30 * DAY_SECS,
            ),
            (
                "frontstage.reconcile_interval_ms",
                self.frontstage.reconcile_interval_ms,
                10,
                HOUR_MS,
            ),
            ("shutdown.grace_ms", self.shutdown.grace_ms, 0, HOUR_MS),
        ] {
            if !(min..=max).contains(&value) {
                return Err(invalid(key, format!("must be between {min} and {max}")));
            }
        }
        if self.database.tx_max_attempts == 0 {
            return Err(invalid(
                "database.tx_max_attempts",
                "must be at least 1".into(),
            ));
        }
        let mut amqps = false;
        for (key, url) in [
            ("amqp.url", Some(&self.amqp.url)),
            ("frontstage.amqp_url", self.frontstage.amqp_url.as_ref()),
        ] {
            let Some(url) = url else { continue };
            let uri = url
                .expose_secret()
                .parse::<lapin::uri::AMQPUri>()
                // The parser's message quotes the URL, password included: never shown.
                .map_err(|_| {
                    invalid(
                        key,
                        "not an AMQP URL (amqp://user:password@host:port/vhost); the value is not shown, it may hold a password".into(),
                    )
                })?;
            amqps |= uri.scheme == lapin::uri::AMQPScheme::AMQPS;
        }
        if self.amqp.tls.is_set() && !amqps {
            return Err(invalid(
                "amqp.tls",
                "is set but no AMQP URL is amqps://".into(),
            ));
        }
        self.amqp.tls.check("amqp").map_err(tls_invalid)?;
        if !(100..=60_000).contains(&self.amqp.connect_timeout_ms) {
            return Err(invalid(
                "amqp.connect_timeout_ms",
                "must be between 100 and 60000".into(),
            ));
        }
        if !(1..=60).contains(&self.amqp.heartbeat_secs) {
            return Err(invalid(
                "amqp.heartbeat_secs",
                "must be between 1 and 60".into(),
            ));
        }
        if !is_name(&self.amqp.namespace) {
            return Err(invalid(
                "amqp.namespace",
                "must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'".into(),
            ));
        }
        if self.amqp.shards == 0 || self.amqp.shards > 1024 {
            return Err(invalid("amqp.shards", "must be between 1 and 1024".into()));
        }
        if let Some(shard) = self
            .amqp
            .owned_shards
            .iter()
            .find(|s| **s >= self.amqp.shards)
        {
            return Err(invalid(
                "amqp.owned_shards",
                format!(
                    "shard {shard} does not exist (amqp.shards = {})",
                    self.amqp.shards
                ),
            ));
        }
        if self.amqp.consumer_group.is_empty() || self.amqp.consumer_group.len() > 128 {
            return Err(invalid(
                "amqp.consumer_group",
                "must be 1-128 characters".into(),
            ));
        }
        let redis_url =
            redis::IntoConnectionInfo::into_connection_info(self.redis.url.expose_secret())
                .map_err(|e| invalid("redis.url", format!("not a Redis URL: {e}")))?;
        match redis_url.addr() {
            redis::ConnectionAddr::TcpTls { insecure: true, .. } => {
                return Err(invalid(
                    "redis.url",
                    "asks for #insecure (no certificate check), which this build refuses; set redis.tls.ca_file instead".into(),
                ))
            }
            redis::ConnectionAddr::TcpTls { .. } => {}
            _ if self.redis.tls.is_set() => {
                return Err(invalid(
                    "redis.tls",
                    "is set but redis.url is not rediss://".into(),
                ))
            }
            _ => {}
        }
        self.redis.tls.check("redis").map_err(tls_invalid)?;
        if !is_name(&self.redis.key_prefix) {
            return Err(invalid(
                "redis.key_prefix",
                "must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'".into(),
            ));
        }
        if !(1..=1024).contains(&self.engine.batch_max_size) {
            return Err(invalid(
                "engine.batch_max_size",
                "must be between 1 and 1024".into(),
            ));
        }
        if !(1..=16).contains(&self.engine.bucket_pipeline) {
            return Err(invalid(
                "engine.bucket_pipeline",
                "must be between 1 and 16".into(),
            ));
        }
        if !(1..=1024).contains(&self.engine.order_transactions) {
            return Err(invalid(
                "engine.order_transactions",
                "must be between 1 and 1024".into(),
            ));
        }
        if self.engine.pipeline_threads as usize > MAX_PIPELINE_THREADS {
            return Err(invalid(
                "engine.pipeline_threads",
                format!(
                    "must be between 0 (one per core) and {}",
                    MAX_PIPELINE_THREADS
                ),
            ));
        }
        if !(15_000..=3_600_000).contains(&self.engine.node_lease_ttl_ms) {
            return Err(invalid(
                "engine.node_lease_ttl_ms",
                "must be between 15000 and 3600000".into(),
            ));
        }
        if self
            .engine
            .node_id
            .is_some_and(|n| n > crate::domain::ids::MAX_NODE_ID)
        {
            return Err(invalid(
                "engine.node_id",
                format!("must be at most {}", crate::domain::ids::MAX_NODE_ID),
            ));
        }
        for (key, addr) in [
            ("http.addr", &self.http.addr),
            ("admin.addr", &self.admin.addr),
        ] {
            addr.parse::<SocketAddr>()
                .map_err(|e| invalid(key, format!("not a socket address: {e}")))?;
        }
        for (key, token) in [
            ("admin.token", &self.admin.token),
            ("admin.metrics_token", &self.admin.metrics_token),
        ] {
            // Short tokens can be guessed; the admin API can replay and retry work.
            if token
                .as_ref()
                .is_some_and(|token| token.expose_secret().len() < 16)
            {
                return Err(invalid(key, "must be at least 16 characters".into()));
            }
        }
        if self.telemetry.trace_activities.len() > crate::telemetry::trace::MAX_TRACED {
            return Err(invalid(
                "telemetry.trace_activities",
                format!("at most {} activities", crate::telemetry::trace::MAX_TRACED),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&self.telemetry.level)
            .map_err(|e| invalid("telemetry.level", format!("not a log filter: {e}")))?;
        Ok(())
    }

    /// Orders in flight (Little's law, §10.5), enough to keep every batch full: a
    /// hot bucket keeps `bucket_pipeline` transactions of up to `batch_max_size`
    /// orders running while the next batch forms, and a sale spread over many
    /// buckets can run a transaction on every pooled connection at once. With only
    /// the hot bucket's share, 64 buckets split it into batches of a few orders and
    /// sold at about 60 % of the rate (docs/benchmarks-history.md, 2026-12-02, 0774ebb).
    pub fn db_permits(&self) -> usize {
        match self.engine.db_permits {
            0 => {
                let batch = self.engine.batch_max_size as usize;
                let hot_bucket = self.engine.bucket_pipeline as usize + 1;
                batch * hot_bucket.max(self.database.pool_size as usize)
            }
            n => n as usize,
        }
    }

    /// Unacked deliveries per consumed queue.
    pub fn prefetch(&self) -> u16 {
        match self.amqp.prefetch {
            0 => u16::try_from(self.db_permits()).unwrap_or(u16::MAX),
            n => n,
        }
    }

    /// The shards this instance consumes.
    pub fn owned_shards(&self) -> Vec<u16> {
        if self.amqp.owned_shards.is_empty() {
            (0..self.amqp.shards).collect()
        } else {
            self.amqp.owned_shards.clone()
        }
    }
}

impl DatabaseSettings {
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn commit_stall(&self) -> Duration {
        Duration::from_millis(self.commit_stall_ms)
    }
}

/// Describes where the value of `key` came from, e.g. "environment variable
/// SECKILL__DATABASE__URL" or "TOML file /etc/seckill.toml".
pub fn origin(figment: &Figment, key: &str) -> String {
    match figment.find_metadata(key) {
        Some(meta) => describe(meta, key),
        None => "no source (missing)".to_owned(),
    }
}

fn describe(meta: &Metadata, key: &str) -> String {
    if meta.name.contains("environment") {
        return format!(
            "environment variable {ENV_PREFIX}{}",
            key.replace('.', "__").to_ascii_uppercase()
        );
    }
    match &meta.source {
        Some(source) => format!("{} {source}", meta.name),
        None => meta.name.to_string(),
    }
}

/// Turns figment's error (type mismatch, unknown or missing key) into one that names
/// the key and its source the same way validation errors do.
fn from_figment_error(figment: &Figment, e: figment::Error) -> ConfigError {
    let key = e.path.join(".");
    if key.is_empty() {
        return ConfigError::Load(e.to_string());
    }
    let origin = match &e.metadata {
        Some(meta) => describe(meta, &key),
        None => origin(figment, &key),
    };
    ConfigError::Invalid {
        key,
        origin,
        reason: e.kind.to_string(),
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Gives a provider a readable name in error messages.
struct Named<P> {
    name: &'static str,
    inner: P,
}

impl<P: Provider> Provider for Named<P> {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name)
    }
    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        self.inner.data()
    }
}

#[cfg(test)]
// Jail's closures must return figment's (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn defaults_load_and_validate() {
        Jail::expect_with(|_| {
            let s = Settings::load(None).expect("defaults are valid");
            assert_eq!(s.amqp.namespace, "seckill");
            // Little's law default: a full batch for every pooled connection (16),
            // more than the hot bucket's pipeline plus the batch forming (3 + 1).
            assert_eq!(s.db_permits(), 64 * 16);
            assert_eq!(usize::from(s.prefetch()), s.db_permits());
            assert_eq!(s.owned_shards(), vec![0]);
            // Fewer order transactions at once than connections (docs/benchmarks-history.md, 2026-12-02, 27acd2b).
            assert_eq!(s.engine.order_transactions, 8);
            Ok(())
        });
    }

    #[test]
    fn a_replaced_key_is_refused_with_the_name_of_its_successor() {
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__OUTBOX__RETENTION_SECS", "60");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("`outbox.retention_secs`"), "{err}");
            assert!(err.contains("retention.outbox_history_secs"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn derived_permits_fill_the_hot_bucket_or_every_connection() {
        Jail::expect_with(|jail| {
            let permits = || Settings::load(None).expect("valid settings").db_permits();
            // A small pool: the hot bucket's pipeline and forming batch set it.
            jail.set_env("SECKILL__DATABASE__POOL_SIZE", "2");
            assert_eq!(permits(), 64 * (3 + 1));
            // One order per transaction: one per connection, the seed's path.
            jail.set_env("SECKILL__ENGINE__BATCH_MAX_SIZE", "1");
            jail.set_env("SECKILL__DATABASE__POOL_SIZE", "16");
            assert_eq!(permits(), 16);
            // Set explicitly, it is taken as it is.
            jail.set_env("SECKILL__ENGINE__DB_PERMITS", "300");
            assert_eq!(permits(), 300);
            Ok(())
        });
    }

    #[test]
    fn env_overrides_and_names_key_and_source_on_bad_type() {
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__DATABASE__POOL_SIZE", "many");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("pool_size"), "{err}");
            assert!(err.contains("SECKILL__DATABASE__POOL_SIZE"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn zero_order_transactions_is_rejected_naming_the_key() {
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__ENGINE__ORDER_TRANSACTIONS", "0");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("engine.order_transactions"), "{err}");
            Ok(())
        });
    }

    /// Every duration and TTL is bounded: zero and enormous values are refused,
    /// naming the key (issue 36 pt 7).
    #[test]
    fn durations_and_ttls_out_of_bounds_are_rejected_naming_the_key() {
        for (var, value, key) in [
            (
                "SECKILL__FRONTSTAGE__REQUEST_TTL_SECS",
                "0",
                "frontstage.request_ttl_secs",
            ),
            (
                "SECKILL__FRONTSTAGE__RESERVATION_TTL_MS",
                "0",
                "frontstage.reservation_ttl_ms",
            ),
            (
                "SECKILL__FRONTSTAGE__RESERVATION_TTL_MS",
                "18446744073709551615",
                "frontstage.reservation_ttl_ms",
            ),
            (
                "SECKILL__COMPENSATION__RELEASED_MARKER_TTL_SECS",
                "0",
                "compensation.released_marker_ttl_secs",
            ),
            (
                "SECKILL__RETENTION__INBOX_SECS",
                "0",
                "retention.inbox_secs",
            ),
            (
                "SECKILL__OUTBOX__BACKOFF_MAX_MS",
                "1",
                "outbox.backoff_max_ms",
            ),
            (
                "SECKILL__SHUTDOWN__GRACE_MS",
                "99999999999",
                "shutdown.grace_ms",
            ),
            (
                "SECKILL__TELEMETRY__SAMPLE_INTERVAL_MS",
                "1",
                "telemetry.sample_interval_ms",
            ),
        ] {
            Jail::expect_with(|jail| {
                jail.set_env(var, value);
                let err = Settings::load(None).expect_err(var).to_string();
                assert!(err.contains(key), "{var}={value}: {err}");
                assert!(err.contains("must be between"), "{var}={value}: {err}");
                Ok(())
            });
        }
    }

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
    fn file_error_names_the_file() {
        Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "[database]\nurl = \"mysql://nope\"\n")?;
            let err = Settings::load(Some(Path::new("bad.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("database.url"), "{err}");
            assert!(err.contains("bad.toml"), "{err}");
            assert!(!err.contains("nope"), "a URL may hold a secret: {err}");
            Ok(())
        });
    }

    #[test]
    fn unknown_key_is_rejected() {
        Jail::expect_with(|jail| {
            jail.set_env("SECKILL__DATABASE__POOLSIZE", "3");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("poolsize"), "{err}");
            assert!(err.contains("SECKILL__DATABASE__POOLSIZE"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn missing_config_file_is_an_error() {
        Jail::expect_with(|_| {
            assert!(Settings::load(Some(Path::new("absent.toml"))).is_err());
            Ok(())
        });
    }
}
