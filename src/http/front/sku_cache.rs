//! What the front stage knows of each SKU (price, buckets, sale window, closed), read
//! from PostgreSQL and kept in memory, and when the reserve script last found a SKU
//! sold out.
//!
//! A sale's first second sends thousands of requests for one SKU. An entry is
//! refreshed by one read at a time (single flight): while it is younger than
//! `SERVE_STALE_FOR`, every request answers from it at once and the first one to
//! find it older than `REFRESH_AFTER` starts the read in the background
//! (stale-while-revalidate), so neither the reservation nor the purchase-token path
//! waits for the database while a usable entry exists. Only a SKU seen for the first
//! time (or not read for longer than `SERVE_STALE_FOR`) makes requests wait, and then
//! all of them wait for the same read. `SERVE_STALE_FOR` is what keeps the
//! `activity close` promise: every front stage answers `SALE_CLOSED` within a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared};

use crate::store::reads::SkuInfo;

/// Which SKU: (activity id, SKU id).
pub type SkuKey = (i64, i64);

/// After this age an entry is read again, in the background.
pub const REFRESH_AFTER: Duration = Duration::from_millis(400);
/// Until this age an entry is still answered from (while its refresh runs). Below the
/// 1 s `activity close` promise, with room for the refresh's own read.
pub const SERVE_STALE_FOR: Duration = Duration::from_millis(800);
/// How long an unknown SKU stays unknown without asking PostgreSQL again, so a flood
/// of requests for SKUs that do not exist costs one read per SKU per this time.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(1);
/// An entry nobody asked for in this long is dropped by `evict` (a finished sale's
/// SKUs are dropped as soon as their sale has ended).
pub const EVICT_UNUSED_AFTER: Duration = Duration::from_secs(60);

/// Why a SKU could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkuUnavailable {
    /// No pooled connection in time.
    Busy,
    /// The read failed.
    Down,
}

impl SkuUnavailable {
    pub fn reason(self) -> &'static str {
        match self {
            SkuUnavailable::Busy => "database busy",
            SkuUnavailable::Down => "database unavailable",
        }
    }
}

type Found = Result<Option<Arc<SkuInfo>>, SkuUnavailable>;
type Flight = Shared<BoxFuture<'static, Found>>;
/// Reads one SKU from the store; `None`: no such SKU.
pub type Loader = Arc<
    dyn Fn(SkuKey) -> BoxFuture<'static, Result<Option<SkuInfo>, SkuUnavailable>> + Send + Sync,
>;

struct Entry {
    read_at: Instant,
    used_at: Instant,
    sku: Option<Arc<SkuInfo>>,
}

#[derive(Default)]
struct State {
    entries: HashMap<SkuKey, Entry>,
    /// The read in progress for a SKU, shared by every request waiting for it.
    flights: HashMap<SkuKey, Flight>,
    /// When the reserve script last found each SKU sold out.
    sold_out: HashMap<SkuKey, Instant>,
}

pub struct SkuCache {
    load: Loader,
    state: Mutex<State>,
    sold_out_recheck: Duration,
    /// `REFRESH_AFTER` and `SERVE_STALE_FOR` (tests stretch them).
    refresh_after: Duration,
    serve_stale_for: Duration,
}

impl SkuCache {
    pub fn new(load: Loader, sold_out_recheck: Duration) -> Arc<Self> {
        Self::with_ages(load, sold_out_recheck, REFRESH_AFTER, SERVE_STALE_FOR)
    }

