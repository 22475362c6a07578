//! Publishing with publisher confirms: a publish counts only once the broker has
//! taken responsibility for the message, and an unroutable message is an error
//! (mandatory flag), never a silent drop.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection};

use super::MqError;

/// Persistent delivery mode.
pub const PERSISTENT: u8 = 2;

#[derive(Clone)]
pub struct ConfirmedPublisher {
    channel: Channel,
}

impl ConfirmedPublisher {
    pub async fn open(conn: &Connection) -> Result<Self, MqError> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self { channel })
    }

    /// Publishes and waits for the broker's confirm; a message no queue takes is an
    /// error.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), MqError> {
        self.publish_with(exchange, routing_key, body, properties, true)
            .await
    }

    /// Like `publish`; with `mandatory = false` a message that no queue is bound for
    /// counts as delivered (an event nobody subscribes to is not an error).
    pub async fn publish_with(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), MqError> {
        let pending = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory,
                    ..BasicPublishOptions::default()
                },
                body,
                properties.with_delivery_mode(PERSISTENT),
            )
            .await?;
        crate::failpoint!("publish_before_confirm");
        let confirm = pending.await.map_err(MqError::Unconfirmed)?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(MqError::Unroutable {
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
            }),
            Confirmation::Nack(_) => Err(MqError::Nacked),
            // confirm_select was sent on this channel, so this cannot happen; treat it
            // as unconfirmed rather than assume success.
            Confirmation::NotRequested => Err(MqError::Nacked),
        }
    }

    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}
