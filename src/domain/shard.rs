//! Which `order.create` shard queue carries a bucket's messages (version 2).
//!
//! ```text
//! base  = fnv1a_64(activity_id.to_le_bytes() ++ sku_id.to_le_bytes())
//! shard = (base mod S + bucket) mod S
//! ```
//!
//! with the standard 64-bit FNV-1a offset basis 0xcbf29ce484222325 and prime
//! 0x100000001b3, S = `amqp.shards`. The SKU's hash picks where its buckets start and
//! the buckets follow each other round the shards, so the B buckets of one SKU are
//! spread over S shards within one of even (⌊B/S⌋ or ⌈B/S⌉ each) for any ids: a hot
//! SKU uses every shard, and so every instance. Version 1 hashed the bucket too,
//! which left whole SKUs on one shard for some shard counts. It depends on nothing
//! but these numbers, so any producer in any language can compute it, and all
//! messages of one inventory bucket land on one queue (one engine instance).
//!
//! The version and S are recorded in PostgreSQL (`store::topology`): an engine that
//! computes shards differently from the recorded layout refuses to start.

/// The version of `shard_for`, recorded beside the shard count.
pub const SHARD_FUNCTION_VERSION: i32 = 2;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The SKU's starting point: FNV-1a of the little-endian activity and SKU ids.
pub fn sku_hash(activity_id: i64, sku_id: i64) -> u64 {
    let mut hash = FNV_OFFSET;
    for byte in activity_id
        .to_le_bytes()
        .into_iter()
        .chain(sku_id.to_le_bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

pub fn shard_for(activity_id: i64, sku_id: i64, bucket: i16, shards: u16) -> u16 {
    let shards = u64::from(shards.max(1));
    // Buckets are 0.. (the schema checks it); a negative one cannot reach here from
    // a valid message, and is folded rather than wrapped.
    let bucket = u64::from(bucket.unsigned_abs());
    ((sku_hash(activity_id, sku_id) % shards + bucket % shards) % shards) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stable_known_values() {
        // Pinned so that a change of the function (which would strand messages in
        // the wrong queues during a rolling upgrade) fails loudly. The hashes were
        // computed independently (Python: FNV-1a over struct.pack('<qq', a, s)).
        assert_eq!(sku_hash(1, 1), 0x581c_d0fa_58d9_9645);
        assert_eq!(sku_hash(7, 42), 0x75ad_a776_0b72_9448);
        assert_eq!(shard_for(1, 1, 0, 1), 0);
        // 0x75ad…9448 mod 16 = 8, so bucket 3 is on shard 11; 0x581c…9645 mod
        // 1024 = 581, so bucket 5 is on 586, and bucket 450 wraps round to 7.
        assert_eq!(shard_for(7, 42, 3, 16), 11);
        assert_eq!(shard_for(1, 1, 5, 1024), 586);
        assert_eq!(shard_for(1, 1, 450, 1024), 7);
    }

    #[test]
    fn the_counts_that_version_one_left_on_one_shard_are_spread() {
        // Version 1 put all 64 buckets of one SKU on one shard for S = 3, 5, 15, 29.
        for shards in [3u16, 5, 6, 9, 10, 12, 15, 29, 30] {
            let mut per = vec![0u32; usize::from(shards)];
            for b in 0..64 {
                per[usize::from(shard_for(7, 42, b, shards))] += 1;
            }
            let (min, max) = (per.iter().min().unwrap(), per.iter().max().unwrap());
            assert!(max - min <= 1, "S = {shards}: {per:?}");
        }
    }

    proptest! {
        /// For every shard count 1..=64 and 1..=256 buckets, the buckets of one SKU
        /// are spread within one of even whenever there are at least as many buckets
        /// as shards (and on distinct shards when there are fewer).
        #[test]
        fn one_sku_s_buckets_spread_within_one_of_even(
            activity in any::<i64>(),
            sku in any::<i64>(),
            shards in 1u16..=64,
            buckets in 1i16..=256,
        ) {
            let mut per = vec![0u32; usize::from(shards)];
            for b in 0..buckets {
                let s = shard_for(activity, sku, b, shards);
                prop_assert!(s < shards);
                per[usize::from(s)] += 1;
            }
            let (min, max) = (*per.iter().min().unwrap(), *per.iter().max().unwrap());
            if buckets as u16 >= shards {
                prop_assert!(max - min <= 1, "{per:?}");
            } else {
                prop_assert!(max <= 1, "{per:?}");
            }
        }
    }
}
