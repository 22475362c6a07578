//! The shard layout recorded in PostgreSQL (`shard_layout`): the version of
//! `domain::shard::shard_for` and the shard count S. Messages already queued were
//! routed with the recorded layout, so an engine computing shards differently would
//! read some buckets from two queues: it refuses to start instead, and the layout
//! changes only through `reshard`, once every order queue is empty.

use tokio_postgres::Client;

/// A layout: function version and shard count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    pub shard_function: i32,
    pub shards: u16,
}

impl std::fmt::Display for ShardLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} shards, shard function v{}",
            self.shards, self.shard_function
        )
    }
}

/// Records `ours` if no layout is recorded yet; returns the recorded one (which the
/// caller compares with its own).
pub async fn record_or_read(
    client: &Client,
    ours: ShardLayout,
) -> Result<ShardLayout, tokio_postgres::Error> {
    let row = client
        .query_one(
            RECORD_OR_READ,
            &[&ours.shard_function, &i32::from(ours.shards)],
        )
        .await?;
    Ok(layout_of(&row))
}

/// The recorded layout, if any.
pub async fn read(client: &Client) -> Result<Option<ShardLayout>, tokio_postgres::Error> {
    Ok(client.query_opt(READ, &[]).await?.as_ref().map(layout_of))
}

/// Replaces the recorded layout (the caller has checked that the queues are empty).
pub async fn replace(client: &Client, layout: ShardLayout) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            REPLACE,
            &[&layout.shard_function, &i32::from(layout.shards)],
        )
        .await
        .map(|_| ())
}

fn layout_of(row: &tokio_postgres::Row) -> ShardLayout {
    let shards: i32 = row.get(1);
    ShardLayout {
        shard_function: row.get(0),
        // The column's CHECK keeps it within 1..=1024.
        shards: u16::try_from(shards).unwrap_or(u16::MAX),
    }
}

const RECORD_OR_READ: &str = "
WITH recorded AS (
    INSERT INTO shard_layout (shard_function, shards) VALUES ($1, $2)
    ON CONFLICT (singleton) DO NOTHING
    RETURNING shard_function, shards
)
SELECT shard_function, shards FROM recorded
UNION ALL
SELECT shard_function, shards FROM shard_layout WHERE NOT EXISTS (SELECT 1 FROM recorded)";

const READ: &str = "SELECT shard_function, shards FROM shard_layout";

const REPLACE: &str = "
INSERT INTO shard_layout (shard_function, shards) VALUES ($1, $2)
ON CONFLICT (singleton) DO UPDATE
SET shard_function = EXCLUDED.shard_function, shards = EXCLUDED.shards,
    recorded_at = now()";