    fn with_ages(
        load: Loader,
        sold_out_recheck: Duration,
        refresh_after: Duration,
        serve_stale_for: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            load,
            state: Mutex::new(State::default()),
            sold_out_recheck,
            refresh_after,
            serve_stale_for,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain maps, consistent after every statement: a panic
        // elsewhere while it was held leaves nothing half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The SKU, from memory when a usable entry exists; otherwise after the one read
    /// in flight for it.
    pub async fn get(self: &Arc<Self>, key: SkuKey) -> Found {
        let flight = {
            let mut state = self.state();
            let now = Instant::now();
            if let Some(entry) = state.entries.get_mut(&key) {
                entry.used_at = now;
                let age = now.saturating_duration_since(entry.read_at);
                let (fresh_for, usable_for) = match entry.sku {
                    Some(_) => (self.refresh_after, self.serve_stale_for),
                    None => (UNKNOWN_FOR, UNKNOWN_FOR),
                };
                if age < usable_for {
                    let sku = entry.sku.clone();
                    if age >= fresh_for && !state.flights.contains_key(&key) {
                        // Driven by its own task: nobody here waits for it.
                        let _refresh = self.start_flight(&mut state, key);
                    }
                    return Ok(sku);
                }
            }
            match state.flights.get(&key) {
                Some(flight) => flight.clone(),
                None => self.start_flight(&mut state, key),
            }
        };
        flight.await
    }

    /// Starts the read of `key`, driven by a task of its own so that it completes
    /// (and fills the entry) even when every request waiting for it has gone.
    fn start_flight(self: &Arc<Self>, state: &mut State, key: SkuKey) -> Flight {
        let cache = Arc::clone(self);
        let read = (self.load)(key);
        let flight = async move {
            let found = read.await.map(|sku| sku.map(Arc::new));
            let mut state = cache.state();
            if let Ok(sku) = &found {
                let now = Instant::now();
                let used_at = state.entries.get(&key).map_or(now, |e| e.used_at);
                state.entries.insert(
                    key,
                    Entry {
                        read_at: now,
                        used_at,
                        sku: sku.clone(),
                    },
                );
            }
            state.flights.remove(&key);
            found
        }
        .boxed()
        .shared();
        state.flights.insert(key, flight.clone());
        tokio::spawn(flight.clone());
        flight
    }

    /// Whether the reserve script found the SKU sold out less than
    /// `frontstage.sold_out_recheck_ms` ago. Units can come back (a rejected or
    /// cancelled order, a released reservation), so the memory is short: the first
    /// request after it runs the script again.
    pub fn known_sold_out(&self, key: SkuKey) -> bool {
        self.state()
            .sold_out
            .get(&key)
            .is_some_and(|at| at.elapsed() < self.sold_out_recheck)
    }

    pub fn mark_sold_out(&self, key: SkuKey) {
        self.state().sold_out.insert(key, Instant::now());
    }

    /// Drops the entries of sales that have ended and of SKUs nobody asked for in
    /// `EVICT_UNUSED_AFTER`, and sold-out marks past their recheck, so the memory
    /// of a front stage that serves sale after sale stays that of the live ones.
    pub fn evict(&self, now: chrono::DateTime<chrono::Utc>) {
        let mut state = self.state();
        let recheck = self.sold_out_recheck;
        state.entries.retain(|_, e| {
            e.used_at.elapsed() < EVICT_UNUSED_AFTER
                && e.sku.as_ref().is_none_or(|sku| now < sku.end_at)
        });
        state.sold_out.retain(|_, at| at.elapsed() < recheck);
    }

    /// How many SKUs are held (entries, sold-out marks).
    pub fn len(&self) -> (usize, usize) {
        let state = self.state();
        (state.entries.len(), state.sold_out.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn sku(end_in: chrono::TimeDelta) -> SkuInfo {
        let now = chrono::Utc::now();
        SkuInfo {
            buckets: 4,
            unit_price: 100,
            currency: "CNY".into(),
            order_ttl_ms: 60_000,
            start_at: now - chrono::TimeDelta::hours(1),
            end_at: now + end_in,
            closed: false,
        }
    }

    /// A loader that counts its reads and takes `delay` for each.
    fn counting(delay: Duration, found: bool) -> (Loader, Arc<AtomicUsize>) {
        let reads = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&reads);
        let load: Loader = Arc::new(move |_key| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(delay).await;
                Ok(found.then(|| sku(chrono::TimeDelta::hours(1))))
            }
            .boxed()
        });
        (load, reads)
    }

