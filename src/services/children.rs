//! The supervisor's children as the settings make them: the background services a
//! process runs for its roles (`server.roles`). The engine role runs the outbox
//! publisher, the sweeper, the compensation worker, retention and the gauge
//! sampler; the front role runs the reconciler of its Redis reservations. The
//! monitors every role has (node lease, readiness) are added by `crate::engine`.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::services::compensation_worker::{CompensationConfig, CompensationWorker};
use crate::services::gauges::GaugeSampler;
use crate::services::outbox_publisher::{OrderLoad, OutboxConfig, OutboxPublisher};
use crate::services::reconciler::Reconciler;
use crate::services::retention::{Retention, RetentionConfig};
use crate::services::runner::{Maintenance, Service};
use crate::services::supervisor::{ChildFactory, Supervisor};
use crate::services::sweeper::{Sweeper, SweeperConfig};
use crate::status::{Live, Readiness};
use crate::store::Pool;

/// The supervisor with the background services of the process's roles: for the
/// engine, the outbox publisher, the sweeper, the compensation worker, the
/// retention service and the gauge sampler; for the front stage, the reconciler of
/// Redis reservations. The outbox publisher yields to the orders `load` counts, and
/// the sampled figures go to the live state `readiness` carries.
pub fn background_services(
    settings: &Settings,
    pool: &Pool,
    load: Arc<dyn OrderLoad>,
    ids: Arc<IdGenerator>,
    readiness: &Readiness,
) -> Supervisor {
    let outbox = {
        let (pool, amqp) = (pool.clone(), settings.amqp.clone());
        let config = OutboxConfig::from(&settings.outbox);
        child(move || {
            OutboxPublisher::new(
                pool.clone(),
                amqp.clone(),
                config.clone(),
                Some(load.clone()),
            )
        })
    };
    let sweeper = {
        let pool = pool.clone();
        let config = SweeperConfig::new(&settings.sweeper, &settings.compensation);
        child(move || Sweeper::new(pool.clone(), ids.clone(), config.clone()))
    };
    let compensation = {
        let (pool, redis, amqp) = (pool.clone(), settings.redis.clone(), settings.amqp.clone());
        let config = CompensationConfig::from(&settings.compensation);
        child(move || {
            CompensationWorker::new(pool.clone(), redis.clone(), amqp.clone(), config.clone())
        })
    };
    let retention = {
        let pool = pool.clone();
        let config = RetentionConfig::from(&settings.retention);
        child(move || Retention::new(pool.clone(), config.clone()))
    };
    let gauges = {
        let (pool, amqp, live) = (
            pool.clone(),
            settings.amqp.clone(),
            readiness.live().clone(),
        );
        let interval = Duration::from_millis(settings.telemetry.sample_interval_ms);
        let conservation = Duration::from_millis(settings.telemetry.conservation_interval_ms);
        child(move || {
            GaugeSampler::new(
                pool.clone(),
                amqp.clone(),
                interval,
                conservation,
                live.clone(),
            )
        })
    };
    let mut supervisor = Supervisor::new(
        Duration::from_millis(settings.supervisor.restart_base_ms),
        Duration::from_millis(settings.supervisor.restart_max_ms),
    );
    if settings.server.engine() {
        supervisor = supervisor
            .child(OutboxPublisher::NAME, outbox)
            .child(Sweeper::NAME, sweeper)
            .child(CompensationWorker::NAME, compensation)
            .child(Retention::NAME, retention)
            .child(GaugeSampler::NAME, gauges);
    }
    if settings.server.front() {
        supervisor = supervisor.child(
            Reconciler::NAME,
            reconciler(settings, pool, readiness.live()),
        );
    }
    supervisor
}

/// The reconciler of Redis reservations past their TTL (each pass also samples the drift).
fn reconciler(settings: &Settings, pool: &Pool, live: &Arc<Live>) -> ChildFactory {
    let (pool, redis, live) = (pool.clone(), settings.redis.clone(), live.clone());
    let interval = Duration::from_millis(settings.frontstage.reconcile_interval_ms);
    let marker_ttl = settings.compensation.released_marker_ttl_secs;
    let reservation_ttl = Duration::from_millis(settings.frontstage.reservation_ttl_ms);
    child(move || {
        Reconciler::new(
            pool.clone(),
            redis.clone(),
            interval,
            marker_ttl,
            reservation_ttl,
            live.clone(),
        )
    })
}

/// A supervisor child that runs a fresh service from `make` on every (re)start.
pub fn child<S: Service>(make: impl Fn() -> S + 'static) -> ChildFactory {
    Box::new(move |supervisor| {
        Maintenance::new(make(), Some(supervisor))
            .start()
            .recipient()
    })
}
