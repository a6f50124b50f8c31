//! API tokens: created under a name never reused, kept only as the hash of
//! their secret, looked up by that hash, revoked; creation and revocation
//! are audited.

use super::chain::append_audit;
use super::rows::{TOKEN_COLS, all, token_row};
use super::store::SqlStore;
use crate::tokens::{RESERVED_ACTORS, valid_token_name};
use crate::{ApiToken, Result, Role, StoreError};

pub(super) fn create_token(
    store: &SqlStore,
    name: &str,
    role: Role,
    secret_hash: &str,
    actor: &str,
) -> Result<ApiToken> {
    if !valid_token_name(name) {
        return Err(StoreError::Invalid(format!(
            "token name {name:?}: use 1-64 of A-Z a-z 0-9 . _ @ -, and none of \
                 rollgate's own actor names ({})",
            RESERVED_ACTORS.join(", ")
        )));
    }
    store.write(|db, now| {
        if db
            .row("SELECT 1 FROM tokens WHERE name = ?1", p![name])?
            .is_some()
        {
            return Err(StoreError::Conflict(format!(
                "token name {name:?} is taken (names are never reused, even revoked ones)"
            )));
        }
        db.exec(
            "INSERT INTO tokens (name, role, hash, created_at, created_by) VALUES (?1, ?2, ?3, ?4, ?5)",
            p![name, role.as_str(), secret_hash, now.0, actor],
        )?;
        append_audit(
            db,
            now,
            actor,
            "",
            None,
            "token_created",
            serde_json::json!({ "name": name, "role": role }),
        )?;
        Ok(ApiToken {
            name: name.to_string(),
            role,
            created_at: now,
            created_by: actor.to_string(),
            revoked_at: None,
        })
    })
}

pub(super) fn tokens(store: &SqlStore) -> Result<Vec<ApiToken>> {
    store.read_one(|db| {
        let rows = db.rows(
            &format!("SELECT {TOKEN_COLS} FROM tokens ORDER BY name"),
            &[],
        )?;
        all(rows, token_row)
    })
}

pub(super) fn revoke_token(store: &SqlStore, name: &str, actor: &str) -> Result<ApiToken> {
    store.write(|db, now| {
        let changed = db.exec(
            "UPDATE tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL",
            p![name, now.0],
        )?;
        let token = db
            .row(
                &format!("SELECT {TOKEN_COLS} FROM tokens WHERE name = ?1"),
                p![name],
            )?
            .map(|r| token_row(&r))
            .transpose()?
            .ok_or_else(|| StoreError::NotFound {
                what: "token",
                name: name.to_string(),
            })?;
        if changed == 1 {
            append_audit(
                db,
                now,
                actor,
                "",
                None,
                "token_revoked",
                serde_json::json!({ "name": name, "role": token.role }),
            )?;
        }
        Ok(token)
    })
}

pub(super) fn token_by_hash(store: &SqlStore, secret_hash: &str) -> Result<Option<ApiToken>> {
    store.read_one(|db| {
        db.row(
            &format!("SELECT {TOKEN_COLS} FROM tokens WHERE hash = ?1 AND revoked_at IS NULL"),
            p![secret_hash],
        )?
        .map(|r| token_row(&r))
        .transpose()
    })
}
