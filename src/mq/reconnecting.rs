//! A channel that reopens itself: the one way the engine keeps a long-lived AMQP
//! channel (the front stage's confirm channel, the outbox publisher's and the
//! compensation worker's, the gauge sampler's plain channel). Opened on first use;
//! when the broker closed the channel (a publish to a missing exchange, a failed
//! passive declare) it is opened again on the same connection, and when the
//! connection itself went, on a new one. `Send + Sync` (a tokio lock inside), so
//! one type serves the front stage's workers and the services' single arbiter.

use std::future::Future;

use lapin::{Channel, Connection};
use secrecy::SecretString;
use tokio::sync::RwLock;

use super::publisher::ConfirmedPublisher;
use super::{connect_any, MqError};
use crate::config::AmqpSettings;

/// What a `Reconnecting` keeps open on its connection: a plain `Channel`, or a
/// confirm channel (`ConfirmedPublisher`).
pub trait Opened: Clone + Send + Sync + 'static {
    /// Opens one on `connection`.
    fn open(connection: &Connection) -> impl Future<Output = Result<Self, MqError>> + Send;
    /// The channel underneath, whose state says whether it is still open.
    fn channel(&self) -> &Channel;
}

impl Opened for Channel {
    async fn open(connection: &Connection) -> Result<Self, MqError> {
        Ok(connection.create_channel().await?)
    }
    fn channel(&self) -> &Channel {
        self
    }
}

impl Opened for ConfirmedPublisher {
    async fn open(connection: &Connection) -> Result<Self, MqError> {
        ConfirmedPublisher::open(connection).await
    }
    fn channel(&self) -> &Channel {
        ConfirmedPublisher::channel(self)
    }
}

/// The connection, and what is open on it (none after a failed open).
struct Open<T> {
    connection: Connection,
    opened: Option<T>,
}

impl<T: Opened> Open<T> {
    /// What is open, while both it and its connection are.
    fn usable(&self) -> Option<T> {
        self.opened
            .as_ref()
            .filter(|t| self.connection.status().connected() && t.channel().status().connected())
            .cloned()
    }
}

/// A connection of its own with one `T` open on it, reopened as needed.
pub struct Reconnecting<T> {
    settings: AmqpSettings,
    /// Tried in order on each (re)connect: a cluster's nodes, or one URL.
    urls: Vec<SecretString>,
    /// The configuration key of `urls`, named when the broker refuses.
    key: &'static str,
    /// The connection's name, as the broker shows it.
    name: &'static str,
    /// Read-locked on the common path (already open); write-locked only to reopen.
    current: RwLock<Option<Open<T>>>,
}

impl<T: Opened> Reconnecting<T> {
    /// To `amqp.urls` (or `amqp.url`); opens nothing until first asked.
    pub fn new(settings: &AmqpSettings, name: &'static str) -> Self {
        let (key, urls) = settings.addresses();
        Self::to(settings, urls, key, name)
    }

    /// To other URLs of the same broker (`frontstage.amqp_url(s)`), read from the
    /// configuration key `key`; opens nothing until first asked.
    pub fn to(
        settings: &AmqpSettings,
        urls: Vec<SecretString>,
        key: &'static str,
        name: &'static str,
    ) -> Self {
        Self {
            settings: settings.clone(),
            urls,
            key,
            name,
            current: RwLock::new(None),
        }
    }

    /// The open `T`; opened first if the broker closed it, on a new connection if
    /// the connection went too.
    pub async fn get(&self) -> Result<T, MqError> {
        if let Some(open) = self.current.read().await.as_ref().and_then(Open::usable) {
            return Ok(open);
        }
        let mut current = self.current.write().await;
        // Another caller may have reopened it while this one waited for the lock.
        if let Some(open) = current.as_ref().and_then(Open::usable) {
            return Ok(open);
        }
        let open = match current.take() {
            Some(open) if open.connection.status().connected() => current.insert(open),
            _ => current.insert(Open {
                connection: connect_any(&self.settings, &self.urls, self.key, self.name).await?,
                opened: None,
            }),
        };
        let opened = T::open(&open.connection).await?;
        open.opened = Some(opened.clone());
        Ok(opened)
    }

    /// Forgets the channel and its connection: the next `get` opens both anew
    /// (after a failure whose cause the channel's state may not show).
    pub async fn reset(&self) {
        self.current.write().await.take();
    }

    /// Closes what is open, saying goodbye to the broker (which otherwise logs a
    /// client that vanished); a later `get` opens anew.
    pub async fn close(&self) {
        if let Some(open) = self.current.write().await.take() {
            let channels: Vec<&Channel> = open.opened.iter().map(Opened::channel).collect();
            super::close(&open.connection, &channels).await;
        }
    }
}
