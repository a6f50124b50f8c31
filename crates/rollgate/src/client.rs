//! A small blocking client of the admin API for the CLI.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Why a call failed, mapped to the CLI's exit codes.
#[derive(Debug)]
pub enum CallError {
    /// The API refused the input (4xx): exit code 2.
    Input(String),
    /// Anything else: exit code 1.
    Other(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Input(m) | CallError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CallError {}

/// The user's flags or files are wrong: exit code 2, like any bad input.
#[derive(Debug)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

pub struct Api {
    base: String,
    token: Option<String>,
    rt: tokio::runtime::Runtime,
    client: Client<rollgate_net::Connector, Full<Bytes>>,
}

impl Api {
    /// A client of the API at `base` (`http://` or `https://`, verified
    /// against the public roots and `tls.ca_file`).
    pub fn new(
        base: &str,
        token: Option<String>,
        tls: &rollgate_net::ClientTls,
    ) -> anyhow::Result<Api> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let connector = rollgate_net::connector(HttpConnector::new(), tls)
            .map_err(|e| InputError(format!("--ca-cert/--client-cert: {e}")))?;
        let client = {
            let _guard = rt.enter();
            Client::builder(TokioExecutor::new()).build(connector)
        };
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            token,
            rt,
            client,
        })
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
        let raw = self.call_raw(method, path, body)?;
        if raw.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&raw)
            .map_err(|e| CallError::Other(format!("bad JSON from the API: {e}")))
    }

    pub fn call_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Bytes, CallError> {
        let url = format!("{}{}", self.base, path);
        let mut req = http::Request::builder().method(method).uri(&url);
        if let Some(a) = actor() {
            req = req.header("x-rollgate-actor", a);
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        // Writes always carry JSON: the API refuses other writes (a web
        // page's cross-site form cannot send JSON without a preflight).
        let body = match (body, method) {
            (None, "POST" | "PUT" | "PATCH") => {
                Some(&serde_json::Value::Object(Default::default()))
            }
            (b, _) => b,
        };
        let empty = serde_json::Value::Object(Default::default());
        let body = body.map(|b| if b.is_null() { &empty } else { b });
        let payload = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Bytes::from(b.to_string())
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(payload))
            .map_err(|e| CallError::Input(format!("bad request {url}: {e}")))?;
        let fut = async {
            let resp = self.client.request(req).await.map_err(|e| {
                CallError::Other(format!(
                    "cannot reach the rollgate API at {}: {}",
                    self.base,
                    causes(&e)
                ))
            })?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| CallError::Other(e.to_string()))?
                .to_bytes();
            Ok::<_, CallError>((status, bytes))
        };
        let (status, bytes) = self
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), fut).await })
            .map_err(|_| {
                CallError::Other(format!("the API at {} did not answer in 30 s", self.base))
            })??;
        if status.is_success() {
            return Ok(bytes);
        }
        let msg = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                let e = v.get("error")?;
                Some(format!(
                    "{} ({})",
                    e.get("message")?.as_str()?,
                    e.get("code")?.as_str()?
                ))
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        if status.is_client_error() {
            Err(CallError::Input(msg))
        } else {
            Err(CallError::Other(msg))
        }
    }
}

/// The person behind the CLI, recorded "on behalf of" beside the token's
/// identity: `$ROLLGATE_ACTOR`, else `$USER`.
/// An error and its causes, innermost last ("client error (Connect):
/// invalid peer certificate: UnknownIssuer"): the cause is what a user
/// can act on.
fn causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn actor() -> Option<String> {
    std::env::var("ROLLGATE_ACTOR")
        .or_else(|_| std::env::var("USER"))
        .ok()
        .filter(|a| !a.trim().is_empty())
}
