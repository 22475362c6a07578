//! RabbitMQ: connections, the topology the engine declares, and a publisher that waits
//! for broker confirms.

pub mod publisher;
pub mod topology;

use lapin::{Connection, ConnectionProperties};
use secrecy::ExposeSecret;

use crate::config::AmqpSettings;

#[derive(Debug, thiserror::Error)]
pub enum MqError {
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("the broker refused the message (nack)")]
    Nacked,
    #[error("the message could not be routed to any queue (exchange {exchange:?}, routing key {routing_key:?})")]
    Unroutable {
        exchange: String,
        routing_key: String,
    },
}

/// Opens a connection. The URL is never logged (it carries credentials).
pub async fn connect(settings: &AmqpSettings, name: &str) -> Result<Connection, MqError> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    Ok(Connection::connect(settings.url.expose_secret(), props).await?)
}
