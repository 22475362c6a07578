//! The engine's connection pool serves its callers in the order they ask.

use std::sync::{Arc, Mutex};

use crate::common::{wait_until, TestEnv, HANG};

/// A caller that asks the moment a connection comes back waits behind the callers
/// already waiting. bb8 alone hands the connection to that newcomer, and the waiter
/// it woke queues again at the back: under load some waited past the acquire
/// timeout while the mean wait was 0.1–0.2 s (docs/benchmarks-history.md, 2026-12-01, c21a6aa).
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
        assert!(wait_until(HANG, asked).await);
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

/// bb8 opens a connection in the task that finds the pool short: an HTTP worker's,
/// whose runtime ends when the front stage stops, before the engine drains. The
/// pool opens it on the engine's runtime instead, so it outlives that worker.
#[tokio::test(flavor = "current_thread")]
async fn a_connection_opened_for_another_runtime_outlives_it() {
    let env = TestEnv::new().await;
    let pool = env.one_connection_pool();
    let worker_pool = pool.clone();
    // The worker: a thread with a runtime of its own, gone when the thread ends. It
    // is joined from the blocking pool, so that this runtime stays free to open the
    // connection it asks for.
    let worker = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the worker's runtime");
        runtime.block_on(async {
            let conn = worker_pool
                .get()
                .await
                .expect("a connection for the worker");
            backend_pid(&conn.client).await
        })
    });
    let worker_pid = tokio::task::spawn_blocking(move || worker.join())
        .await
        .unwrap()
        .expect("the worker thread");

    let conn = pool.get().await.expect("the connection back in the pool");
    assert_eq!(backend_pid(&conn.client).await, worker_pid);
    drop(conn);
    assert_eq!(pool.state().connections, 1);
    env.cleanup().await;
}

async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("the backend's pid")
        .get(0)
}
