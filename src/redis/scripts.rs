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
-- KEYS[4] bucket count (written with the stock: gone means the sale's keys are lost),
-- KEYS[5 .. 5+n-1] stock of buckets 0 .. n-1
-- ARGV[1] user id, ARGV[2] reservation id, ARGV[3] preferred bucket,
-- ARGV[4] expiry (ms, the pending score), ARGV[5] request key ttl (s),
-- ARGV[6] the answer without its bucket ('reservation|order_id|order_no'),
-- ARGV[7] request id, ARGV[8] when the sale's keys expire (ms)
local prior = redis.call('GET', KEYS[3])
if prior then return {'REPLAY', prior} end
if redis.call('EXISTS', KEYS[4]) == 0 then return {'LOST', ''} end
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder then return {'DUPLICATE', holder} end
local n = #KEYS - 4
local first = tonumber(ARGV[3])
for i = 0, n - 1 do
  local b = (first + i) % n
  local key = KEYS[5 + b]
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

/// Rewrites a SKU's keys from PostgreSQL's figures (`rebuild`), atomically, only if
/// the pending set is still the one the figures were computed against (a
/// reservation made or settled in between would be counted wrong): each bucket's
/// stock, the bucket count, the buyers' marks PostgreSQL knows (a mark Redis still
/// holds is kept), the generation, and every key's expiry.
static REBUILD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] users hash, KEYS[2] pending set, KEYS[3] bucket count, KEYS[4] generation,
-- KEYS[5 .. 5+n-1] stock of buckets 0 .. n-1
-- ARGV[1] when the keys expire (ms), ARGV[2] generation, ARGV[3] n,
-- ARGV[4 .. 3+n] each bucket's stock, ARGV[4+n] m, then m pending members as read,
-- then pairs (user, reservation)
local n = tonumber(ARGV[3])
local m = tonumber(ARGV[4 + n])
if redis.call('ZCARD', KEYS[2]) ~= m then return {0} end
for i = 1, m do
  if not redis.call('ZSCORE', KEYS[2], ARGV[4 + n + i]) then return {0} end
end
local out = {1, 0}
for b = 0, n - 1 do
  local key = KEYS[5 + b]
  table.insert(out, tonumber(redis.call('GET', key) or '-1'))
  redis.call('SET', key, ARGV[4 + b])
  redis.call('PEXPIREAT', key, ARGV[1])
end
redis.call('SET', KEYS[3], n)
redis.call('PEXPIREAT', KEYS[3], ARGV[1])
local first = 5 + n + m
for i = first, #ARGV, 2 do
  out[2] = out[2] + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIREAT', KEYS[1], ARGV[1]) end
redis.call('SET', KEYS[4], ARGV[2])
redis.call('PEXPIREAT', KEYS[4], ARGV[1])
return out
",
    )
});

/// What a rebuild of one SKU's keys found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuilt {
    /// Each bucket's stock before (`None`: the key was gone), and the buyers'
    /// marks added.
    Done {
        before: Vec<Option<i64>>,
        marks_added: i64,
    },
    /// The pending set changed since it was read: read again.
    Changed,
}

/// One SKU's figures for `rebuild`.
#[derive(Debug, Clone)]
pub struct RebuildCall<'a> {
    /// Each bucket's stock to set, in bucket order.
    pub stock: &'a [i64],
    /// The pending set's members as read (raw), which the figures count.
    pub pending: &'a [String],
    /// (user, reservation) of every buyer PostgreSQL knows holds a unit.
    pub holders: &'a [(i64, Uuid)],
    pub sale_end_ms: i64,
    pub generation_ms: i64,
}

/// Runs the rebuild script for one SKU.
pub async fn rebuild(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    call: &RebuildCall<'_>,
) -> Result<Rebuilt, ::redis::RedisError> {
    let buckets = call.stock.len() as i16;
    let mut invocation = REBUILD.key(keys.users());
    invocation
        .key(keys.pending())
        .key(keys.bucket_count())
        .key(keys.generation());
    for bucket in 0..buckets {
        invocation.key(keys.stock(bucket));
    }
    invocation
        .arg(super::keys::sale_keys_expire_at_ms(call.sale_end_ms))
        .arg(call.generation_ms)
        .arg(buckets);
    for stock in call.stock {
        invocation.arg(*stock);
    }
    invocation.arg(call.pending.len());
    for member in call.pending {
        invocation.arg(member);
    }
    for (user, reservation) in call.holders {
        invocation.arg(*user).arg(reservation.to_string());
    }
    let out: Vec<i64> = super::timed("rebuild", invocation.invoke_async(conn)).await?;
    Ok(match out.as_slice() {
        [1, marks_added, before @ ..] => Rebuilt::Done {
            before: before.iter().map(|b| (*b >= 0).then_some(*b)).collect(),
            marks_added: *marks_added,
        },
        _ => Rebuilt::Changed,
    })
}

/// The answer a reservation gets, and the one its retries replay: kept by the
/// reserve script under the request's key as `reservation|order_id|order_no|bucket`.
/// `answer_prefix` builds the first three fields (the script appends the bucket it
/// took from), `parse` reads all four back: the one builder and the one parser of
/// that format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationAnswer {
    pub reservation_id: Uuid,
    pub order_id: i64,
    pub order_no: String,
    pub bucket: i16,
}

