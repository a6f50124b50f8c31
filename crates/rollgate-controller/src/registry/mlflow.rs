//! MLflow's model registry over its REST API (`/api/2.0/mlflow/...`), the
//! calls the follower makes and nothing more: read a registered model's
//! aliases (all in one call), read a version, set and delete an alias, set
//! a version's tag. Every call is bounded by the registry's timeout.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Deserialize;

use crate::HttpClient;

/// Why a registry call failed; the registry's side unless said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("the registry did not answer (unreachable or past its timeout)")]
    Unreachable,
    #[error("the registry answered {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("{0} not found in the registry")]
    NotFound(String),
    #[error("the registry's answer is unreadable: {0}")]
    Unreadable(String),
    /// The controller's config: its credential cannot be read or sent there.
    #[error("the controller's config: {0}")]
    Config(String),
}

/// A registry version as the follower needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionInfo {
    pub source: Option<String>,
    pub run_id: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// One MLflow tracking server, with the token to send it (read at the
/// start of each pass).
pub struct Mlflow<'a> {
    pub http: &'a HttpClient,
    /// Its base URL, without a trailing `/`.
    pub base: &'a str,
    pub token: Option<String>,
}

impl std::fmt::Debug for Mlflow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Mlflow").field("base", &self.base).finish()
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: String,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct Alias {
    alias: String,
    version: String,
}

#[derive(Deserialize)]
struct RegisteredModel {
    #[serde(default)]
    aliases: Vec<Alias>,
}

#[derive(Deserialize)]
struct GotModel {
    registered_model: RegisteredModel,
}

#[derive(Deserialize)]
struct Tag {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct ModelVersion {
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    tags: Vec<Tag>,
}

#[derive(Deserialize)]
struct GotVersion {
    model_version: ModelVersion,
}

fn query(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

impl Mlflow<'_> {
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<serde_json::Value>,
        what: impl FnOnce() -> String,
    ) -> Result<Bytes, RegistryError> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.base);
        let body = body.map(|b| Bytes::from(b.to_string()));
        let (status, bytes) = self
            .http
            .send(method, &url, self.token.as_deref(), body)
            .await
            .ok_or(RegistryError::Unreachable)?;
        if (200..300).contains(&status) {
            return Ok(bytes);
        }
        let e: ErrorBody = serde_json::from_slice(&bytes).unwrap_or(ErrorBody {
            error_code: String::new(),
            message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
        });
        // Only MLflow's own word: a bare 404 may be a proxy's wrong path.
        if e.error_code == "RESOURCE_DOES_NOT_EXIST" {
            return Err(RegistryError::NotFound(what()));
        }
        Err(RegistryError::Refused {
            status,
            message: format!("{} {}", e.error_code, e.message).trim().to_string(),
        })
    }

    /// The registered model's aliases: alias -> version.
    pub async fn aliases(&self, model: &str) -> Result<BTreeMap<String, String>, RegistryError> {
        let path = format!("registered-models/get?{}", query(&[("name", model)]));
        let body = self
            .call(http::Method::GET, &path, None, || {
                format!("registered model {model:?}")
            })
            .await?;
        let got: GotModel =
            serde_json::from_slice(&body).map_err(|e| RegistryError::Unreadable(e.to_string()))?;
        Ok(got
            .registered_model
            .aliases
            .into_iter()
            .map(|a| (a.alias, a.version))
            .collect())
    }

    /// A version's source, run and tags.
    pub async fn version(&self, model: &str, version: &str) -> Result<VersionInfo, RegistryError> {
        let path = format!(
            "model-versions/get?{}",
            query(&[("name", model), ("version", version)])
        );
        let body = self
            .call(http::Method::GET, &path, None, || {
                format!("version {version} of {model:?}")
            })
            .await?;
        let got: GotVersion =
            serde_json::from_slice(&body).map_err(|e| RegistryError::Unreadable(e.to_string()))?;
        let v = got.model_version;
        Ok(VersionInfo {
            source: v.source.filter(|s| !s.is_empty()),
            run_id: v.run_id.filter(|s| !s.is_empty()),
            tags: v.tags.into_iter().map(|t| (t.key, t.value)).collect(),
        })
    }

    /// Points `alias` at `version` (created or moved).
    pub async fn set_alias(
        &self,
        model: &str,
        alias: &str,
        version: &str,
    ) -> Result<(), RegistryError> {
        let body = serde_json::json!({ "name": model, "alias": alias, "version": version });
        self.call(
            http::Method::POST,
            "registered-models/alias",
            Some(body),
            || format!("version {version} of {model:?}"),
        )
        .await
        .map(drop)
    }

    /// Removes `alias`; one already gone is no error (MLflow answers
    /// `INVALID_PARAMETER_VALUE` for a missing alias).
    pub async fn delete_alias(&self, model: &str, alias: &str) -> Result<(), RegistryError> {
        let body = serde_json::json!({ "name": model, "alias": alias });
        match self
            .call(
                http::Method::DELETE,
                "registered-models/alias",
                Some(body),
                || format!("alias {alias:?} of {model:?}"),
            )
            .await
        {
            Err(RegistryError::Refused { message, .. })
                if message.contains("INVALID_PARAMETER_VALUE") && message.contains("not found") =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// Sets a version's tag.
    pub async fn set_tag(
        &self,
        model: &str,
        version: &str,
        key: &str,
        value: &str,
    ) -> Result<(), RegistryError> {
        let body = serde_json::json!({
            "name": model, "version": version, "key": key, "value": value
        });
        self.call(
            http::Method::POST,
            "model-versions/set-tag",
            Some(body),
            || format!("version {version} of {model:?}"),
        )
        .await
        .map(drop)
    }
}
