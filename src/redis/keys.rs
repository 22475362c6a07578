//! Redis key layout. Every key of one SKU shares the hash tag `{activity:sku}`, so the
//! front stage's Lua script can touch all of them in one call on a Redis Cluster too.
//!
//! `{prefix}:{activity:sku}:stock:{bucket}`         remaining units of one bucket
//! `{prefix}:{activity:sku}:buckets`                number of buckets
//! `{prefix}:{activity:sku}:users`                  hash user_id → reservation_id (one per user)
//! `{prefix}:{activity:sku}:released:{reservation}` the reservation's unit was given back
//! `{prefix}:{activity:sku}:pending`                zset "reservation:user:bucket" by expiry (ms)
//! `{prefix}:{activity:sku}:request:{request_id}`   the answer to a reservation request

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
        format!("{}:stock:{bucket}", self.base)
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

    pub fn request(&self, request_id: &uuid::Uuid) -> String {
        format!("{}:request:{request_id}", self.base)
    }

    /// Member of the pending set for one reservation.
    pub fn pending_member(reservation_id: &uuid::Uuid, user_id: i64, bucket: i16) -> String {
        format!("{reservation_id}:{user_id}:{bucket}")
    }

    pub fn released(&self, reservation_id: &uuid::Uuid) -> String {
        format!("{}:released:{reservation_id}", self.base)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_share_the_sku_hash_tag() {
        let k = super::SkuKeys::new("seckill", 7, 42);
        assert_eq!(k.stock(3), "seckill:{7:42}:stock:3");
        assert_eq!(k.bucket_count(), "seckill:{7:42}:buckets");
    }
}
