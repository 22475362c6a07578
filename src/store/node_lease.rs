//! Leases on node ids (`node_lease`): an engine without `engine.node_id` takes the
//! lowest id in 0..=1000 that no live instance holds; one with an explicit id takes
//! that one unless a live instance holds it. The database's clock decides: a lease
//! is live while `renewed_at` is within `takeover_ms` (the TTL plus a margin) of
//! now, and a renewal is refused once another holder has the row.

use tokio_postgres::Client;
use uuid::Uuid;

/// The highest id handed out automatically; 1001..=1023 stay for explicit ids and
/// tools (the bench and the fault harness mint with ids of their own up there).
pub const MAX_LEASED_NODE_ID: i16 = 1000;

/// Who holds a lease: a random id per process, a name for people, what the
/// process runs (`server.roles`, for people), and whether it consumes order queues
/// (only those take a rank in the shard split).
#[derive(Debug, Clone)]
pub struct Holder {
    pub id: Uuid,
    pub name: String,
    pub roles: String,
    pub consumes: bool,
}

/// A node id held by another live instance.
#[derive(Debug, Clone)]
pub struct HeldBy {
    pub holder_name: String,
    pub renewed_ms_ago: i64,
}

/// Leases the lowest free node id; `None` while every id is live (or another
/// instance won each race: call again).
pub async fn acquire_any(
    client: &Client,
    holder: &Holder,
    takeover_ms: i64,
) -> Result<Option<u16>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            ACQUIRE_ANY,
            &[
                &holder.id,
                &holder.name,
                &takeover_ms,
                &MAX_LEASED_NODE_ID,
                &holder.roles,
                &holder.consumes,
            ],
        )
        .await?;
    Ok(row.map(|r| r.get::<_, i16>(0) as u16))
}

/// Leases `node_id` unless another live instance holds it.
pub async fn acquire(
    client: &Client,
    node_id: u16,
    holder: &Holder,
    takeover_ms: i64,
) -> Result<Result<(), HeldBy>, tokio_postgres::Error> {
    let id = node_id as i16;
    let taken = client
        .query_opt(
            ACQUIRE,
            &[
                &id,
                &holder.id,
                &holder.name,
                &takeover_ms,
                &holder.roles,
                &holder.consumes,
            ],
        )
        .await?;
    if taken.is_some() {
        return Ok(Ok(()));
    }
    let row = client.query_opt(HOLDER_OF, &[&id]).await?;
    Ok(Err(match row {
        Some(r) => HeldBy {
            holder_name: r.get(0),
            renewed_ms_ago: r.get(1),
        },
        // Released between the two statements: a race to report, not to win here.
        None => HeldBy {
            holder_name: "an instance that just released it".into(),
            renewed_ms_ago: 0,
        },
    }))
}

/// Renews the lease; false when the row is no longer this holder's.
pub async fn renew(
    client: &Client,
    node_id: u16,
    holder: &Holder,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .execute(RENEW, &[&(node_id as i16), &holder.id])
        .await?
        == 1)
}

/// The node ids of every instance that consumes order queues and whose lease was
/// renewed within `window_ms`, ascending: the ranks that decide shard ownership.
pub async fn live_node_ids(
    client: &Client,
    window_ms: i64,
) -> Result<Vec<u16>, tokio_postgres::Error> {
    Ok(client
        .query(LIVE_NODE_IDS, &[&window_ms])
        .await?
        .iter()
        .map(|r| r.get::<_, i16>(0) as u16)
        .collect())
}

/// K and the rank of `node_id` among `live` (K = 0 when it is not among them).
pub fn rank_of(live: &[u16], node_id: u16) -> (u32, u32) {
    match live.iter().position(|n| *n == node_id) {
        Some(rank) => (live.len() as u32, rank as u32),
        None => (0, 0),
    }
}

/// Gives the id back at a clean stop, so a restart need not wait for the TTL.
pub async fn release(
    client: &Client,
    node_id: u16,
    holder: &Holder,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(RELEASE, &[&(node_id as i16), &holder.id])
        .await
        .map(|_| ())
}

/// The lowest id with no live lease: inserted, or taken over from an expired holder.
/// Two instances racing for one id both try it; the loser's conflict update finds the
/// winner's fresh row and returns nothing.
const ACQUIRE_ANY: &str = "
WITH free AS (
    SELECT n::int2 AS node_id
    FROM generate_series(0, $4::int2) AS n
    WHERE NOT EXISTS (
        SELECT 1 FROM node_lease AS l
        WHERE l.node_id = n
          AND l.renewed_at > clock_timestamp() - make_interval(secs => $3::int8 / 1000.0)
    )
    ORDER BY n
    LIMIT 1
)
INSERT INTO node_lease (node_id, holder, holder_name, renewed_at, roles, consumes)
SELECT node_id, $1, $2, clock_timestamp(), $5, $6 FROM free
ON CONFLICT (node_id) DO UPDATE
SET holder = EXCLUDED.holder, holder_name = EXCLUDED.holder_name,
    renewed_at = EXCLUDED.renewed_at, roles = EXCLUDED.roles,
    consumes = EXCLUDED.consumes
WHERE node_lease.renewed_at <= clock_timestamp() - make_interval(secs => $3::int8 / 1000.0)
RETURNING node_id";

/// One id: free, expired, or already this holder's.
const ACQUIRE: &str = "
INSERT INTO node_lease (node_id, holder, holder_name, renewed_at, roles, consumes)
VALUES ($1, $2, $3, clock_timestamp(), $5, $6)
ON CONFLICT (node_id) DO UPDATE
SET holder = EXCLUDED.holder, holder_name = EXCLUDED.holder_name,
    renewed_at = EXCLUDED.renewed_at, roles = EXCLUDED.roles,
    consumes = EXCLUDED.consumes
WHERE node_lease.holder = EXCLUDED.holder
   OR node_lease.renewed_at <= clock_timestamp() - make_interval(secs => $4::int8 / 1000.0)
RETURNING node_id";

const HOLDER_OF: &str = "
SELECT holder_name,
       (extract(epoch FROM clock_timestamp() - renewed_at) * 1000)::int8
FROM node_lease WHERE node_id = $1";

const RENEW: &str = "
UPDATE node_lease SET renewed_at = clock_timestamp()
WHERE node_id = $1 AND holder = $2";

const LIVE_NODE_IDS: &str = "
SELECT node_id FROM node_lease
WHERE consumes
  AND renewed_at > clock_timestamp() - make_interval(secs => $1::int8 / 1000.0)
ORDER BY node_id";

const RELEASE: &str = "DELETE FROM node_lease WHERE node_id = $1 AND holder = $2";
