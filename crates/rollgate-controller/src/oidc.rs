//! OIDC bearer tokens: JWTs from a team's identity provider, verified
//! against the provider's JWKS (signature, issuer, audience, expiry, not
//! before, and a lifetime no longer than configured), the identity from
//! one claim and the role from another.
//!
//! An identity is recorded as `oidc:<alias-or-issuer>:<name>`, so no token
//! can appear in the audit log as rollgate itself (`controller`, `local`)
//! or as a named token.
//!
//! Keys are fetched when first needed and again when a token names a key
//! the cached set lacks (the provider rotated), at most once per
//! [`REFETCH_AFTER`], so a flood of tokens with made-up key ids cannot make
//! the controller hammer the provider. A token whose key is known never
//! waits for a fetch: the set is read without the fetch's lock.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use rollgate_store::Role;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// The most clock skew `[api.oidc] leeway` may allow: more would quietly
/// stop `exp` from meaning anything.
pub const MAX_LEEWAY: Duration = Duration::from_secs(300);

/// A refetch of the key set happens at most this often.
pub const REFETCH_AFTER: Duration = Duration::from_secs(30);

/// `[api.oidc]`: which provider's tokens the API accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The `iss` tokens must carry.
    pub issuer: String,
    /// The `aud` tokens must carry.
    pub audience: String,
    /// The provider's key set: `https://…`, or `http://` on loopback only.
    pub jwks_url: String,
    /// The claim naming the identity (the audit actor).
    #[serde(default = "default_name_claim")]
    pub name_claim: String,
    /// The claim holding the role: `viewer`, `operator` or `admin`.
    #[serde(default = "default_role_claim")]
    pub role_claim: String,
    /// Names the provider in audit actors (`oidc:<alias>:<name>`); the
    /// issuer when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// A token whose `exp` lies further ahead than this is refused: a
    /// stolen token must not work for years.
    #[serde(default = "default_max_lifetime", with = "humantime_serde")]
    pub max_lifetime: Duration,
    /// How far the provider's clock and this host's may disagree, for
    /// `exp` and `nbf`.
    #[serde(default = "default_leeway", with = "humantime_serde")]
    pub leeway: Duration,
}

fn default_max_lifetime() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_leeway() -> Duration {
    Duration::from_secs(60)
}

fn default_name_claim() -> String {
    "sub".into()
}

fn default_role_claim() -> String {
    "rollgate_role".into()
}

/// Why a token was refused (all are the client's: 401).
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("the token is not a valid JWT: {0}")]
    Malformed(String),
    #[error("the token names no key of the provider's key set")]
    UnknownKey,
    #[error("the provider's key set could not be fetched: {0}")]
    KeySet(String),
    #[error("the token does not verify: {0}")]
    Invalid(String),
    #[error("the token has no usable {claim:?} claim")]
    Claim { claim: String },
}

