//! The typed settings tree: `config/default.toml` (compiled in, so the binary runs from
//! any directory), then an optional file named by `--config`, then environment
//! variables `SECKILL__SECTION__KEY`. Everything is validated once at start; an error
//! names the key and where its value came from. Credentials live in `SecretString`
//! and are never printed.
//!
//! This module loads the tree and holds the table of numeric bounds (`BOUNDS`); each
//! section's file holds its types and the rules that are not bounds, `check.rs` the
//! error every rule reports through.

mod amqp;
mod background;
mod check;
mod database;
mod engine;
mod frontstage;
mod http;
mod redis;
mod server;
mod telemetry;
mod transport;

use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize;

pub use self::amqp::AmqpSettings;
pub use self::background::{
    CompensationSettings, OutboxSettings, PaymentSettings, RetentionSettings, ShutdownSettings,
    SupervisorSettings, SweeperSettings,
};
pub use self::check::{origin, ConfigError, ENV_PREFIX};
use self::check::{Bound, Check};
pub use self::database::{DatabaseSettings, PgUrl};
pub use self::engine::{EngineSettings, MAX_PIPELINE_THREADS};
pub use self::frontstage::{
    AuthMode, AuthSettings, Cidr, ConnectionLimits, FrontstageSettings, PurchaseTokenSettings,
    RateLimitSettings, MIN_HS256_SECRET_BYTES,
};
pub use self::http::{AdminSettings, HttpSettings};
pub use self::redis::RedisSettings;
pub use self::server::{Role, ServerSettings};
pub use self::telemetry::{LogFormat, TelemetrySettings, MAX_TRACED_ACTIVITIES};
pub use self::transport::Transport;

