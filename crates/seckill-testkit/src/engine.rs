//! Runs an engine in-process, on its own thread with its own actix System, so a test
//! can stop it gracefully or drop it abruptly (a crash: connections vanish, unacked
//! messages return to the queue, open transactions roll back).

use std::sync::Arc;
use std::thread::JoinHandle;

use seckill_engine::config::Settings;
use seckill_engine::domain::ids::IdGenerator;
use seckill_engine::engine::Engine;
use seckill_engine::status::IntakeStats;
use seckill_engine::status::Readiness;
use tokio::sync::oneshot;

pub struct EngineHandle {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<IntakeStats>,
    pub readiness: Arc<Readiness>,
    /// The engine's generator, under its node id lease (for a front stage).
    pub ids: Arc<IdGenerator>,
    /// The engine's own pool (a test may hold its connections).
    pub pool: seckill_engine::store::Pool,
}

impl EngineHandle {
    pub async fn start(settings: &Settings) -> EngineHandle {
        let settings = settings.clone();
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            // Leaving block_on drops the System and its runtime: every task, socket
            // and actor of this engine goes with it.
            actix_rt::System::new().block_on(async move {
                match Engine::start(&settings).await {
                    Ok(engine) => {
                        let _ = ready_tx.send(Ok((
                            engine.intake_stats(),
                            engine.readiness(),
                            engine.ids(),
                            engine.pool().clone(),
                        )));
                        // A dropped sender (kill) skips the clean AMQP close.
                        if stop_rx.await.is_ok() {
                            engine.stop().await;
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                    }
                }
            });
        });
        let (stats, readiness, ids, pool) = ready_rx
            .await
            .expect("engine thread alive")
            .unwrap_or_else(|e| panic!("engine failed to start: {e}"));
        EngineHandle {
            stop: Some(stop_tx),
            thread: Some(thread),
            stats,
            readiness,
            ids,
            pool,
        }
    }

    /// The engine's admin listener, on a free port, serving from the test's runtime.
    pub async fn admin(&self, settings: &Settings) -> seckill_engine::http::Running {
        let pool = seckill_engine::store::build_pool(&settings.database).expect("pool");
        seckill_engine::http::admin::start(
            settings,
            pool,
            self.stats.clone(),
            self.readiness.clone(),
        )
        .await
        .expect("admin listener")
    }

    /// A front stage beside this engine (its id generator and readiness, a pool of
    /// its own), on a free port; the caller serves it (`actix_rt::spawn`).
    pub async fn front(&self, settings: &Settings) -> seckill_engine::http::Running {
        let pool = seckill_engine::store::build_pool(&settings.database).expect("pool");
        seckill_engine::http::front::start(settings, pool, self.ids.clone(), self.readiness.clone())
            .await
            .expect("front stage")
    }

    /// Closes the AMQP connection cleanly and ends the engine's thread.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join().await;
    }

    /// Drops the engine at once, without closing anything cleanly: like a crash.
    pub async fn kill(mut self) {
        drop(self.stop.take());
        self.join().await;
    }

    async fn join(&mut self) {
        if let Some(thread) = self.thread.take() {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .expect("join engine thread")
                .expect("engine thread did not panic");
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        // Dropping the sender ends the engine's thread.
        drop(self.stop.take());
    }
}