impl ReservationAnswer {
    /// What the script is given to keep, before it knows the bucket.
    fn answer_prefix(reservation_id: &Uuid, order_id: i64, order_no: &str) -> String {
        format!("{reservation_id}|{order_id}|{order_no}")
    }

    /// The stored answer; `None` when it is not one the script wrote.
    pub fn parse(stored: &str) -> Option<Self> {
        let mut parts = stored.split('|');
        let answer = Self {
            reservation_id: parts.next()?.parse().ok()?,
            order_id: parts.next()?.parse().ok()?,
            order_no: parts.next()?.to_owned(),
            bucket: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(answer)
    }
}

/// An answer under a request key that is not the script's format: Redis was written
/// by something else, and the request cannot be answered from it.
pub(crate) fn corrupt_answer() -> ::redis::RedisError {
    ::redis::RedisError::from((
        ::redis::ErrorKind::UnexpectedReturnType,
        "corrupt reservation answer",
    ))
}

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// A unit was taken.
    Ok(ReservationAnswer),
    /// The request was answered before; the same answer.
    Replay(ReservationAnswer),
    /// The user holds reservation `holder` for this SKU already.
    Duplicate {
        holder: String,
    },
    SoldOut,
    /// The sale's keys are gone from Redis (a restart without persistence, a
    /// fail-over to a replica that missed them, a flush): nothing can be sold
    /// until they are rebuilt from PostgreSQL (`rebuild`). Never read as sold out.
    Lost,
}

/// One request for a unit, as the reserve script takes it.
#[derive(Debug, Clone)]
pub struct ReserveCall<'a> {
    pub user_id: i64,
    pub request_id: Uuid,
    pub reservation_id: Uuid,
    /// The order the reservation becomes, minted before the script runs.
    pub order_id: i64,
    pub order_no: &'a str,
    /// When an unseen reservation is due for reconciliation (its pending score).
    pub expires_at_ms: i64,
    /// How long the request's answer is kept for its retries.
    pub request_ttl_secs: u64,
    /// The sale's end: the sale's keys expire after it.
    pub sale_end_ms: i64,
}

/// Runs the reserve script for one request over `buckets` buckets.
pub async fn reserve(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    buckets: i16,
    call: &ReserveCall<'_>,
) -> Result<Reserved, ::redis::RedisError> {
    let preferred = user_bucket(call.user_id, buckets);
    // EVALSHA built as one command, not a `ScriptInvocation`: that one allocates each
    // key and argument twice, and this call names every bucket's key (64 in the
    // demo sale); here they are written into the command's one buffer.
    let buckets_len = usize::try_from(buckets).unwrap_or(0);
    let mut eval = ::redis::Cmd::with_capacity(
        14 + buckets_len,
        512 + buckets_len * (keys.stock(0).len() + 4),
    );
    eval.arg("EVALSHA")
        .arg(RESERVE.get_hash())
        .arg(4 + i64::from(buckets.max(0)))
        .arg(keys.users())
        .arg(keys.pending())
        .arg(keys.request(call.user_id, &call.request_id))
        .arg(keys.bucket_count());
    let mut stock = String::new();
    for bucket in 0..buckets {
        keys.stock_into(bucket, &mut stock);
        eval.arg(stock.as_str());
    }
    eval.arg(call.user_id)
        .arg(call.reservation_id.to_string())
        .arg(preferred)
        .arg(call.expires_at_ms)
        .arg(call.request_ttl_secs)
        .arg(ReservationAnswer::answer_prefix(
            &call.reservation_id,
            call.order_id,
            call.order_no,
        ))
        .arg(call.request_id.to_string())
        .arg(super::keys::sale_keys_expire_at_ms(call.sale_end_ms));
    let (kind, value): (String, String) =
        super::timed("reserve", evalsha(conn, &RESERVE, &eval)).await?;
    let answer = || ReservationAnswer::parse(&value).ok_or_else(corrupt_answer);
    Ok(match kind.as_str() {
        "OK" => Reserved::Ok(answer()?),
        "REPLAY" => Reserved::Replay(answer()?),
        "DUPLICATE" => Reserved::Duplicate { holder: value },
        "LOST" => Reserved::Lost,
        _ => Reserved::SoldOut,
    })
}

/// Runs `eval`, an EVALSHA of `script`; when the server does not have the script
/// (a restarted or new server, `SCRIPT FLUSH`), loads it and runs `eval` again, as
/// `ScriptInvocation` does.
async fn evalsha<T: ::redis::FromRedisValue>(
    conn: &mut impl Conn,
    script: &Script,
    eval: &::redis::Cmd,
) -> Result<T, ::redis::RedisError> {
    match eval.query_async(conn).await {
        Err(e) if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            eval.query_async(conn).await
        }
        answer => answer,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_round_trips_through_the_script_format() {
        let reservation_id = Uuid::now_v7();
        let stored = format!(
            "{}|{}",
            ReservationAnswer::answer_prefix(&reservation_id, 42, "S42"),
            7
        );
        assert_eq!(
            ReservationAnswer::parse(&stored),
            Some(ReservationAnswer {
                reservation_id,
                order_id: 42,
                order_no: "S42".into(),
                bucket: 7,
            })
        );
        for corrupt in ["", "x|1|S|0", "{reservation_id}|1|S", "a|b|c|d|e"] {
            assert_eq!(ReservationAnswer::parse(corrupt), None, "{corrupt}");
        }
        let extra = format!("{stored}|9");
        assert_eq!(ReservationAnswer::parse(&extra), None);
    }
}
