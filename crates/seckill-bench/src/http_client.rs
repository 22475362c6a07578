//! The bench's HTTP/1.1 client, on hyper 1 (hyper-util's pooled client): GET, and
//! POST of a JSON body, each under a timeout, with the answer's body read whole up
//! to a bound. The callers bound how many requests are in flight, and with them the
//! connections the pool opens.

use std::time::Duration;

use anyhow::Context;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Largest answer body read.
const MAX_BODY: usize = 16 << 20;

#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// A whole answer.
pub struct Response {
    pub status: u16,
    /// `Retry-After` in seconds, when the answer has one.
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

impl Response {
    /// The body as JSON, or `Null` when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl HttpClient {
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            inner: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        }
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> anyhow::Result<Response> {
        self.send("GET", url, headers, Bytes::new()).await
    }

    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> anyhow::Result<Response> {
        let mut with_type = headers.to_vec();
        with_type.push(("content-type", "application/json"));
        self.send(
            "POST",
            url,
            &with_type,
            Bytes::from(serde_json::to_vec(body)?),
        )
        .await
    }

    async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Response> {
        let mut request = hyper::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body))
            .with_context(|| format!("building {method} {url}"))?;
        let exchange = async {
            let response = self.inner.request(request).await?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the body: {e}"))?
                .to_bytes();
            Ok::<_, anyhow::Error>(Response {
                status,
                retry_after,
                body,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| anyhow::anyhow!("{method} {url}: no answer within {:?}", self.timeout))?
    }
}
