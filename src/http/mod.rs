//! HTTP: the front stage (reservations and status queries) on `http.addr`, and the
//! admin endpoints (liveness, readiness, metrics, operator API) on `admin.addr`.

pub mod admin;
pub mod front;
pub mod operations;

use std::net::SocketAddr;

use actix_web::{web, App, HttpServer};

use crate::config::Settings;
use crate::store::Pool;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("Redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("RabbitMQ: {0}")]
    Mq(#[from] crate::mq::MqError),
}

fn bind_error(addr: &str, source: std::io::Error) -> HttpError {
    HttpError::Bind {
        addr: addr.to_owned(),
        source,
    }
}

/// The address a server actually bound (the configured one may have port 0).
fn bound_addr(addrs: &[SocketAddr], configured: &str) -> Result<SocketAddr, HttpError> {
    addrs
        .first()
        .copied()
        .ok_or_else(|| bind_error(configured, std::io::Error::other("no address bound")))
}

/// A running HTTP server and the address it listens on (useful with port 0).
pub struct Running {
    pub server: actix_web::dev::Server,
    pub addr: SocketAddr,
}

/// Starts the front stage. Its Redis and AMQP connections are opened here, on the
/// caller's (long-lived) arbiter, and shared by the workers.
pub async fn start(settings: &Settings, pool: Pool) -> Result<Running, HttpError> {
    let state = web::Data::new(front::FrontStage::connect(settings, pool).await?);
    let workers = settings.frontstage.workers.max(1);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::PayloadConfig::new(16 * 1024))
            .configure(front::routes)
    })
    .workers(workers)
    .disable_signals()
    .bind(&settings.http.addr)
    .map_err(|source| bind_error(&settings.http.addr, source))?;
    let addr = bound_addr(&server.addrs(), &settings.http.addr)?;
    let server = server.run();
    tracing::info!(%addr, "front stage listening");
    Ok(Running { server, addr })
}
