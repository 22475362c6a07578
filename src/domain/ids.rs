//! Time-ordered ids (seed §8.3): order_id and ledger_id are BIGINTs laid out as
//! `milliseconds since 2025-01-01 (41 bits) | node id (10 bits) | sequence (12 bits)`,
//! so B-tree inserts land at the right edge. Event and task ids are UUIDv7.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// 2025-01-01T00:00:00Z in Unix milliseconds.
const EPOCH_MS: u64 = 1_735_689_600_000;
const NODE_BITS: u32 = 10;
const SEQ_BITS: u32 = 12;
pub const MAX_NODE_ID: u16 = (1 << NODE_BITS) - 1;
const MAX_SEQ: u64 = (1 << SEQ_BITS) - 1;

/// Generates unique, increasing ids for one node. Unique across nodes as long as each
/// running instance has its own node id; never repeats within one process because the
/// clock reading is forced to be monotonic.
#[derive(Debug)]
pub struct IdGenerator {
    node: u64,
    state: Mutex<(u64, u64)>, // (last millisecond used, sequence within it)
}

impl IdGenerator {
    /// The process's one generator for `node_id`. Two generators of the same node
    /// in one process would hand out the same id in the same millisecond (the
    /// sweeper's and the bucket actors' ledger rows did, before this existed), so
    /// everything in the engine takes its generator from here.
    pub fn for_node(node_id: u16) -> Arc<IdGenerator> {
        static NODES: OnceLock<Mutex<HashMap<u16, Arc<IdGenerator>>>> = OnceLock::new();
        let mut nodes = NODES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        nodes
            .entry(node_id)
            .or_insert_with(|| Arc::new(IdGenerator::new(node_id)))
            .clone()
    }

    pub fn new(node_id: u16) -> Self {
        Self {
            node: u64::from(node_id.min(MAX_NODE_ID)),
            state: Mutex::new((0, 0)),
        }
    }

    pub fn next_id(&self) -> i64 {
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
        id as i64
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
    fn one_generator_per_node_in_a_process() {
        let (a, b) = (IdGenerator::for_node(77), IdGenerator::for_node(77));
        assert!(Arc::ptr_eq(&a, &b));
        let ids: std::collections::HashSet<i64> = (0..10_000)
            .map(|i| if i % 2 == 0 { a.next_id() } else { b.next_id() })
            .collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!Arc::ptr_eq(&a, &IdGenerator::for_node(78)));
    }

    #[test]
    fn order_numbers_are_distinct_and_not_the_id() {
        let g = IdGenerator::new(3);
        let ids: Vec<i64> = (0..1000).map(|_| g.next_id()).collect();
        let nos: std::collections::HashSet<String> = ids.iter().map(|i| order_no(*i)).collect();
        assert_eq!(nos.len(), 1000);
        assert!(!order_no(ids[0]).contains(&ids[0].to_string()));
        assert!(order_no(ids[0]).len() <= 40);
    }

    #[test]
    fn ids_increase_and_carry_the_node() {
        let g = IdGenerator::new(5);
        let mut prev = 0;
        for _ in 0..20_000 {
            let id = g.next_id();
            assert!(id > prev);
            assert_eq!((id >> SEQ_BITS) & i64::from(MAX_NODE_ID), 5);
            prev = id;
        }
    }
}
