//! The audit log's records and hash chain.
//!
//! Each record carries the hash of the previous one; its own hash covers
//! every field but itself. Editing, deleting or reordering a record breaks
//! the chain at a point `verify` reports.
//!
//! Records written since retention exists hash their body through its
//! digest (`body_digest`), so an old evaluation's body can be pruned — the
//! digest, and with it the chain, stays — while its kind, time and actor
//! stay covered. Only `evaluated` records may be pruned: decisions are
//! kept in full for ever. Older records (no digest) hash the body itself.

use rollgate_core::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The hash a chain starts from.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One append-only audit record. `body` holds aggregates only (verdicts,
/// counts, bounds, reasons), never request or response payloads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditRecord {
    pub seq: u64,
    pub at: Timestamp,
    /// `controller`, or the operator's name.
    pub actor: String,
    pub model: String,
    pub rollout: Option<i64>,
    /// e.g. `evaluated`, `rolled_back`, `champion_set`, `revision_registered`.
    pub kind: String,
    pub body: serde_json::Value,
    /// SHA-256 of the body's canonical JSON (records written since
    /// retention exists; `None` for older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_digest: Option<String>,
    /// The body was pruned by retention (its digest remains).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pruned: bool,
    pub prev_hash: String,
    pub hash: String,
}

/// What a pruned record's body becomes.
pub const PRUNED_BODY: &str = r#"{"pruned":true}"#;

/// SHA-256 of a body's canonical JSON.
pub fn body_digest(body: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(body.to_string().as_bytes()))
}

impl AuditRecord {
    /// SHA-256 over the previous hash and the canonical JSON of every other
    /// field (the body by its digest, when the record has one).
    pub fn compute_hash(&self) -> String {
        let mut content = serde_json::json!({
            "seq": self.seq,
            "at": self.at,
            "actor": self.actor,
            "model": self.model,
            "rollout": self.rollout,
            "kind": self.kind,
        });
        if let Some(fields) = content.as_object_mut() {
            match &self.body_digest {
                Some(digest) => fields.insert("body_digest".into(), digest.clone().into()),
                None => fields.insert("body".into(), self.body.clone()),
            };
        }
        let mut h = Sha256::new();
        h.update(self.prev_hash.as_bytes());
        h.update(b"\n");
        h.update(content.to_string().as_bytes());
        hex::encode(h.finalize())
    }
}

/// Which audit records to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub model: Option<String>,
    pub rollout: Option<i64>,
    /// Records with `seq` greater than this.
    pub after_seq: Option<u64>,
    pub limit: Option<u64>,
}

/// Where and how the chain is broken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChainBreak {
    pub seq: u64,
    pub problem: String,
}

/// The result of walking the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChainReport {
    pub records: u64,
    pub first_break: Option<ChainBreak>,
}

impl ChainReport {
    pub fn is_intact(&self) -> bool {
        self.first_break.is_none()
    }
}

/// Writes records as JSON Lines: one record per line, in order, each line a
/// complete JSON object that `verify_chain` can check again after reading back.
pub fn write_jsonl<'a>(
    records: impl IntoIterator<Item = &'a AuditRecord>,
    mut out: impl std::io::Write,
) -> std::io::Result<()> {
    for r in records {
        serde_json::to_writer(&mut out, r)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Walks records in storage order and reports the first broken link.
pub fn verify_chain<'a>(records: impl IntoIterator<Item = &'a AuditRecord>) -> ChainReport {
    let mut prev = GENESIS;
    let mut n = 0u64;
    for (expected_seq, r) in (1u64..).zip(records) {
        n = expected_seq;
        let problem = if r.seq != expected_seq {
            Some(format!(
                "expected seq {expected_seq}, found {} (a record is missing or moved)",
                r.seq
            ))
        } else if r.prev_hash != prev {
            Some("prev_hash does not match the previous record".to_string())
        } else if r.compute_hash() != r.hash {
            Some("content does not match its hash (edited)".to_string())
        } else if r.pruned && (r.kind != "evaluated" || r.body_digest.is_none()) {
            Some(format!(
                "a {:?} record was pruned: only evaluations may be",
                r.kind
            ))
        } else if !r.pruned
            && r.body_digest
                .as_ref()
                .is_some_and(|d| *d != body_digest(&r.body))
        {
            Some("body does not match its digest (edited)".to_string())
        } else {
            None
        };
        if let Some(problem) = problem {
            return ChainReport {
                records: n,
                first_break: Some(ChainBreak {
                    seq: r.seq,
                    problem,
                }),
            };
        }
        prev = &r.hash;
    }
    ChainReport {
        records: n,
        first_break: None,
    }
}
