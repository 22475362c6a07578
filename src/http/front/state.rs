//! What the front stage's handlers share (`FrontStage`), and how it is built from
//! the settings: its links, its SKU cache, its limits and the engine's id generator.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use super::links::{Links, Replica};
use super::rebuilds::Rebuilds;
use super::sku_cache::{Loader, SkuCache, SkuUnavailable};
use crate::config::{FrontstageSettings, Settings};
use crate::domain::ids::IdGenerator;
use crate::http::auth::Authenticator;
use crate::http::limits::Limits;
use crate::http::HttpError;
use crate::mq::topology::Names;
use crate::status::Readiness;
use crate::store::{reads, Pool};

/// What the handlers share.
pub(super) struct FrontStage {
    pub(super) pool: Pool,
    /// Reconnects by itself after a Redis restart or a dropped connection, and
    /// follows the master after a Sentinel fail-over.
    pub(super) redis: crate::redis::MasterLink,
    pub(super) links: Links,
    pub(super) key_prefix: String,
    pub(super) names: Names,
    pub(super) shards: u16,
    pub(super) ids: Arc<IdGenerator>,
    pub(super) settings: FrontstageSettings,
    pub(super) marker_ttl_secs: u64,
    pub(super) skus: Arc<SkuCache>,
    /// Rebuilds of sales whose Redis keys are gone.
    pub(super) rebuilds: Arc<Rebuilds>,
    pub(super) auth: Authenticator,
    pub(super) limits: Limits,
    /// `frontstage.purchase_token.secret` when tokens are required.
    pub(super) purchase_secret: Option<secrecy::SecretString>,
    /// `amqp.order_signing_secret`: when set, each order message is signed.
    pub(super) signing_secret: Option<secrecy::SecretString>,
    pub(super) replica: Option<Replica>,
    pub(super) replica_max_lag_ms: i64,
}

/// Attempts of one SKU read whose pool checkout timed out: every request for a SKU
/// not yet cached waits for this one read, so a checkout that loses to a busy
/// moment (a connection being opened on a loaded host) is tried again rather than
/// turning all of them into 503s.
const SKU_READ_ATTEMPTS: u32 = 3;

/// Reads a SKU through the front stage's own pool.
fn sku_loader(pool: Pool) -> Loader {
    Arc::new(move |(activity_id, sku_id)| {
        let pool = pool.clone();
        async move {
            let mut attempt = 1;
            let conn = loop {
                match pool.get().await {
                    Ok(conn) => break conn,
                    Err(_) if attempt < SKU_READ_ATTEMPTS => attempt += 1,
                    Err(_) => return Err(SkuUnavailable::Busy),
                }
            };
            reads::load_sku(&conn.client, activity_id, sku_id)
                .await
                .map_err(|_| SkuUnavailable::Down)
        }
        .boxed()
    })
}

impl FrontStage {
    pub(super) async fn connect(
        settings: &Settings,
        pool: Pool,
        ids: Arc<IdGenerator>,
        readiness: Arc<Readiness>,
    ) -> Result<Self, HttpError> {
        // The keys only the front stage needs (a JWT key, the purchase-token
        // secret), which the defaults leave unset.
        settings.frontstage_ready()?;
        let auth = Authenticator::new(&settings.frontstage.auth)?;
        let tokens = &settings.frontstage.purchase_token;
        let purchase_secret = tokens.secret.clone().filter(|_| tokens.required);
        let replica = crate::store::build_replica_pool(&settings.database)?.map(Replica::new);
        // Its own broker user when one is configured: write on the order exchange
        // only; on a cluster, each node's URL, tried in order.
        let front = &settings.frontstage;
        let (amqp_key, amqp_urls) = match (&front.amqp_urls[..], &front.amqp_url) {
            ([], None) => settings.amqp.addresses(),
            ([], Some(url)) => ("frontstage.amqp_url", vec![url.clone()]),
            (urls, _) => ("frontstage.amqp_urls", urls.to_vec()),
        };
        let links = Links::open(
            &settings.redis,
            settings.amqp.clone(),
            (amqp_key, amqp_urls),
            readiness,
        )
        .await?;
        // One connection opened now, so the first buyers do not wait for it; a
        // database that does not answer yet is the readiness monitor's to report.
        drop(pool.get().await);
        Ok(Self {
            skus: SkuCache::new(
                sku_loader(pool.clone()),
                Duration::from_millis(settings.frontstage.sold_out_recheck_ms),
            ),
            rebuilds: Rebuilds::new(
                pool.clone(),
                links.redis.clone(),
                settings.redis.key_prefix.clone(),
            ),
            pool,
            redis: links.redis.clone(),
            links,
            key_prefix: settings.redis.key_prefix.clone(),
            names: Names::new(&settings.amqp.namespace),
            shards: settings.amqp.shards,
            ids,
            settings: settings.frontstage.clone(),
            marker_ttl_secs: settings.compensation.released_marker_ttl_secs,
            auth,
            limits: Limits::new(
                &settings.frontstage.rate_limit,
                &settings.frontstage.auth.trusted_proxies,
            ),
            purchase_secret,
            signing_secret: settings.amqp.order_signing_secret.clone(),
            replica,
            replica_max_lag_ms: i64::try_from(settings.database.replica_max_lag_ms)
                .unwrap_or(i64::MAX),
        })
    }
}
