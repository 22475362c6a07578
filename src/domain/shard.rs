//! Which `order.create` shard queue carries a bucket's messages.
//!
//! `shard = fnv1a_64(activity_id.to_le_bytes() ++ sku_id.to_le_bytes() ++
//! inventory_bucket.to_le_bytes()) mod shards`, with the standard 64-bit FNV-1a
//! offset basis 0xcbf29ce484222325 and prime 0x100000001b3. It depends on nothing
//! but these bytes, so any producer in any language can compute it, and all messages
//! of one inventory bucket land on one queue (and so on one engine instance).

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

pub fn shard_for(activity_id: i64, sku_id: i64, bucket: i16, shards: u16) -> u16 {
    let mut hash = FNV_OFFSET;
    let bytes = activity_id
        .to_le_bytes()
        .into_iter()
        .chain(sku_id.to_le_bytes())
        .chain(bucket.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    (hash % u64::from(shards.max(1))) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_known_values() {
        // Pinned so that a change of the function (which would strand messages in
        // the wrong queues during a rolling upgrade) fails loudly.
        // The values were computed independently (Python, struct.pack('<qqh')).
        assert_eq!(shard_for(1, 1, 0, 1), 0);
        assert_eq!(shard_for(1, 1, 0, 1024), 13);
        assert_eq!(shard_for(7, 42, 3, 16), 3);
        assert_eq!(shard_for(123_456_789, 987_654_321, 63, 1000), 887);
        let spread: std::collections::HashSet<u16> =
            (0..64).map(|b| shard_for(7, 42, b, 8)).collect();
        assert_eq!(spread.len(), 8, "64 buckets should reach all 8 shards");
    }
}
