//! Redis key layout. Every key of one SKU shares the hash tag `{activity:sku}`, so the
//! front stage's Lua script can touch all of them in one call on a Redis Cluster too.
//!
//! `{prefix}:{activity:sku}:stock:{bucket}`         remaining units of one bucket
//! `{prefix}:{activity:sku}:buckets`                number of buckets
//! `{prefix}:{activity:sku}:users`                  hash user_id → reservation_id (one per user)
//! `{prefix}:{activity:sku}:released:{reservation}` the reservation's unit was given back
//! `{prefix}:{activity:sku}:pending`                zset "reservation:user:bucket:request" by expiry (ms)
//! `{prefix}:{activity:sku}:request:{user}:{request_id}`  the answer to a user's request
//! `{prefix}:{activity:sku}:ptokens:{user}`          purchase tokens the user fetched for the sale
//! `{prefix}:{activity:sku}:generation`             when the keys were last rebuilt from PostgreSQL (ms)
//! `{prefix}:queued:{reservation}`                  "activity:sku:user" once its message is queued
//!
//! A pending member is `reservation:user:bucket:request`: built by
//! `PendingMember::encode` here and by the reservation script (scripts.rs, the same
//! format in Lua), read only by `PendingMember::parse`. The request id lets the
//! reconciler record a reservation no message brought (store::reconcile); members
//! written before it was added (`reservation:user:bucket`) still parse, without it.

/// How long after its sale's end every key of the sale lives: past the
/// reconciler's reach (SKUs that ended less than a day ago) plus the longest
/// reservation TTL (a day).
pub const SALE_KEYS_GRACE_MS: i64 = 2 * 86_400_000;

/// When the keys of a sale ending at `sale_end_ms` expire (ms since the epoch).
pub fn sale_keys_expire_at_ms(sale_end_ms: i64) -> i64 {
    sale_end_ms.saturating_add(SALE_KEYS_GRACE_MS)
}

#[derive(Debug, Clone)]
pub struct SkuKeys {
    base: String,
}

impl SkuKeys {
    pub fn new(prefix: &str, activity_id: i64, sku_id: i64) -> Self {
        Self {
            base: format!("{prefix}:{{{activity_id}:{sku_id}}}"),
        }
    }

    pub fn stock(&self, bucket: i16) -> String {
        let mut key = String::with_capacity(self.base.len() + 12);
        self.stock_into(bucket, &mut key);
        key
    }

    /// `stock(bucket)` written into `key` (cleared first): the reserve script names
    /// every bucket's key on each call, and one buffer reused for all of them costs
    /// no allocation per key.
    pub fn stock_into(&self, bucket: i16, key: &mut String) {
        key.clear();
        key.push_str(&self.base);
        key.push_str(":stock:");
        key.push_str(itoa::Buffer::new().format(bucket));
    }

    pub fn bucket_count(&self) -> String {
        format!("{}:buckets", self.base)
    }

    pub fn users(&self) -> String {
        format!("{}:users", self.base)
    }

    pub fn pending(&self) -> String {
        format!("{}:pending", self.base)
    }

    /// A request's answer is the user's own: the same request id from another user
    /// is another request, and never replays this one's answer.
    pub fn request(&self, user_id: i64, request_id: &uuid::Uuid) -> String {
        format!("{}:request:{user_id}:{request_id}", self.base)
    }

    /// How many purchase tokens a user fetched for this SKU's sale.
    pub fn purchase_tokens(&self, user_id: i64) -> String {
        format!("{}:ptokens:{user_id}", self.base)
    }

    /// The mark that a reservation's message was queued (outside the SKU's hash tag:
    /// the status query knows only the reservation id).
    pub fn queued(prefix: &str, reservation_id: &uuid::Uuid) -> String {
        format!("{prefix}:queued:{reservation_id}")
    }

    /// The value of the queued mark: `activity:sku:user`.
    pub fn queued_value(activity_id: i64, sku_id: i64, user_id: i64) -> String {
        format!("{activity_id}:{sku_id}:{user_id}")
    }

    /// The user of a queued mark's value; `None` for a value without one.
    pub fn queued_owner(value: &str) -> Option<i64> {
        let mut parts = value.split(':');
        let (_activity, _sku, user) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        user.parse().ok()
    }

    /// Set by a rebuild from PostgreSQL (`rebuild`) to when it ran.
    pub fn generation(&self) -> String {
        format!("{}:generation", self.base)
    }

    pub fn released(&self, reservation_id: &uuid::Uuid) -> String {
        format!("{}:released:{reservation_id}", self.base)
    }
}

/// One entry of a SKU's pending set: a reservation Redis made whose message
/// PostgreSQL has not confirmed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingMember {
    pub reservation_id: uuid::Uuid,
    pub user_id: i64,
    pub bucket: i16,
    /// `None` in a member written before request ids were part of it.
    pub request_id: Option<uuid::Uuid>,
}

impl PendingMember {
    pub fn encode(&self) -> String {
        match self.request_id {
            Some(request) => format!(
                "{}:{}:{}:{request}",
                self.reservation_id, self.user_id, self.bucket
            ),
            None => format!("{}:{}:{}", self.reservation_id, self.user_id, self.bucket),
        }
    }

    /// None for a member not in this format (left alone by every reader).
    pub fn parse(member: &str) -> Option<Self> {
        let mut parts = member.split(':');
        let mut parsed = Self {
            reservation_id: parts.next()?.parse().ok()?,
            user_id: parts.next()?.parse().ok()?,
            bucket: parts.next()?.parse().ok()?,
            request_id: None,
        };
        if let Some(request) = parts.next() {
            parsed.request_id = Some(request.parse().ok()?);
        }
        parts.next().is_none().then_some(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::PendingMember;

    #[test]
    fn a_pending_member_reads_back_what_was_written() {
        let m = PendingMember {
            reservation_id: uuid::Uuid::from_u128(7),
            user_id: 42,
            bucket: 3,
            request_id: Some(uuid::Uuid::from_u128(9)),
        };
        assert_eq!(PendingMember::parse(&m.encode()), Some(m));
        let legacy = PendingMember {
            request_id: None,
            ..m
        };
        assert_eq!(PendingMember::parse(&legacy.encode()), Some(legacy));
        assert_eq!(PendingMember::parse("x:1:2"), None);
        assert_eq!(
            PendingMember::parse(&format!("{}:1", m.reservation_id)),
            None
        );
        assert_eq!(
            PendingMember::parse(&format!("{}:1:2:3", m.reservation_id)),
            None
        );
        assert_eq!(PendingMember::parse(&format!("{}:x", m.encode())), None);
    }

    #[test]
    fn keys_share_the_sku_hash_tag() {
        let k = super::SkuKeys::new("seckill", 7, 42);
        assert_eq!(k.stock(3), "seckill:{7:42}:stock:3");
        assert_eq!(k.bucket_count(), "seckill:{7:42}:buckets");
        // The reused buffer holds exactly the key `stock` builds, whatever it held.
        let mut reused = String::from("something longer than a stock key");
        for bucket in [0, 9, 10, 255, i16::MAX] {
            k.stock_into(bucket, &mut reused);
            assert_eq!(reused, format!("seckill:{{7:42}}:stock:{bucket}"));
        }
    }
}
