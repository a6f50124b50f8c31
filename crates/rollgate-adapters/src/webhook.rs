//! The webhook adapter: the desired routing POSTed as JSON to a receiver
//! that applies it to its data plane and answers `{"version": ...}` once
//! it has. Anything else (no answer, a non-2xx, another version) is not a
//! confirmation, and the routing is sent again after a back-off. The body
//! carries the routing's `generation`: a receiver holding a higher one
//! refuses it with `409` and `{"generation": <the one it holds>}`
//! ([`AdapterError::Stale`]).

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::Deserialize;

use crate::{Adapter, AdapterError, Desired, HttpClient};

/// A model's webhook receiver, as its `DataPlane::Webhook` declares it.
#[derive(Debug)]
pub(crate) struct Webhook {
    pub http: HttpClient,
    pub url: String,
    pub bearer_token_file: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    version: String,
}

/// A receiver's refusal of a routing older than the one it holds.
#[derive(Deserialize)]
struct Newer {
    generation: u64,
}

impl Adapter for Webhook {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    fn send<'a>(&'a self, desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>> {
        Box::pin(self.post_and_confirm(desired))
    }

    /// A receiver reads nothing of rollgate's before it starts.
    fn seed_files(&self, _: &Desired) -> Result<Vec<(String, String)>, AdapterError> {
        Ok(vec![])
    }
}

impl Webhook {
    async fn post_and_confirm(&self, desired: &Desired) -> Result<(), AdapterError> {
        let url = self.url.as_str();
        let token = match &self.bearer_token_file {
            Some(path) => Some(rollgate_net::bearer_token(path).map_err(AdapterError::Io)?),
            None => None,
        };
        let body = serde_json::to_vec(desired).map_err(|e| AdapterError::Io(e.to_string()))?;
        let (status, answer) = self
            .http
            .post_json(url, token.as_deref(), Bytes::from(body))
            .await
            .ok_or_else(|| AdapterError::Unreachable { url: url.into() })?;
        if status == 409
            && let Ok(newer) = serde_json::from_slice::<Newer>(&answer)
            && newer.generation > desired.generation
        {
            return Err(AdapterError::Stale {
                have: newer.generation,
                want: desired.generation,
            });
        }
        if !(200..300).contains(&status) {
            return Err(AdapterError::Refused {
                url: url.into(),
                status,
                body: String::from_utf8_lossy(&answer).chars().take(300).collect(),
            });
        }
        let got = serde_json::from_slice::<Answer>(&answer)
            .map(|a| a.version)
            .unwrap_or_default();
        if got == desired.version {
            Ok(())
        } else {
            Err(AdapterError::OtherVersion {
                want: desired.version.clone(),
                got,
            })
        }
    }
}
