//! Time-ordered ids (seed §8.3): order_id and ledger_id are BIGINTs laid out as
//! `milliseconds since 2025-01-01 (41 bits) | node id (10 bits) | sequence (12 bits)`,
//! so B-tree inserts land at the right edge. Event and task ids are UUIDv7.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// 2025-01-01T00:00:00Z in Unix milliseconds.
const EPOCH_MS: u64 = 1_735_689_600_000;
const NODE_BITS: u32 = 10;
const SEQ_BITS: u32 = 12;
pub const MAX_NODE_ID: u16 = (1 << NODE_BITS) - 1;
const MAX_SEQ: u64 = (1 << SEQ_BITS) - 1;

/// Until when this process may mint ids with its node id: the engine's lease on the
/// node id (`store::node_lease`) moves it forward at every renewal, by the TTL less a
/// margin, on the monotonic clock. Once it has passed, every `next_id` fails until a
/// renewal succeeds again; another instance may take the id only well after that
/// (TTL plus a margin since the last renewal, by the database's clock).
#[derive(Debug)]
pub struct MintFence {
    /// Nanoseconds after `origin()`; `u64::MAX` for a generator with no lease (tools).
    until_ns: AtomicU64,
}

/// Minting stopped: the node id's lease was not renewed in time, or was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("minting stopped: the lease on node id {node} is not current")]
pub struct MintingStopped {
    pub node: u16,
}

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl MintFence {
    fn open() -> Self {
        Self {
            until_ns: AtomicU64::new(u64::MAX),
        }
    }

    /// Minting is allowed until `until` (never moves a stopped fence back open).
    pub fn allow_until(&self, until: Instant) {
        let ns = until
            .saturating_duration_since(origin())
            .as_nanos()
            .min(u128::from(u64::MAX - 1)) as u64;
        self.until_ns.store(ns, Ordering::Release);
    }

    /// Stops minting now.
    pub fn stop(&self) {
        self.until_ns.store(0, Ordering::Release);
    }

    pub fn allows(&self) -> bool {
        let until = self.until_ns.load(Ordering::Acquire);
        until == u64::MAX || (origin().elapsed().as_nanos() as u64) < until
    }
}

/// Generates unique, increasing ids for one node. Unique across nodes as long as each
/// running instance has its own node id (leased, `store::node_lease`); never repeats
/// within one process because the clock reading is forced to be monotonic.
#[derive(Debug)]
pub struct IdGenerator {
    node: u64,
    state: Mutex<(u64, u64)>, // (last millisecond used, sequence within it)
    fence: MintFence,
}

impl IdGenerator {
    pub fn new(node_id: u16) -> Self {
        Self {
            node: u64::from(node_id.min(MAX_NODE_ID)),
            state: Mutex::new((0, 0)),
            fence: MintFence::open(),
        }
    }

    pub fn node_id(&self) -> u16 {
        self.node as u16
    }

    /// The fence the node id's lease moves; open until a lease first sets it.
    pub fn fence(&self) -> &MintFence {
        &self.fence
    }

    pub fn next_id(&self) -> Result<i64, MintingStopped> {
        if !self.fence.allows() {
            return Err(MintingStopped {
                node: self.node as u16,
            });
        }
        let now = now_ms();
        // A poisoned lock only means another thread panicked mid-update; the
        // (ms, seq) pair is still consistent, so keep going.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (last, seq) = *state;
        let (ms, seq) = if now > last {
            (now, 0)
        } else if seq < MAX_SEQ {
            (last, seq + 1)
        } else {
            // Sequence exhausted in this millisecond: borrow the next one. The clock
            // catches up within microseconds at any realistic rate.
            (last + 1, 0)
        };
        *state = (ms, seq);
        let id = (ms << (NODE_BITS + SEQ_BITS)) | (self.node << SEQ_BITS) | seq;
        // 41 bits of milliseconds keep the id positive until the year 2094.
        Ok(id as i64)
    }
}

fn now_ms() -> u64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(EPOCH_MS);
    unix.saturating_sub(EPOCH_MS)
}

/// The order number shown to people: derived from the order id but not the raw id
/// (whose bits reveal the node and the sequence), 20 characters.
pub fn order_no(order_id: i64) -> String {
    // A fixed odd multiplier is a bijection on u64: distinct ids, distinct numbers.
    let scrambled = (order_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EC6_111A_5EC6_111A;
    format!("SK{scrambled:018}")
}

/// A new UUIDv7 for events and tasks.
pub fn new_uuid() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_numbers_are_distinct_and_not_the_id() {
        let g = IdGenerator::new(3);
        let ids: Vec<i64> = (0..1000).map(|_| g.next_id().unwrap()).collect();
        let nos: std::collections::HashSet<String> = ids.iter().map(|i| order_no(*i)).collect();
        assert_eq!(nos.len(), 1000);
        assert!(!order_no(ids[0]).contains(&ids[0].to_string()));
        assert!(order_no(ids[0]).len() <= 40);
    }

    #[test]
    fn a_fence_in_the_past_stops_minting_and_a_renewal_reopens_it() {
        let g = IdGenerator::new(9);
        assert!(g.next_id().is_ok(), "open until a lease sets it");
        g.fence()
            .allow_until(Instant::now() + std::time::Duration::from_secs(60));
        assert!(g.next_id().is_ok());
        g.fence().allow_until(Instant::now());
        assert_eq!(g.next_id(), Err(MintingStopped { node: 9 }));
        g.fence()
            .allow_until(Instant::now() + std::time::Duration::from_secs(60));
        assert!(g.next_id().is_ok());
        g.fence().stop();
        assert!(g.next_id().is_err());
    }

    #[test]
    fn ids_increase_and_carry_the_node() {
        let g = IdGenerator::new(5);
        let mut prev = 0;
        for _ in 0..20_000 {
            let id = g.next_id().unwrap();
            assert!(id > prev);
            assert_eq!((id >> SEQ_BITS) & i64::from(MAX_NODE_ID), 5);
            prev = id;
        }
    }
}
