//! RabbitMQ: connections, the topology the engine declares, a publisher that waits
//! for broker confirms, and the channel that reopens itself (`reconnecting`).

pub mod acks;
pub mod dead_letters;
pub mod publisher;
pub mod reconnecting;
pub mod settlement;
pub mod topology;

use lapin::{Connection, ConnectionProperties};
use secrecy::ExposeSecret;

use crate::config::AmqpSettings;

#[derive(Debug, thiserror::Error)]
pub enum MqError {
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("{0} is not an AMQP URL (the value is not shown: it may hold a password)")]
    BadUrl(&'static str),
    #[error("TLS with the broker failed ({0} is amqps://): {1}")]
    Tls(&'static str, lapin::Error),
    #[error("`{0}`: {1}")]
    TlsFiles(String, String),
    #[error("no AMQP connection within amqp.connect_timeout_ms = {0}")]
    ConnectTimeout(u64),
    #[error("the broker refused the message (nack)")]
    Nacked,
    /// The message was sent, then the channel or connection failed before the
    /// broker's confirm arrived: the broker may hold it or not.
    #[error("no confirm for a sent message (the broker may hold it): {0}")]
    Unconfirmed(lapin::Error),
    #[error("the message could not be routed to any queue (exchange {exchange:?}, routing key {routing_key:?})")]
    Unroutable {
        exchange: String,
        routing_key: String,
    },
}

impl MqError {
    /// Whether the message may be queued despite the error: a sent message whose
    /// confirm never came, unless the broker closed the channel saying the exchange
    /// does not exist (404). Every other error means the broker does not hold it.
    pub fn maybe_queued(&self) -> bool {
        match self {
            MqError::Unconfirmed(e) => !is_404(e),
            _ => false,
        }
    }

    /// The broker answered 404 NOT_FOUND (e.g. a passive declare of a missing queue).
    pub fn is_not_found(&self) -> bool {
        matches!(self, MqError::Amqp(e) if is_404(e))
    }

    /// The broker refused what was asked (access refused, not found, precondition
    /// failed, a nack, nowhere to route): sending it again changes nothing. Every
    /// other error is the link or the broker going (a closed connection, 320
    /// CONNECTION_FORCED from a broker shutting down, no answer in time).
    pub fn is_refusal(&self) -> bool {
        let refused = |e: &lapin::Error| {
            matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp)
                if [403, 404, 406].contains(&amqp.get_id()))
        };
        match self {
            MqError::Amqp(e) | MqError::Unconfirmed(e) => refused(e),
            MqError::ConnectTimeout(_) => false,
            // A certificate the configured authority did not sign stays unsigned.
            MqError::Tls(..)
            | MqError::Nacked
            | MqError::Unroutable { .. }
            | MqError::BadUrl(_)
            | MqError::TlsFiles(..) => true,
        }
    }
}

fn is_404(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404)
}

/// Opens a connection to the broker (`amqp.urls` in order until one answers, else
/// `amqp.url`) with `amqp.heartbeat_secs` unless the URL sets its own, each within
/// `amqp.connect_timeout_ms`; `amqps://` goes through rustls with `amqp.tls`. A URL
/// is never logged nor put in an error (it carries credentials).
pub async fn connect(settings: &AmqpSettings, name: &str) -> Result<Connection, MqError> {
    let (key, urls) = settings.addresses();
    connect_any(settings, &urls, key, name).await
}

/// `connect` to other URLs of the same broker (`frontstage.amqp_url(s)`), read from
/// the configuration key `key`: the first that answers, in order; else the last
/// one's error.
pub async fn connect_any(
    settings: &AmqpSettings,
    urls: &[secrecy::SecretString],
    key: &'static str,
    name: &str,
) -> Result<Connection, MqError> {
    let mut failed = None;
    for (node, url) in urls.iter().enumerate() {
        match connect_to(settings, url, key, name).await {
            Ok(connection) => {
                if node > 0 {
                    tracing::info!(key, node, "connected to the broker's node {node} of {key}");
                }
                return Ok(connection);
            }
            Err(e) => {
                tracing::debug!(key, node, error = %e, "broker node did not answer; trying the next");
                failed = Some(e);
            }
        }
    }
    Err(failed.unwrap_or(MqError::BadUrl(key)))
}

/// One connection to one URL, read from the configuration key `key`.
async fn connect_to(
    settings: &AmqpSettings,
    url: &secrecy::SecretString,
    key: &'static str,
    name: &str,
) -> Result<Connection, MqError> {
    let mut uri: lapin::uri::AMQPUri = url
        .expose_secret()
        .parse()
        .map_err(|_| MqError::BadUrl(key))?;
    if uri.query.heartbeat.is_none() {
        uri.query.heartbeat = Some(settings.heartbeat_secs);
    }
    let tls = uri.scheme == lapin::uri::AMQPScheme::AMQPS;
    let config = if tls {
        crate::tls::install_provider();
        tls_config(&settings.tls)?
    } else {
        lapin::tcp::OwnedTLSConfig::default()
    };
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let limit = std::time::Duration::from_millis(settings.connect_timeout_ms);
    let runtime = lapin::runtime::default_runtime()?;
    match tokio::time::timeout(
        limit,
        Connection::connect_uri_with_config(uri, props, config, runtime),
    )
    .await
    {
        Ok(Ok(connection)) => Ok(connection),
        // A TLS failure (a certificate no configured CA signed, a plaintext port)
        // arrives as an I/O error: say that it happened in the handshake.
        Ok(Err(e)) if tls && matches!(e.kind(), lapin::ErrorKind::IOError(_)) => {
            Err(MqError::Tls(key, e))
        }
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(MqError::ConnectTimeout(settings.connect_timeout_ms)),
    }
}

