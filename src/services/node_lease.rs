//! The node id lease keeper: renews this instance's lease on its node id every 5 s
//! and moves the id generator's mint fence to the renewal's start plus the TTL less
//! 5 s. A renewal that fails (database unreachable) leaves the fence where it was,
//! so minting stops on its own before anyone else may take the id; one that finds
//! the row taken by another instance stops minting at once and says so at ERROR: an
//! operator must restart this instance, which then leases a fresh id. Each renewal
//! also reads the live leases: the rank of this node id among them decides which
//! shards this instance owns (`status::Shards`).

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::LocalBoxFuture;

use super::runner::{Outcome, Service, ServiceError};
use crate::domain::ids::IdGenerator;
use crate::status::Readiness;
use crate::store::node_lease::{self, Holder};
use crate::store::Pool;

/// How often the lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How long before the lease could expire minting stops, and how long after it did
/// another instance may take the id.
pub const MARGIN: Duration = Duration::from_secs(5);
/// An instance counts towards shard ownership while its lease was renewed this
/// recently (three renewals): a crashed instance stops owning shards after this,
/// long before its id may be taken.
pub const LIVE_WINDOW: Duration = Duration::from_secs(15);

pub struct NodeLeaseKeeper {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    ids: Arc<IdGenerator>,
    holder: Holder,
    ttl: Duration,
    readiness: Arc<Readiness>,
}

impl NodeLeaseKeeper {
    pub fn new(
        pool: Pool,
        ids: Arc<IdGenerator>,
        holder: Holder,
        ttl: Duration,
        readiness: Arc<Readiness>,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                ids,
                holder,
                ttl,
                readiness,
            }),
        }
    }
}

/// Where the fence goes after a renewal that started at `started`.
pub fn fence_after(started: Instant, ttl: Duration) -> Instant {
    started + ttl.saturating_sub(MARGIN)
}

impl Service for NodeLeaseKeeper {
    const NAME: &'static str = "node_lease";

    fn interval(&self) -> Duration {
        RENEW_EVERY
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            // Measured before the statement is sent: the database's renewal is
            // later, so the fence errs on the early side.
            let started = Instant::now();
            let node = inner.ids.node_id();
            let conn = inner.pool.get().await?;
            if node_lease::renew(&conn.client, node, &inner.holder).await? {
                let was_stopped = !inner.ids.fence().allows();
                inner
                    .ids
                    .fence()
                    .allow_until(fence_after(started, inner.ttl));
                if was_stopped {
                    tracing::info!(node_id = node, "node id lease renewed; minting again");
                }
                // The live instances decide which shards are this one's.
                let window = LIVE_WINDOW.min(inner.ttl);
                let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
                let live = node_lease::live_node_ids(&conn.client, window_ms).await?;
                let (peers, rank) = node_lease::rank_of(&live, node);
                let shards = inner.readiness.shards();
                if shards.peers() != (peers, rank) {
                    tracing::info!(
                        node_id = node,
                        instances = peers,
                        rank,
                        "instances changed; shards are shared anew"
                    );
                    shards.set_peers(peers, rank);
                }
                return Ok(Outcome::default());
            }
            inner.ids.fence().stop();
            tracing::error!(
                node_id = node,
                "node id lease lost to another instance; this instance mints no more ids and takes no more work: restart it to lease a new id"
            );
            Ok(Outcome::default().count("lost", 1))
        })
    }
}
