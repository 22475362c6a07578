//! Lua scripts run atomically by Redis. `redis::Script` sends EVALSHA and reloads the
//! script on NOSCRIPT, so a Redis restart costs one extra round trip, not an error.

use std::sync::LazyLock;

use super::Conn;
use ::redis::Script;
use uuid::Uuid;

use super::keys::{PendingMember, SkuKeys};

/// Gives one reserved unit back to its bucket, once per reservation: the first call
/// sets the reservation's `released` marker, adds the unit back, frees the user's
/// one-per-SKU mark if it still points at this reservation, and forgets the pending
/// entry; any later call changes nothing and returns 0.
static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] stock of the bucket, KEYS[2] released marker, KEYS[3] users hash,
-- KEYS[4] pending set
-- ARGV[1] reservation id, ARGV[2] user id, ARGV[3] marker ttl (seconds),
-- ARGV[4] pending member
redis.call('ZREM', KEYS[4], ARGV[4])
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then
  -- A stock key that is gone expired with its sale: nothing to give back to.
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('INCR', KEYS[1])
  end
  if redis.call('HGET', KEYS[3], ARGV[2]) == ARGV[1] then
    redis.call('HDEL', KEYS[3], ARGV[2])
  end
  return 1
end
return 0
",
    )
});

/// Reserves one unit for a user, atomically: replays the answer of a request seen
/// before; refuses a user who already holds a reservation for the SKU; takes a unit
/// from the user's own bucket first, then from any other bucket with stock (so one
/// empty bucket never reads as sold out while others have stock); records the
/// reservation (user mark, pending entry with its expiry, the request's answer).
static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] users hash, KEYS[2] pending set, KEYS[3] request key,
-- KEYS[4 .. 4+n-1] stock of buckets 0 .. n-1
-- ARGV[1] user id, ARGV[2] reservation id, ARGV[3] preferred bucket,
-- ARGV[4] expiry (ms, the pending score), ARGV[5] request key ttl (s),
-- ARGV[6] the answer without its bucket ('reservation|order_id|order_no'),
-- ARGV[7] request id, ARGV[8] when the sale's keys expire (ms)
local prior = redis.call('GET', KEYS[3])
if prior then return {'REPLAY', prior} end
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder then return {'DUPLICATE', holder} end
local n = #KEYS - 3
local first = tonumber(ARGV[3])
for i = 0, n - 1 do
  local b = (first + i) % n
  local key = KEYS[4 + b]
  if tonumber(redis.call('GET', key) or '0') > 0 then
    redis.call('DECR', key)
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2] .. ':' .. ARGV[1] .. ':' .. b .. ':' .. ARGV[7])
    redis.call('PEXPIREAT', KEYS[1], ARGV[8])
    redis.call('PEXPIREAT', KEYS[2], ARGV[8])
    local answer = ARGV[6] .. '|' .. b
    redis.call('SET', KEYS[3], answer, 'EX', ARGV[5])
    return {'OK', answer}
  end
end
return {'SOLD_OUT', ''}
",
    )
});

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// A unit was taken; `answer` is `reservation|order_id|order_no|bucket`.
    Ok {
        answer: String,
    },
    /// The request was answered before; the same answer.
    Replay {
        answer: String,
    },
    /// The user holds reservation `holder` for this SKU already.
    Duplicate {
        holder: String,
    },
    SoldOut,
}

/// Runs the reserve script for one request.
#[allow(clippy::too_many_arguments)]
pub async fn reserve(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    buckets: i16,
    user_id: i64,
    request_id: Uuid,
    reservation_id: Uuid,
    expires_at_ms: i64,
    request_ttl_secs: u64,
    answer: &str,
    sale_end_ms: i64,
) -> Result<Reserved, ::redis::RedisError> {
    let preferred = user_bucket(user_id, buckets);
    let mut invocation = RESERVE.key(keys.users());
    invocation
        .key(keys.pending())
        .key(keys.request(user_id, &request_id));
    for bucket in 0..buckets {
        invocation.key(keys.stock(bucket));
    }
    invocation
        .arg(user_id)
        .arg(reservation_id.to_string())
        .arg(preferred)
        .arg(expires_at_ms)
        .arg(request_ttl_secs)
        .arg(answer)
        .arg(request_id.to_string())
        .arg(super::keys::sale_keys_expire_at_ms(sale_end_ms));
    let (kind, value): (String, String) =
        super::timed("reserve", invocation.invoke_async(conn)).await?;
    Ok(match kind.as_str() {
        "OK" => Reserved::Ok { answer: value },
        "REPLAY" => Reserved::Replay { answer: value },
        "DUPLICATE" => Reserved::Duplicate { holder: value },
        _ => Reserved::SoldOut,
    })
}

/// The bucket a user tries first: a stable hash, so a user's retries and the buckets'
/// load stay spread evenly.
pub fn user_bucket(user_id: i64, buckets: i16) -> i16 {
    let mixed = (user_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) % (buckets.max(1) as u64)) as i16
}

/// Gives the unit of `reservation` back. Returns whether this call did (false: an
/// earlier call did). Only for a reservation PostgreSQL records as never becoming
/// an order (docs/DESIGN.md, "Redis give-backs").
pub async fn give_back(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    reservation: &PendingMember,
    marker_ttl_secs: u64,
) -> Result<bool, ::redis::RedisError> {
    let mut invocation = GIVE_BACK.key(keys.stock(reservation.bucket));
    invocation
        .key(keys.released(&reservation.reservation_id))
        .key(keys.users())
        .key(keys.pending())
        .arg(reservation.reservation_id.to_string())
        .arg(reservation.user_id)
        .arg(marker_ttl_secs)
        .arg(reservation.encode());
    let changed: i64 = super::timed("give_back", invocation.invoke_async(conn)).await?;
    Ok(changed == 1)
}
