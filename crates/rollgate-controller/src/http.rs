//! The controller's outbound HTTP: readiness probes and gateway stats.
//! Every call is bounded by a timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A small pooled HTTP client.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl HttpClient {
    pub fn new(timeout: Duration) -> HttpClient {
        let mut c = HttpConnector::new();
        c.set_connect_timeout(Some(timeout));
        c.set_nodelay(true);
        HttpClient {
            client: Client::builder(TokioExecutor::new()).build(c),
            timeout,
        }
    }

    /// `GET url`: the status and body, or `None` on any error or timeout.
    pub async fn get(&self, url: &str) -> Option<(u16, Bytes)> {
        let uri: http::Uri = url.parse().ok()?;
        let call = async {
            let resp = self.client.get(uri).await.ok()?;
            let status = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), 64 << 20)
                .collect()
                .await
                .ok()?
                .to_bytes();
            Some((status, body))
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .ok()
            .flatten()
    }
}
