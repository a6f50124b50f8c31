//! The one small outbound HTTP client of the control plane: readiness
//! probes, gateway stats, Prometheus queries and the data-plane adapters'
//! calls, to `http://` or `https://` URLs through [`crate::connector`].
//! Here, in the leaf both the controller and the adapters depend on, so
//! neither depends on the other for it. Every call is bounded by a
//! timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::{ClientTls, Connector, TlsError};

/// A bearer token kept in a file (read at every use, so a rotated token is
/// used without a restart), without surrounding whitespace.
pub fn bearer_token(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|e| format!("the bearer token file {path}: {e}"))
}

/// A small pooled HTTP client.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Client<Connector, Full<Bytes>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client trusting the public roots only.
    pub fn new(timeout: Duration) -> HttpClient {
        let https = crate::public_connector(Self::http(timeout));
        HttpClient {
            client: Client::builder(TokioExecutor::new()).build(https),
            timeout,
        }
    }

    /// A client trusting the public roots only that opens a connection
    /// for every request: what a server answers a new client (after an
    /// nginx reload, its old workers keep their connections).
    pub fn unpooled(timeout: Duration) -> HttpClient {
        let https = crate::public_connector(Self::http(timeout));
        HttpClient {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build(https),
            timeout,
        }
    }

    /// A client trusting and presenting what `tls` says (the gateways'
    /// `upstream_tls`: model servers and gateways behind a team's CA).
    pub fn with_tls(timeout: Duration, tls: &ClientTls) -> Result<HttpClient, TlsError> {
        Ok(HttpClient {
            client: Client::builder(TokioExecutor::new())
                .build(crate::connector(Self::http(timeout), tls)?),
            timeout,
        })
    }

    fn http(timeout: Duration) -> HttpConnector {
        let mut c = HttpConnector::new();
        c.set_connect_timeout(Some(timeout));
        c.set_nodelay(true);
        c.enforce_http(false);
        c
    }

    /// `GET url`: the status and body, or `None` on any error or timeout.
    pub async fn get(&self, url: &str) -> Option<(u16, Bytes)> {
        self.get_as(url, None).await
    }

    /// `GET url` with `Authorization: Bearer <token>` when a token is given.
    pub async fn get_as(&self, url: &str, bearer: Option<&str>) -> Option<(u16, Bytes)> {
        self.send(http::Method::GET, url, bearer, None).await
    }

    /// `POST url` with a JSON body (and a bearer token when given).
    pub async fn post_json(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: Bytes,
    ) -> Option<(u16, Bytes)> {
        self.send(http::Method::POST, url, bearer, Some(body)).await
    }

    /// A request with `method` and a JSON body when given (a registry's
    /// `DELETE` takes one), and a bearer token when given.
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        bearer: Option<&str>,
        json: Option<Bytes>,
    ) -> Option<(u16, Bytes)> {
        let uri: http::Uri = url.parse().ok()?;
        let mut req = http::Request::builder().method(method).uri(uri);
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if json.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(json.unwrap_or_default())).ok()?;
        let call = async {
            let resp = self.client.request(req).await.ok()?;
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
