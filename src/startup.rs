//! The one composition root: what `serve` runs, started and drained in order. The
//! engine first (the listeners need its id generator, readiness flag and pool), then
//! the front stage, then the admin listener; on the way down the listeners stop
//! before the engine drains. Each part is its own phase, so that a process serving
//! only some of them can pick its phases.

use std::sync::Arc;

use actix_web::dev::ServerHandle;

use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::engine::{Engine, EngineError};
use crate::http::HttpError;
use crate::status::{IntakeStats, Readiness};
use crate::store::{self, Pool, StoreError};

/// Which part failed to start, with why (the part names the message).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("starting the engine")]
    Engine(#[source] EngineError),
    #[error("the front stage's pool")]
    FrontPool(#[source] StoreError),
    #[error("starting the front stage")]
    Front(#[source] HttpError),
    #[error("starting the admin endpoints")]
    Admin(#[source] HttpError),
}

/// Everything `serve` runs, until `drain`.
pub struct Served {
    engine: Engine,
    /// The buyers' listener, in the roles that run the front stage.
    front: Option<ServerHandle>,
    admin: ServerHandle,
}

/// Starts the engine (the parts of it `server.roles` names), the front stage when
/// a role runs it, and the admin listener, in that order. Must run inside an actix
/// `System` (the engine's actors, the listeners' servers).
pub async fn start(settings: &Settings) -> Result<Served, StartupError> {
    raise_descriptor_limit();
    log_sizes(settings);
    let engine = start_engine(settings).await?;
    let front = match settings.server.front() {
        true => Some(start_front(settings, engine.ids(), engine.readiness()).await?),
        false => None,
    };
    let admin = start_admin(
        settings,
        engine.pool().clone(),
        engine.intake_stats(),
        engine.readiness(),
    )
    .await?;
    Ok(Served {
        engine,
        front,
        admin,
    })
}

/// Says how many cores this process may use, from where, and the sizes that follow
/// (`crate::cores`), or that the settings fixed them.
pub fn log_sizes(settings: &Settings) {
    let cores = crate::cores::Cores::detect();
    let said = |configured: usize, auto: usize| match configured {
        0 => format!("{auto} (automatic)"),
        n => format!("{n} (set)"),
    };
    tracing::info!(
        cores = cores.count,
        from = %cores.source,
        pipeline_threads = %said(settings.engine.pipeline_threads as usize, cores.auto_lanes()),
        frontstage_workers = %said(settings.frontstage.workers, cores.auto_workers()),
        roles = %settings.server.label(),
        "sized to the host"
    );
    // What each link runs over, and the setting that decides it.
    for t in settings.transports() {
        tracing::info!(link = t.link, key = t.key, transport = %t.summary, "link transport");
    }
}

/// Raises the soft limit on open file descriptors to the hard one (a flash sale's
/// connections need more than the usual 1,024), and logs both: the front stage's
/// connection cap is derived from it (`http::front_connection_cap`).
pub fn raise_descriptor_limit() {
    let before = crate::http::descriptor_limits();
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => tracing::info!(
            soft,
            hard = before.map(|l| l.1),
            was = before.map(|l| l.0),
            "file descriptor limit"
        ),
        Err(e) => {
            tracing::warn!(error = %e, soft = before.map(|l| l.0), "could not raise the file descriptor limit")
        }
    }
}

/// The engine: intakes, pipeline and background services (`Engine::start`).
pub async fn start_engine(settings: &Settings) -> Result<Engine, StartupError> {
    Engine::start(settings).await.map_err(StartupError::Engine)
}

/// The buyers' listener, minting order ids with `ids` and following `readiness`;
/// served on the current arbiter until its handle stops it.
pub async fn start_front(
    settings: &Settings,
    ids: Arc<IdGenerator>,
    readiness: Arc<Readiness>,
) -> Result<ServerHandle, StartupError> {
    // The front stage reads through a small pool of its own: a flood of status
    // reads or unknown SKUs waits there and never for the order transactions'
    // connections.
    let front_pool = {
        let mut db = settings.database.clone();
        db.pool_size = settings.frontstage.db_pool_size;
        store::build_pool(&db).map_err(StartupError::FrontPool)?
    };
    let front = crate::http::front::start(settings, front_pool, ids, readiness)
        .await
        .map_err(StartupError::Front)?;
    let handle = front.server.handle();
    actix_rt::spawn(front.server);
    Ok(handle)
}

/// The operators' listener (health, metrics, the operator API) on the engine's
/// pool; served on the current arbiter until its handle stops it.
pub async fn start_admin(
    settings: &Settings,
    pool: Pool,
    intakes: Arc<IntakeStats>,
    readiness: Arc<Readiness>,
) -> Result<ServerHandle, StartupError> {
    let admin = crate::http::admin::start(settings, pool, intakes, readiness)
        .await
        .map_err(StartupError::Admin)?;
    let handle = admin.server.handle();
    actix_rt::spawn(admin.server);
    Ok(handle)
}

/// Stops taking requests first (the front stage, then the admin listener, each
/// finishing the requests it has), then drains the engine (`Engine::stop`).
pub async fn drain(served: Served) {
    if let Some(front) = &served.front {
        front.stop(true).await;
    }
    served.admin.stop(true).await;
    served.engine.stop().await;
}
