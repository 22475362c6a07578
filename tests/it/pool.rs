//! The engine's connection pool serves its callers in the order they ask.

use std::sync::{Arc, Mutex};

use crate::common::{wait_until, TestEnv};

/// A caller that asks the moment a connection comes back waits behind the callers
/// already waiting. bb8 alone hands the connection to that newcomer, and the waiter
/// it woke queues again at the back: under load some waited past the acquire
/// timeout while the mean wait was 0.1–0.2 s (docs/BENCHMARKS.md, session 13).
#[tokio::test(flavor = "current_thread")]
async fn the_pool_serves_callers_in_the_order_they_ask() {
    let env = TestEnv::new().await;
    let pool = env.one_connection_pool();
    let served = Arc::new(Mutex::new(Vec::new()));
    let held = pool.get().await.expect("the only connection");
    let mut waiters = Vec::new();
    for caller in 1..=5 {
        let (mine, served) = (pool.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let conn = mine.get().await.expect("a connection in turn");
            served.lock().unwrap().push(caller);
            drop(conn);
        }));
        let asked = || async { pool.state().waiting == caller };
        assert!(wait_until(std::time::Duration::from_secs(5), asked).await);
    }

    // The connection goes back, and a newcomer asks before any waiter has run.
    drop(held);
    let newcomer = pool.get().await.expect("a connection after the waiters");
    served.lock().unwrap().push(0);
    drop(newcomer);
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), vec![1, 2, 3, 4, 5, 0]);
    assert_eq!(pool.state().timed_out, 0);
    env.cleanup().await;
}
