//! rollgate's admin API as the operator calls it: every change a
//! Kubernetes object asks for goes through the same API, validator,
//! roles and audit as any other caller's (the admin API is not the host:
//! a `Model` cannot declare a data plane the controller's config did
//! not), with the Kubernetes user recorded as "on behalf of".

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// How long one call may take.
const CALL_WITHIN: Duration = Duration::from_secs(15);

/// Why a call failed, and whose fault it is.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AdminError {
    /// rollgate refused the object's input (400, 404, 409, 422): the
    /// object's fault, said in its `Valid` condition; retried only when
    /// the object changes (or, for a conflict, later).
    #[error("{message}")]
    Refused {
        status: u16,
        /// The API's stable error code (`invalid_plan`, `conflict`, ...).
        code: String,
        /// The message, with the field where the API named one.
        message: String,
    },
    /// rollgate could not be reached, failed (5xx), refused the operator
    /// itself (401, 403, 429) or asked for a retry (a version conflict):
    /// retried.
    #[error("the rollgate API: {0}")]
    Unavailable(String),
}

impl AdminError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, AdminError::Refused { status: 404, .. })
    }
}

/// A client of one rollgate admin API.
#[derive(Debug, Clone)]
pub struct AdminApi {
    base: String,
    token: Option<String>,
    client: Client<rollgate_net::Connector, Full<Bytes>>,
}

impl AdminApi {
    /// The API at `base` (`http://` or `https://`, verified against the
    /// public roots and `tls`), with a bearer token (an admin's: the
    /// operator registers models and revisions).
    pub fn new(
        base: &str,
        token: Option<String>,
        tls: &rollgate_net::ClientTls,
    ) -> Result<AdminApi, rollgate_net::TlsError> {
        let connector = rollgate_net::connector(HttpConnector::new(), tls)?;
        Ok(AdminApi {
            base: base.trim_end_matches('/').to_string(),
            token,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// One call; `actor` is sent as `x-rollgate-actor` (on behalf of).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        actor: &str,
    ) -> Result<Value, AdminError> {
        let url = format!("{}{}", self.base, path);
        let mut req = http::Request::builder()
            .method(method)
            .uri(&url)
            .header("x-rollgate-actor", actor);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let payload = match (body, method) {
            (Some(b), _) => Bytes::from(b.to_string()),
            (None, "GET" | "DELETE") => Bytes::new(),
            (None, _) => Bytes::from_static(b"{}"),
        };
        if !payload.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(Full::new(payload))
            .map_err(|e| AdminError::Unavailable(format!("bad request {url}: {e}")))?;
        let answer = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| AdminError::Unavailable(format!("cannot reach {url}: {e}")))?;
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| AdminError::Unavailable(e.to_string()))?
                .to_bytes();
            Ok::<_, AdminError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(CALL_WITHIN, answer)
            .await
            .map_err(|_| AdminError::Unavailable(format!("{url} did not answer in time")))??;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match (status, value["error"]["code"].as_str()) {
            (200..=299, _) => Ok(value),
            // The API's own "retry" and a refusal of the operator itself
            // (its token, its role, a rate): not the object's fault.
            (409, Some("version_conflict")) | (401 | 403 | 408 | 429, _) => {
                Err(AdminError::Unavailable(format!(
                    "{method} {path} answered {status}: {}",
                    value["error"]["message"]
                )))
            }
            // rollgate's own refusal carries its error code; a bare 404 or
            // 409 (a proxy in the way, a wrong --api prefix) is not the
            // object's fault.
            (400 | 404 | 409 | 422, Some(_)) => Err(refused(status, &value)),
            _ => Err(AdminError::Unavailable(format!(
                "{method} {path} answered {status}"
            ))),
        }
    }
}

/// The API's error envelope (`{"error": {code, message}}`, the message
/// naming the field at fault) as a refusal.
fn refused(status: u16, body: &Value) -> AdminError {
    let e = &body["error"];
    let code = e["code"].as_str().unwrap_or("refused").to_string();
    let message = e["message"]
        .as_str()
        .unwrap_or("refused by the rollgate API")
        .to_string();
    AdminError::Refused {
        status,
        code,
        message,
    }
}
