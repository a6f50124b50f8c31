//! The webhook adapter: the desired routing POSTed as JSON to a receiver
//! that applies it to its data plane and answers `{"version": ...}` once
//! it has. Anything else (no answer, a non-2xx, another version) is not a
//! confirmation, and the routing is sent again after a back-off.

use bytes::Bytes;
use serde::Deserialize;

use super::{AdapterError, Desired};
use crate::http::HttpClient;

#[derive(Deserialize)]
struct Answer {
    version: String,
}

pub(super) async fn apply(
    http: &HttpClient,
    url: &str,
    token_file: Option<&str>,
    desired: &Desired,
) -> Result<(), AdapterError> {
    let token = match token_file {
        Some(path) => Some(crate::http::bearer_token(path).map_err(AdapterError::Io)?),
        None => None,
    };
    let body = serde_json::to_vec(desired).map_err(|e| AdapterError::Io(e.to_string()))?;
    let (status, answer) = http
        .post_json(url, token.as_deref(), Bytes::from(body))
        .await
        .ok_or_else(|| AdapterError::Unreachable { url: url.into() })?;
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