/// A verifier for one provider.
pub struct Oidc {
    config: OidcConfig,
    client: Client<rollgate_net::Connector, Empty<Bytes>>,
    /// The provider's key set as last fetched: read without waiting.
    keys: std::sync::RwLock<Option<JwkSet>>,
    /// When the set was last fetched; held across a fetch, so one fetch
    /// runs at a time (only tokens naming an unknown key wait for it).
    fetched_at: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.config.issuer)
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// Checks the key set's address: TLS, except on loopback.
    pub fn new(config: OidcConfig) -> Result<Oidc, String> {
        let uri: http::Uri = config
            .jwks_url
            .parse()
            .map_err(|e| format!("api.oidc.jwks_url: {e}"))?;
        let loopback = uri.host().is_some_and(|h| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") if loopback => {}
            _ => {
                return Err(format!(
                    "api.oidc.jwks_url must be https:// (http:// only on loopback), got {}",
                    config.jwks_url
                ));
            }
        }
        if config.leeway > MAX_LEEWAY {
            return Err(format!(
                "api.oidc.leeway: at most {} (clock skew, not a token's life)",
                humantime::format_duration(MAX_LEEWAY)
            ));
        }
        let https = rollgate_net::public_connector(HttpConnector::new());
        Ok(Oidc {
            config,
            client: Client::builder(TokioExecutor::new()).build(https),
            keys: std::sync::RwLock::new(None),
            fetched_at: Mutex::new(None),
        })
    }

    async fn fetch(&self) -> Result<JwkSet, OidcError> {
        let uri: http::Uri = self
            .config
            .jwks_url
            .parse()
            .map_err(|e| OidcError::KeySet(format!("{e}")))?;
        let call = async {
            let resp = self
                .client
                .get(uri)
                .await
                .map_err(|e| OidcError::KeySet(e.to_string()))?;
            if !resp.status().is_success() {
                return Err(OidcError::KeySet(format!("status {}", resp.status())));
            }
            let body = Limited::new(resp.into_body(), 1 << 20)
                .collect()
                .await
                .map_err(|e| OidcError::KeySet(e.to_string()))?
                .to_bytes();
            serde_json::from_slice::<JwkSet>(&body).map_err(|e| OidcError::KeySet(e.to_string()))
        };
        tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .map_err(|_| OidcError::KeySet("timed out".into()))?
    }

    /// The key `kid` names, fetching the set if it is unknown and the last
    /// fetch is old enough.
    async fn key(&self, kid: Option<&str>) -> Result<jsonwebtoken::jwk::Jwk, OidcError> {
        let find = || {
            let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
            keys.as_ref().and_then(|s| match kid {
                Some(k) => s.find(k).cloned(),
                None if s.keys.len() == 1 => s.keys.first().cloned(),
                None => None,
            })
        };
        if let Some(k) = find() {
            return Ok(k);
        }
        let mut fetched_at = self.fetched_at.lock().await;
        // Another token's fetch may have brought the key meanwhile.
        if let Some(k) = find() {
            return Ok(k);
        }
        if fetched_at.is_some_and(|t| t.elapsed() < REFETCH_AFTER) {
            return Err(OidcError::UnknownKey);
        }
        *fetched_at = Some(Instant::now());
        let set = self.fetch().await?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Some(set);
        find().ok_or(OidcError::UnknownKey)
    }

    /// The identity and role a token proves.
    pub async fn identity(&self, token: &str) -> Result<(String, Role), OidcError> {
        let header = decode_header(token).map_err(|e| OidcError::Malformed(e.to_string()))?;
        let jwk = self.key(header.kid.as_deref()).await?;
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| OidcError::Invalid(e.to_string()))?;
        // The algorithm is the key's, never the token's choice alone.
        let alg = jwk
            .common
            .key_algorithm
            .and_then(|a| a.to_string().parse().ok())
            .unwrap_or(header.alg);
        if alg != header.alg {
            return Err(OidcError::Invalid(format!(
                "the token says {:?}, its key {alg:?}",
                header.alg
            )));
        }
        let mut v = Validation::new(alg);
        v.set_issuer(&[&self.config.issuer]);
        v.set_audience(&[&self.config.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.validate_nbf = true;
        v.leeway = self.config.leeway.as_secs();
        let claims = decode::<serde_json::Value>(token, &key, &v)
            .map_err(|e| OidcError::Invalid(e.to_string()))?
            .claims;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let latest = now + self.config.max_lifetime.as_secs() + self.config.leeway.as_secs();
        match claims.get("exp").and_then(serde_json::Value::as_f64) {
            Some(exp) if exp <= latest as f64 => {}
            _ => {
                return Err(OidcError::Invalid(format!(
                    "the token expires more than {} ahead ([api.oidc] max_lifetime)",
                    humantime::format_duration(self.config.max_lifetime)
                )));
            }
        }
        let text = |claim: &str| {
            claims
                .get(claim)
                .and_then(|v| v.as_str())
                .map(|s| {
                    s.chars()
                        .filter(|c| !c.is_control())
                        .take(64)
                        .collect::<String>()
                })
                .filter(|s| !s.is_empty())
                .ok_or_else(|| OidcError::Claim {
                    claim: claim.to_string(),
                })
        };
        let name = format!(
            "oidc:{}:{}",
            self.config.alias.as_deref().unwrap_or(&self.config.issuer),
            text(&self.config.name_claim)?
        );
        let role = text(&self.config.role_claim)?
            .parse::<Role>()
            .map_err(|_| OidcError::Claim {
                claim: self.config.role_claim.clone(),
            })?;
        Ok((name, role))
    }
}
