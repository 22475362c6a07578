//! The plain Redis commands the engine sends (the scripts are in `scripts.rs`): each
//! one timed under its command name, keys from `keys.rs`, pending members read by
//! one parser.

use super::Conn;
use ::redis::RedisError;

use super::keys::{PendingMember, SkuKeys};
use super::timed;

/// Up to `limit` pending reservations whose expiry (ms since the epoch) is at most
/// `due_ms`, each with its raw member (to remove it exactly as stored) and its
/// expiry. Members not in the pending format are skipped; the second value counts
/// every member read.
pub async fn due_pending(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    due_ms: i64,
    limit: usize,
) -> Result<(Vec<(PendingMember, String, i64)>, usize), RedisError> {
    let mut due = ::redis::cmd("ZRANGEBYSCORE");
    due.arg(keys.pending())
        .arg("-inf")
        .arg(due_ms)
        .arg("WITHSCORES")
        .arg("LIMIT")
        .arg(0)
        .arg(limit);
    let members: Vec<(String, f64)> = timed("zrangebyscore", due.query_async(conn)).await?;
    let read = members.len();
    let parsed = members
        .into_iter()
        .filter_map(|(m, score)| PendingMember::parse(&m).map(|p| (p, m, score as i64)))
        .collect();
    Ok((parsed, read))
}

/// Every pending reservation of a SKU.
pub async fn all_pending(
    conn: &mut impl Conn,
    keys: &SkuKeys,
) -> Result<Vec<PendingMember>, RedisError> {
    let mut all = ::redis::cmd("ZRANGE");
    all.arg(keys.pending()).arg(0).arg(-1);
    let members: Vec<String> = timed("zrange", all.query_async(conn)).await?;
    Ok(members
        .iter()
        .filter_map(|m| PendingMember::parse(m))
        .collect())
}

/// Every member of a SKU's pending set as stored, parsed or not (a rebuild checks
/// that the set did not change under it).
pub async fn pending_members(
    conn: &mut impl Conn,
    keys: &SkuKeys,
) -> Result<Vec<String>, RedisError> {
    let mut all = ::redis::cmd("ZRANGE");
    all.arg(keys.pending()).arg(0).arg(-1);
    timed("zrange", all.query_async(conn)).await
}

/// Forgets one pending member (PostgreSQL has its reservation).
pub async fn forget_pending(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    member: &str,
) -> Result<(), RedisError> {
    let mut forget = ::redis::cmd("ZREM");
    forget.arg(keys.pending()).arg(member);
    timed("zrem", forget.query_async(conn)).await
}

/// The units left in one bucket; a missing key is 0.
pub async fn bucket_stock(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    bucket: i16,
) -> Result<i64, RedisError> {
    let mut get = ::redis::cmd("GET");
    get.arg(keys.stock(bucket));
    let stock: Option<i64> = timed("get", get.query_async(conn)).await?;
    Ok(stock.unwrap_or(0))
}

/// Forgets the stored answer of a reservation request (its reservation was given
/// back, so a retry must reserve anew).
pub async fn forget_request(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    user_id: i64,
    request_id: &uuid::Uuid,
) -> Result<(), RedisError> {
    let mut forget = ::redis::cmd("DEL");
    forget.arg(keys.request(user_id, request_id));
    timed("del", forget.query_async(conn)).await
}

/// The answer given before to this user's request, if any (the reserve script's
/// replay, read on its own).
pub async fn request_answer(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    user_id: i64,
    request_id: &uuid::Uuid,
) -> Result<Option<super::scripts::ReservationAnswer>, RedisError> {
    let mut get = ::redis::cmd("GET");
    get.arg(keys.request(user_id, request_id));
    let stored: Option<String> = timed("get", get.query_async(conn)).await?;
    stored
        .map(|s| {
            super::scripts::ReservationAnswer::parse(&s).ok_or_else(super::scripts::corrupt_answer)
        })
        .transpose()
}

/// Marks a reservation's message as queued for `ttl_ms`, so the status query can
/// tell a queued reservation from an unknown one.
pub async fn mark_queued(
    conn: &mut impl Conn,
    prefix: &str,
    reservation_id: &uuid::Uuid,
    (activity_id, sku_id, user_id): (i64, i64, i64),
    ttl_ms: i64,
) -> Result<(), RedisError> {
    let mut mark = ::redis::cmd("SET");
    mark.arg(SkuKeys::queued(prefix, reservation_id))
        .arg(SkuKeys::queued_value(activity_id, sku_id, user_id))
        .arg("PX")
        .arg(ttl_ms);
    timed("set", mark.query_async(conn)).await
}

/// The user whose reservation's message was marked as queued; `None` if it was not.
pub async fn queued_owner(
    conn: &mut impl Conn,
    prefix: &str,
    reservation_id: &uuid::Uuid,
) -> Result<Option<i64>, RedisError> {
    let mut lookup = ::redis::cmd("GET");
    lookup.arg(SkuKeys::queued(prefix, reservation_id));
    let queued: Option<String> = timed("get", lookup.query_async(conn)).await?;
    Ok(queued.as_deref().and_then(SkuKeys::queued_owner))
}

/// Counts one more purchase token for `user_id` in this sale and returns the count;
/// the count lives until the sale's end (`expire_at_ms`).
pub async fn count_purchase_token(
    conn: &mut impl Conn,
    keys: &SkuKeys,
    user_id: i64,
    expire_at_ms: i64,
) -> Result<i64, RedisError> {
    let key = keys.purchase_tokens(user_id);
    let mut pipe = ::redis::pipe();
    pipe.atomic()
        .cmd("INCR")
        .arg(&key)
        .cmd("PEXPIREAT")
        .arg(&key)
        .arg(expire_at_ms)
        .ignore();
    let (count,): (i64,) = timed("incr", pipe.query_async(conn)).await?;
    Ok(count)
}