    async fn five_hundred_at_once(cache: &Arc<SkuCache>) -> Vec<Found> {
        let gets = (0..500).map(|_| {
            let cache = Arc::clone(cache);
            tokio::spawn(async move { cache.get((1, 1)).await })
        });
        let mut out = Vec::new();
        for get in gets.collect::<Vec<_>>() {
            out.push(get.await.expect("the get task ran"));
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn five_hundred_requests_for_a_new_sku_make_one_read() {
        let (load, reads) = counting(Duration::from_millis(50), true);
        let cache = SkuCache::new(load, Duration::ZERO);
        let answers = five_hundred_at_once(&cache).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(Some(_)))));
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one read for 500 requests");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_entry_answers_at_once_while_one_read_refreshes_it() {
        // Each read takes one permit: the first is given, the refresh's is held back
        // until every request has been answered, so a request that waited for the
        // refresh would never finish.
        let gate = Arc::new(tokio::sync::Semaphore::new(1));
        let reads = Arc::new(AtomicUsize::new(0));
        let (counter, permits) = (Arc::clone(&reads), Arc::clone(&gate));
        let load: Loader = Arc::new(move |_key| {
            counter.fetch_add(1, Ordering::SeqCst);
            let permits = Arc::clone(&permits);
            async move {
                permits
                    .acquire()
                    .await
                    .map_err(|_| SkuUnavailable::Down)?
                    .forget();
                Ok(Some(sku(chrono::TimeDelta::hours(1))))
            }
            .boxed()
        });
        // Stale after 10 ms, usable for an hour: the test's pace cannot matter.
        let cache = SkuCache::with_ages(
            load,
            Duration::ZERO,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        cache.get((1, 1)).await.expect("first read");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let answers = five_hundred_at_once(&cache).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(Some(_)))));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "one refresh for 500 requests"
        );
        assert!(
            cache.state().flights.contains_key(&(1, 1)),
            "the refresh is still held: nobody waited for it"
        );
        gate.add_permits(1);
        let deadline = Instant::now() + Duration::from_secs(60);
        while cache.state().flights.contains_key(&(1, 1)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !cache.state().flights.contains_key(&(1, 1)),
            "the refresh ended"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_sku_is_remembered_as_unknown() {
        let (load, reads) = counting(Duration::ZERO, false);
        let cache = SkuCache::new(load, Duration::ZERO);
        assert!(matches!(cache.get((9, 9)).await, Ok(None)));
        assert!(matches!(cache.get((9, 9)).await, Ok(None)));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_read_is_not_cached() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&reads);
        let load: Loader = Arc::new(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Err(SkuUnavailable::Busy) }.boxed()
        });
        let cache = SkuCache::new(load, Duration::ZERO);
        assert_eq!(cache.get((1, 1)).await.err(), Some(SkuUnavailable::Busy));
        assert_eq!(cache.get((1, 1)).await.err(), Some(SkuUnavailable::Busy));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ended_sales_and_old_sold_out_marks_are_evicted() {
        let load: Loader = Arc::new(|key: SkuKey| {
            let end_in = if key.0 == 1 {
                chrono::TimeDelta::milliseconds(50)
            } else {
                chrono::TimeDelta::hours(1)
            };
            async move { Ok(Some(sku(end_in))) }.boxed()
        });
        let cache = SkuCache::new(load, Duration::from_millis(10));
        cache.get((1, 1)).await.expect("read");
        cache.get((2, 1)).await.expect("read");
        cache.mark_sold_out((2, 1));
        assert!(cache.known_sold_out((2, 1)));
        assert_eq!(cache.len(), (2, 1));
        tokio::time::sleep(Duration::from_millis(60)).await;
        cache.evict(chrono::Utc::now());
        assert_eq!(
            cache.len(),
            (1, 0),
            "the ended sale and the old mark are gone"
        );
        assert!(!cache.known_sold_out((2, 1)));
    }
}
