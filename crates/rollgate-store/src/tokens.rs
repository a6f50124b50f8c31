//! Named API tokens and their roles. The secret is shown once when a token
//! is made; the store keeps its SHA-256 only (secrets are 256 random bits,
//! so a fast hash is enough: there is nothing to guess by brute force).

use rollgate_core::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a token may do; each role from `viewer` up may do what the ones
/// below it may ([`Role::may`]); a `labeler` may only send labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sends labels (`POST /api/v1/models/{model}/labels`), and nothing
    /// else: not even reads.
    Labeler,
    /// Reads everything.
    Viewer,
    /// Also starts, pauses, resumes and aborts rollouts.
    Operator,
    /// Also promotes by hand, sets champions, unblocks, manages models and
    /// tokens.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Labeler => "labeler",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl Role {
    /// Whether this role may do what `need` is required for: labels may be
    /// sent by a labeler, an operator or an admin; a labeler may do
    /// nothing else; otherwise a role may do what the ones below it may.
    pub fn may(self, need: Role) -> bool {
        match (self, need) {
            (Role::Labeler, need) => need == Role::Labeler,
            (role, Role::Labeler) => role >= Role::Operator,
            (role, need) => role >= need,
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "labeler" => Ok(Role::Labeler),
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?}: use viewer, operator, admin or labeler"
            )),
        }
    }
}

/// A named token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiToken {
    pub name: String,
    pub role: Role,
    pub created_at: Timestamp,
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
}

/// The stored form of a token's secret: SHA-256, hex.
pub fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Actor names rollgate itself writes into the audit log: no token, named
/// or from an identity provider, may appear under one (compared without
/// regard to case).
pub const RESERVED_ACTORS: [&str; 5] = ["controller", "local", "token", "demo", "rollgate"];

/// Whether `name` is one of [`RESERVED_ACTORS`].
pub fn is_reserved_actor(name: &str) -> bool {
    RESERVED_ACTORS.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// Token names are identities in the audit log: 1–64 of `A–Z a–z 0–9 . _ @ -`,
/// and none of the [`RESERVED_ACTORS`].
pub fn valid_token_name(name: &str) -> bool {
    !is_reserved_actor(name)
        && (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No token may be named as rollgate itself writes into the audit log.
    #[test]
    fn rollgates_own_actor_names_are_no_token_names() {
        for reserved in RESERVED_ACTORS {
            assert!(!valid_token_name(reserved), "{reserved}");
            assert!(
                !valid_token_name(&reserved.to_ascii_uppercase()),
                "{reserved}"
            );
        }
        assert!(valid_token_name("ci-deployer@team"));
    }
}
