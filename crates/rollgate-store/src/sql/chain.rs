//! The audit chain inside a write transaction: each record appended is
//! chained to the one before it and kept in the transaction's memo, and all
//! of them are written in a few statements when the write ends. Every
//! concern's writes append here; `audit.rs` reads the chain back.

use rollgate_core::Timestamp;

use super::engine::{Db, Val};
use crate::audit::{GENESIS, body_digest};
use crate::{AuditRecord, Result};

/// Appends one audit record, chained to the last one, inside the write.
pub(super) fn append_audit(
    db: &mut dyn Db,
    at: Timestamp,
    actor: &str,
    model: &str,
    rollout: Option<i64>,
    kind: &str,
    body: serde_json::Value,
) -> Result<()> {
    let head = match db.memo().audit_head.take() {
        Some(head) => Some(head),
        None => audit_head_in(db)?,
    };
    let (prev_seq, prev_hash) = head.unwrap_or_else(|| (0, GENESIS.to_string()));
    let mut rec = AuditRecord {
        seq: prev_seq + 1,
        at,
        actor: actor.to_string(),
        model: model.to_string(),
        rollout,
        kind: kind.to_string(),
        body_digest: Some(body_digest(&body)),
        body,
        pruned: false,
        prev_hash,
        hash: String::new(),
    };
    rec.hash = rec.compute_hash();
    let memo = db.memo();
    memo.audit_head = Some((rec.seq, rec.hash.clone()));
    memo.pending_audit.push(rec);
    Ok(())
}

/// Writes the transaction's audit records, many rows per statement (one
/// round trip per hundred records instead of one each).
pub(super) fn flush_audit(db: &mut dyn Db) -> Result<()> {
    const COLS: usize = 10;
    let pending = std::mem::take(&mut db.memo().pending_audit);
    for chunk in pending.chunks(100) {
        let rows: Vec<String> = (0..chunk.len())
            .map(|r| {
                let ps: Vec<String> = (1..=COLS).map(|c| format!("?{}", r * COLS + c)).collect();
                format!("({})", ps.join(", "))
            })
            .collect();
        let mut params = Vec::with_capacity(chunk.len() * COLS);
        for rec in chunk {
            params.extend([
                Val::from(rec.seq),
                Val::from(rec.at.0),
                Val::from(&rec.actor),
                Val::from(&rec.model),
                Val::from(rec.rollout),
                Val::from(&rec.kind),
                Val::from(rec.body.to_string()),
                Val::from(&rec.prev_hash),
                Val::from(&rec.hash),
                Val::from(rec.body_digest.clone()),
            ]);
        }
        db.exec(
            &format!(
                "INSERT INTO audit (seq, at, actor, model, rollout, kind, body, prev_hash, hash, body_digest) VALUES {}",
                rows.join(", ")
            ),
            &params,
        )?;
    }
    Ok(())
}

pub(super) fn audit_head_in(db: &mut dyn Db) -> Result<Option<(u64, String)>> {
    db.row("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", &[])?
        .map(|r| Ok((r.u64(0)?, r.text(1)?)))
        .transpose()
}