/// The defaults, compiled into the binary.
const DEFAULTS: &str = include_str!("../../config/default.toml");
/// Keys of earlier releases and the keys that replaced them: a configuration still
/// carrying one is refused with the new name rather than an "unknown field".
const REPLACED_KEYS: &[(&str, &str)] = &[
    ("outbox.retention_secs", "retention.outbox_history_secs"),
    ("outbox.retention_batch", "retention.batch_size"),
];

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
    pub server: ServerSettings,
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
    /// What each link (PostgreSQL, RabbitMQ, Redis) runs over, TLS or plaintext,
    /// and the setting that decides it (`validate`, the start-up log).
    pub fn transports(&self) -> Vec<Transport> {
        transport::transports(&self.database, &self.amqp, &self.redis)
    }

    /// Loads and validates the settings from the standard sources.
    pub fn load(config_file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::from_figment(&figment(config_file))
    }

    /// Loads and validates settings from any figment (tests layer their own values).
    pub fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        let ctx = Check::new(figment);
        for (old, new) in REPLACED_KEYS {
            if figment.find_value(old).is_ok() {
                return Err(ctx.invalid(old, format!("this key was replaced by `{new}`")));
            }
        }
        let mut settings: Settings = figment.extract().map_err(|e| ctx.extraction(e))?;
        settings.validate(&ctx)?;
        Ok(settings)
    }

    /// Every bound, then each section's rules; the database keeps its URLs as read.
    fn validate(&mut self, ctx: &Check) -> Result<(), ConfigError> {
        ctx.bounds(BOUNDS, self)?;
        self.database.validate(ctx)?;
        self.amqp.validate(
            ctx,
            (
                self.frontstage.amqp_url.as_ref(),
                &self.frontstage.amqp_urls,
            ),
        )?;
        self.redis.validate(ctx)?;
        self.http.validate(ctx)?;
        self.admin.validate(ctx)?;
        self.frontstage.validate(ctx, &self.http)?;
        self.server.validate(ctx)?;
        self.telemetry.validate(ctx)
    }

    /// Whether the front stage can run (`serve`): the keys it needs beyond what
    /// `load` checks, which the defaults leave unset (`FrontstageSettings::ready`).
    pub fn frontstage_ready(&self) -> Result<(), ConfigError> {
        self.frontstage.ready()
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

const SECOND_MS: u64 = 1_000;
const MINUTE_MS: u64 = 60 * SECOND_MS;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;
const DAY_SECS: u64 = 86_400;
/// The most rows one statement of a background service touches.
const MAX_BATCH: u64 = 100_000;

type B = Bound<Settings>;

/// Every numeric bound, in one place. Every duration, TTL and batch size is bounded:
/// zero can lose a unit or spin a loop, an enormous value can overflow a timestamp
/// or hold work forever. Applied first, in this order, by `Settings::validate`.
#[rustfmt::skip]
const BOUNDS: &[B] = &[
    B::new("database.connect_timeout_ms", |s| s.database.connect_timeout_ms, 1, 10 * MINUTE_MS),
    B::new("database.acquire_timeout_ms", |s| s.database.acquire_timeout_ms, 1, 10 * MINUTE_MS),
    B::new("database.lock_timeout_ms", |s| s.database.lock_timeout_ms, 1, 10 * MINUTE_MS),
    B::new("database.statement_timeout_ms", |s| s.database.statement_timeout_ms, 1, HOUR_MS),
    B::new("database.commit_stall_ms", |s| s.database.commit_stall_ms, 100, 10 * MINUTE_MS),
    B::new("database.replica_max_lag_ms", |s| s.database.replica_max_lag_ms, 0, HOUR_MS),
    B::at_least("database.pool_size", |s| s.database.pool_size.into(), 1),
    B::at_least("database.tx_max_attempts", |s| s.database.tx_max_attempts.into(), 1),
    B::new("amqp.retry_delay_ms", |s| s.amqp.retry_delay_ms, 1, HOUR_MS),
    B::new("amqp.connect_timeout_ms", |s| s.amqp.connect_timeout_ms, 100, MINUTE_MS),
    B::new("amqp.heartbeat_secs", |s| s.amqp.heartbeat_secs.into(), 1, 60),
    B::new("amqp.shards", |s| s.amqp.shards.into(), 1, 1024),
    B::new("engine.batch_max_size", |s| s.engine.batch_max_size.into(), 1, 1024),
    B::new("engine.bucket_pipeline", |s| s.engine.bucket_pipeline.into(), 1, 16),
    B::new("engine.order_transactions", |s| s.engine.order_transactions.into(), 1, 1024),
    B::new("engine.pipeline_threads", |s| s.engine.pipeline_threads.into(), 0, MAX_PIPELINE_THREADS as u64)
        .why("0: one per core"),
    B::new("engine.node_lease_ttl_ms", |s| s.engine.node_lease_ttl_ms, 15 * SECOND_MS, HOUR_MS),
    B::optional("engine.node_id", |s| s.engine.node_id.map(u64::from), 0, crate::domain::ids::MAX_NODE_ID as u64),
    B::new("frontstage.reservation_ttl_ms", |s| s.frontstage.reservation_ttl_ms, SECOND_MS, DAY_MS),
    B::new("frontstage.request_ttl_secs", |s| s.frontstage.request_ttl_secs, 1, 30 * DAY_SECS),
    B::new("frontstage.reconcile_interval_ms", |s| s.frontstage.reconcile_interval_ms, 10, HOUR_MS),
    B::new("frontstage.db_pool_size", |s| s.frontstage.db_pool_size.into(), 1, 64),
    B::new("frontstage.sold_out_recheck_ms", |s| s.frontstage.sold_out_recheck_ms, 0, 5 * SECOND_MS)
        .why("units can come back; 0 turns the memory off"),
    B::new("frontstage.limits.header_read_ms", |s| s.frontstage.limits.header_read_ms, 100, 60 * SECOND_MS),
    B::new("frontstage.limits.body_read_ms", |s| s.frontstage.limits.body_read_ms, 100, 60 * SECOND_MS),
    B::new("frontstage.limits.keep_alive_ms", |s| s.frontstage.limits.keep_alive_ms, 0, 300 * SECOND_MS),
    B::new("frontstage.rate_limit.ipv6_prefix_len", |s| u64::from(s.frontstage.rate_limit.ipv6_prefix_len), 32, 128),
    B::new("frontstage.limits.max_connections", |s| s.frontstage.limits.max_connections as u64, 0, 1_000_000),
    B::new("frontstage.auth.leeway_secs", |s| s.frontstage.auth.leeway_secs, 0, 300),
    B::new("frontstage.auth.max_lifetime_secs", |s| s.frontstage.auth.max_lifetime_secs, 60, 30 * DAY_SECS),
    B::new("frontstage.purchase_token.ttl_secs", |s| s.frontstage.purchase_token.ttl_secs, 1, 3600),
    B::at_least("frontstage.purchase_token.max_per_user", |s| s.frontstage.purchase_token.max_per_user.into(), 1),
    B::new("outbox.interval_ms", |s| s.outbox.interval_ms, 1, HOUR_MS),
    B::new("outbox.busy_interval_ms", |s| s.outbox.busy_interval_ms, 0, HOUR_MS),
    B::new("outbox.max_lag_ms", |s| s.outbox.max_lag_ms, 1, DAY_MS),
    B::new("outbox.lease_ms", |s| s.outbox.lease_ms, 1, HOUR_MS),
    B::new("outbox.backoff_base_ms", |s| s.outbox.backoff_base_ms, 1, HOUR_MS),
    B::new("outbox.backoff_max_ms", |s| s.outbox.backoff_max_ms, 1, DAY_MS)
        .not_below("outbox.backoff_base_ms", |s| s.outbox.backoff_base_ms),
    B::new("outbox.batch_size", |s| s.outbox.batch_size.into(), 1, MAX_BATCH),
    B::new("retention.interval_ms", |s| s.retention.interval_ms, 1, HOUR_MS),
    B::new("retention.batch_size", |s| s.retention.batch_size.into(), 1, MAX_BATCH),
    B::new("retention.inbox_secs", |s| s.retention.inbox_secs, 1, 400 * DAY_SECS),
    B::new("retention.outbox_history_secs", |s| s.retention.outbox_history_secs, 1, 400 * DAY_SECS),
    B::new("sweeper.interval_ms", |s| s.sweeper.interval_ms, 1, HOUR_MS),
    B::new("sweeper.batch_size", |s| s.sweeper.batch_size.into(), 1, MAX_BATCH),
    B::new("compensation.interval_ms", |s| s.compensation.interval_ms, 1, HOUR_MS),
    B::new("compensation.lease_ms", |s| s.compensation.lease_ms, 1, HOUR_MS),
    B::new("compensation.backoff_base_ms", |s| s.compensation.backoff_base_ms, 1, HOUR_MS),
    B::new("compensation.backoff_max_ms", |s| s.compensation.backoff_max_ms, 1, DAY_MS)
        .not_below("compensation.backoff_base_ms", |s| s.compensation.backoff_base_ms),
    B::new("compensation.released_marker_ttl_secs", |s| s.compensation.released_marker_ttl_secs, 3_600, 400 * DAY_SECS)
        .why("it must outlive every retry of a give-back"),
    B::new("compensation.batch_size", |s| s.compensation.batch_size.into(), 1, MAX_BATCH),
    B::new("supervisor.restart_base_ms", |s| s.supervisor.restart_base_ms, 1, HOUR_MS),
    B::new("supervisor.restart_max_ms", |s| s.supervisor.restart_max_ms, 1, HOUR_MS)
        .not_below("supervisor.restart_base_ms", |s| s.supervisor.restart_base_ms),
    B::new("telemetry.sample_interval_ms", |s| s.telemetry.sample_interval_ms, 100, HOUR_MS),
    B::new("telemetry.conservation_interval_ms", |s| s.telemetry.conservation_interval_ms, SECOND_MS, HOUR_MS),
    B::new("shutdown.grace_ms", |s| s.shutdown.grace_ms, 0, HOUR_MS),
];

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
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.
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

    /// A secret read as a number, a boolean or a table is named, never shown.
    #[test]
    fn a_secret_of_any_type_is_never_echoed() {
        for (var, value) in [
            ("SECKILL__ADMIN__TOKEN", "4839201758392017"),
            ("SECKILL__ADMIN__METRICS_TOKEN", "true"),
            ("SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET", "-3.25e10"),
            ("SECKILL__DATABASE__URL", "[7733991]"),
        ] {
            Jail::expect_with(|jail| {
                jail.set_env(var, value);
                let err = Settings::load(None).unwrap_err().to_string();
                assert!(err.contains(var), "{err}");
                assert!(err.contains("not shown"), "{err}");
                let digits: String = value.chars().filter(char::is_ascii_digit).collect();
                assert!(
                    !err.contains(&digits[..4.min(digits.len())]) || digits.is_empty(),
                    "{err}"
                );
                assert!(!err.contains(value), "{err}");
                Ok(())
            });
        }
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

    #[test]
    fn each_link_says_tls_or_plaintext_from_its_own_setting() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "SECKILL__DATABASE__URL",
                "postgres://u:secret@db/x?sslmode=require",
            );
            jail.set_env("SECKILL__AMQP__URL", "amqps://u:secret@mq/%2f");
            jail.set_env("SECKILL__REDIS__URL", "redis://cache:6379");
            let t = crate::config::Settings::load(None).unwrap().transports();
            assert!(t[0].summary.starts_with("TLS, the server not verified"));
            assert!(t[1].summary.starts_with("TLS (amqps://)"));
            assert!(t[2].summary.starts_with("plaintext (redis://"));
            assert!(t.iter().all(|t| !t.summary.contains("secret")));
            Ok(())
        });
    }
}
