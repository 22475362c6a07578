//! Lua scripts run atomically by Redis. `redis::Script` sends EVALSHA and reloads the
//! script on NOSCRIPT, so a Redis restart costs one extra round trip, not an error.

use std::sync::LazyLock;

use ::redis::aio::MultiplexedConnection;
use ::redis::Script;
use uuid::Uuid;

use super::keys::SkuKeys;

/// Gives one reserved unit back to its bucket, once per reservation: the first call
/// sets the reservation's `released` marker, adds the unit back and frees the user's
/// one-per-SKU mark if it still points at this reservation; any later call changes
/// nothing and returns 0.
static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] stock of the bucket, KEYS[2] released marker, KEYS[3] users hash
-- ARGV[1] reservation id, ARGV[2] user id, ARGV[3] marker ttl (seconds)
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then
  redis.call('INCR', KEYS[1])
  if redis.call('HGET', KEYS[3], ARGV[2]) == ARGV[1] then
    redis.call('HDEL', KEYS[3], ARGV[2])
  end
  return 1
end
return 0
",
    )
});

/// Returns whether this call gave the unit back (false: an earlier call did).
pub async fn give_back(
    conn: &mut MultiplexedConnection,
    keys: &SkuKeys,
    bucket: i16,
    reservation_id: Uuid,
    user_id: i64,
    marker_ttl_secs: u64,
) -> Result<bool, ::redis::RedisError> {
    let changed: i64 = GIVE_BACK
        .key(keys.stock(bucket))
        .key(keys.released(&reservation_id))
        .key(keys.users())
        .arg(reservation_id.to_string())
        .arg(user_id)
        .arg(marker_ttl_secs)
        .invoke_async(conn)
        .await?;
    Ok(changed == 1)
}
