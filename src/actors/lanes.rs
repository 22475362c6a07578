//! The pipeline lanes: the threads the order pipeline runs on, so that one engine uses
//! more than one core (`engine.pipeline_threads`). Each lane is an arbiter (a thread
//! with its own event loop) holding its own reservation and bucket registries. Every
//! bucket belongs to exactly one lane, `lane_of` (the shard function of
//! `domain::shard` with S = the number of lanes): its bucket actor and the reservation
//! actors of its messages live on that lane only, so one bucket's transactions are
//! still formed, ordered and fed the hot row by one actor (docs/DESIGN.md, "Actors").
//! The intakes are spread over the same arbiters, and the pool opens its connections
//! on them in turn, so decoding, settling and the PostgreSQL protocol work are spread
//! too. With one thread there is one lane, on the caller's (System) arbiter, and no
//! thread of its own: exactly the single-threaded engine.
//!
//! A lane is never restarted on its own: its arbiters stop when the `Lanes` value is
//! dropped (the engine has stopped, or a test dropped it to simulate a crash). Work
//! never lives only in a lane: what a stopped lane held is unacked, and redelivered.

use std::sync::Arc;

use actix::prelude::*;
use uuid::Uuid;

use super::bucket::{BucketActor, BucketKey, BucketShared};
use super::registry::{Registry, RegistryGauges};
use super::reservation::ReservationActor;
use crate::config::MAX_PIPELINE_THREADS as MAX_THREADS;
use crate::domain::shard::shard_for;

/// The arbiters and runtimes of the lanes, before the pipeline is on them.
pub struct Lanes {
    /// One per lane; empty when the single lane is the caller's arbiter.
    arbiters: Vec<Arbiter>,
    /// The lanes' tokio runtimes (the caller's for a single lane).
    runtimes: Vec<tokio::runtime::Handle>,
}

/// Where each bucket's messages go: the reservation registry of the bucket's lane.
#[derive(Clone)]
pub struct LaneRouter {
    reservations: Arc<[Addr<Registry<Uuid, ReservationActor>>]>,
}

/// `engine.pipeline_threads`, with 0 meaning automatic: half the cores this process
/// may use (`crate::cores`).
pub fn threads(configured: u32) -> usize {
    match configured {
        0 => crate::cores::Cores::detect().auto_lanes().min(MAX_THREADS),
        n => (n as usize).min(MAX_THREADS),
    }
}

/// The lane of a bucket: the buckets of one SKU follow each other round the lanes,
/// as they do round the shards.
pub fn lane_of(key: &BucketKey, lanes: usize) -> usize {
    let lanes = u16::try_from(lanes.clamp(1, MAX_THREADS)).unwrap_or(1);
    usize::from(shard_for(key.activity_id, key.sku_id, key.bucket, lanes))
}

impl Lanes {
    /// Starts `threads` arbiters (none for one: the caller's arbiter is the lane) and
    /// learns their runtimes. Call it inside the actix System.
    pub async fn start(threads: usize) -> Lanes {
        if threads <= 1 {
            return Lanes {
                arbiters: Vec::new(),
                runtimes: vec![tokio::runtime::Handle::current()],
            };
        }
        let mut arbiters = Vec::with_capacity(threads);
        let mut runtimes = Vec::with_capacity(threads);
        for _ in 0..threads {
            let arbiter = Arbiter::new();
            let (tx, rx) = tokio::sync::oneshot::channel();
            arbiter.spawn(async move {
                let _ = tx.send(tokio::runtime::Handle::current());
            });
            match rx.await {
                Ok(runtime) => runtimes.push(runtime),
                // The arbiter died before it ran anything: run its lane on ours.
                Err(_) => runtimes.push(tokio::runtime::Handle::current()),
            }
            arbiters.push(arbiter);
        }
        Lanes { arbiters, runtimes }
    }

    pub fn count(&self) -> usize {
        self.runtimes.len()
    }

    /// The runtimes the pool opens its connections on, in turn.
    pub fn runtimes(&self) -> Vec<tokio::runtime::Handle> {
        self.runtimes.clone()
    }

    /// The arbiter of lane `i` (modulo the lanes); None: the caller's.
    pub fn arbiter(&self, i: usize) -> Option<ArbiterHandle> {
        if self.arbiters.is_empty() {
            return None;
        }
        Some(self.arbiters[i % self.arbiters.len()].handle())
    }

    /// Starts each lane's bucket and reservation registries on its arbiter.
    pub fn start_pipeline(&self, shared: Arc<BucketShared>) -> LaneRouter {
        let count = self.count();
        let bucket_gauges = RegistryGauges::new("bucket", count);
        let reservation_gauges = RegistryGauges::new("reservation", count);
        let reservations = (0..count)
            .map(|lane| {
                let (shared, bucket_gauges) = (shared.clone(), bucket_gauges.clone());
                let buckets = move || {
                    Registry::new(bucket_gauges, lane, move |key: &BucketKey| {
                        BucketActor::new(*key, shared.clone()).start()
                    })
                };
                let buckets = match self.arbiter(lane) {
                    Some(arbiter) => Registry::start_in_arbiter(&arbiter, move |_| buckets()),
                    None => buckets().start(),
                };
                let reservation_gauges = reservation_gauges.clone();
                let reservations = move || {
                    Registry::new(reservation_gauges, lane, move |_: &Uuid| {
                        ReservationActor::new(buckets.clone()).start()
                    })
                };
                match self.arbiter(lane) {
                    Some(arbiter) => Registry::start_in_arbiter(&arbiter, move |_| reservations()),
                    None => reservations().start(),
                }
            })
            .collect();
        LaneRouter { reservations }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}

impl LaneRouter {
    /// The reservation registry for a message of bucket `key`.
    pub fn reservations(&self, key: &BucketKey) -> &Addr<Registry<Uuid, ReservationActor>> {
        &self.reservations[lane_of(key, self.reservations.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bucket_has_one_lane_and_a_sku_s_buckets_use_every_lane() {
        for lanes in 1..=16 {
            let mut per = vec![0u32; lanes];
            for bucket in 0..64 {
                let key = BucketKey {
                    activity_id: 7,
                    sku_id: 42,
                    bucket,
                };
                let lane = lane_of(&key, lanes);
                assert_eq!(lane, lane_of(&key, lanes), "stable");
                per[lane] += 1;
            }
            let (min, max) = (per.iter().min().unwrap(), per.iter().max().unwrap());
            assert!(max - min <= 1, "{lanes} lanes: {per:?}");
        }
    }

    #[test]
    fn zero_threads_means_one_per_core_and_the_count_is_bounded() {
        assert!(threads(0) >= 1);
        assert_eq!(threads(3), 3);
        assert_eq!(threads(1_000), MAX_THREADS);
    }
}
