//! DbPermits owns the number of order messages allowed in flight (several share a
//! transaction under group commit). Intake takes a
//! permit before it dispatches a message and stops pulling from RabbitMQ while none is
//! free: that is the backpressure from PostgreSQL to the queue. A permit is returned
//! when it is dropped, whatever the outcome of its transaction.

use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct DbPermits {
    semaphore: Arc<Semaphore>,
}

/// A held permit; dropping it gives it back.
#[derive(Debug)]
pub struct Permit {
    _inner: OwnedSemaphorePermit,
}

impl Drop for Permit {
    /// The gauge follows releases too, or it would stay at the low-water mark of the
    /// last burst (and the permits-exhausted alert fire on an idle engine).
    fn drop(&mut self) {
        let returned = self._inner.num_permits();
        metrics::gauge!(crate::telemetry::names::DB_PERMITS_AVAILABLE)
            .set((self._inner.semaphore().available_permits() + returned) as f64);
    }
}

/// Waits for a free permit.
#[derive(Message)]
#[rtype(result = "Permit")]
pub struct Acquire;

impl DbPermits {
    pub fn new(capacity: usize) -> Self {
        metrics::gauge!(crate::telemetry::names::DB_PERMITS_CAPACITY).set(capacity as f64);
        Self {
            semaphore: Arc::new(Semaphore::new(capacity)),
        }
    }
}

impl Actor for DbPermits {
    type Context = Context<Self>;
}

impl Handler<Acquire> for DbPermits {
    type Result = ResponseFuture<Permit>;

    fn handle(&mut self, _: Acquire, _: &mut Self::Context) -> Self::Result {
        let semaphore = self.semaphore.clone();
        Box::pin(async move {
            let started = std::time::Instant::now();
            // The semaphore is never closed, so acquiring can only wait, not fail.
            let inner = loop {
                if let Ok(p) = semaphore.clone().acquire_owned().await {
                    break p;
                }
            };
            metrics::histogram!(crate::telemetry::names::DB_PERMIT_WAIT_SECONDS)
                .record(started.elapsed().as_secs_f64());
            metrics::gauge!(crate::telemetry::names::DB_PERMITS_AVAILABLE)
                .set(semaphore.available_permits() as f64);
            Permit { _inner: inner }
        })
    }
}