/// lapin's TLS settings from `amqp.tls`: the CA is added to the system's roots.
fn tls_config(files: &crate::tls::TlsFiles) -> Result<lapin::tcp::OwnedTLSConfig, MqError> {
    let unusable = |e: crate::tls::TlsError| MqError::TlsFiles(e.key, e.reason);
    let cert_chain = files
        .ca_pem("amqp")
        .map_err(unusable)?
        .map(|pem| String::from_utf8_lossy(&pem).into_owned());
    let identity =
        files
            .identity("amqp")
            .map_err(unusable)?
            .map(|id| lapin::tcp::OwnedIdentity::PKCS8 {
                pem: id.chain_pem,
                key: id.key_pem,
            });
    Ok(lapin::tcp::OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

/// Closes the channels, then the connection. In that order: a channel still open
/// when its connection closes is closed again by lapin when its handle drops, which
/// fails and is logged as a connection error.
pub async fn close(connection: &Connection, channels: &[&lapin::Channel]) {
    for channel in channels {
        if channel.status().connected() {
            let _ = channel.close(200, "closing".into()).await;
        }
    }
    if connection.status().connected() {
        let _ = connection.close(200, "closing".into()).await;
    }
}

/// What the broker counts in a queue right now.
#[derive(Debug, Clone, Copy)]
pub struct QueueCounts {
    /// Messages ready for delivery.
    pub messages: u32,
    /// Consumers subscribed, as the broker counts them.
    pub consumers: u32,
}

/// Asks the broker what `queue` holds (a passive declare: an absent queue is an
/// error, and closes the channel).
pub async fn queue_counts(channel: &lapin::Channel, queue: &str) -> Result<QueueCounts, MqError> {
    use lapin::options::QueueDeclareOptions;
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await?;
    Ok(QueueCounts {
        messages: declared.message_count(),
        consumers: declared.consumer_count(),
    })
}

/// An integer header, whatever integer width the publisher chose.
pub fn int_header(props: &lapin::BasicProperties, name: &str) -> Option<i64> {
    use lapin::types::AMQPValue;
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// A text header (long or short string).
pub fn text_header(props: &lapin::BasicProperties, name: &str) -> Option<String> {
    use lapin::types::AMQPValue;
    match props.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Header carrying how many delayed retries a message has had.
pub const RETRIES_HEADER: &str = "x-seckill-retries";
/// Header carrying why a message was dead-lettered.
pub const DEAD_REASON_HEADER: &str = "x-seckill-dead-reason";
/// Header carrying the short kind of the dead-letter reason.
pub const DEAD_KIND_HEADER: &str = "x-seckill-dead-kind";
/// Header carrying the queue a dead letter came from (where a replay sends it).
pub const DEAD_QUEUE_HEADER: &str = "x-seckill-dead-queue";
/// Header carrying when a message was dead-lettered (ms since the Unix epoch).
pub const DEAD_AT_HEADER: &str = "x-seckill-dead-at-ms";

/// Header set by our publishers to when they published (ms since the Unix epoch);
/// the intake turns it into the publish-to-receive age.
pub const PUBLISHED_AT_HEADER: &str = "x-seckill-published-at-ms";

pub fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Properties of an `order.create` message, signed when `signing_secret`
/// (`amqp.order_signing_secret`) is set: what every producer of the project sends.
pub fn order_properties(
    message_id: &str,
    body: &[u8],
    signing_secret: Option<&secrecy::SecretString>,
) -> lapin::BasicProperties {
    use secrecy::ExposeSecret;
    let properties = message_properties(message_id);
    match signing_secret {
        Some(secret) => with_text_header(
            properties,
            crate::domain::signature::SIGNATURE_HEADER,
            &crate::domain::signature::sign(secret.expose_secret().as_bytes(), body),
        ),
        None => properties,
    }
}

/// `properties` with one more text header.
fn with_text_header(
    properties: lapin::BasicProperties,
    name: &str,
    value: &str,
) -> lapin::BasicProperties {
    use lapin::types::{AMQPValue, LongString};
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        name.into(),
        AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
    );
    properties.with_headers(headers)
}

/// Properties of a JSON work message: its id (consumers dedup by it) and when it
/// was published.
pub fn message_properties(message_id: &str) -> lapin::BasicProperties {
    use lapin::types::{AMQPValue, FieldTable};
    let mut headers = FieldTable::default();
    headers.insert(
        PUBLISHED_AT_HEADER.into(),
        AMQPValue::LongLongInt(unix_millis()),
    );
    lapin::BasicProperties::default()
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
        .with_headers(headers)
}
