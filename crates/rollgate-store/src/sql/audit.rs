//! The audit log and what hangs off it: reading and sampling it, pruning
//! old evaluations, the notification receivers' cursors (the log is their
//! outbox) and the signed checkpoints that anchor the chain. (Records are
//! appended inside each concern's writes, by `chain.rs`.)

use std::collections::BTreeMap;

use rollgate_core::Timestamp;

use super::chain::audit_head_in;
use super::engine::Db;
use super::rows::{AUDIT_COLS, all, audit_row, checkpoint_row};
use super::store::SqlStore;
use crate::audit::{PRUNED_BODY, verify_chain};
use crate::{AuditFilter, AuditRecord, ChainReport, Checkpoint, Result, StoreError};

pub(super) fn audit(store: &SqlStore, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
    store.read_one(|db| {
        let rows = db.rows(
            &format!(
                "SELECT {AUDIT_COLS} FROM audit
                     WHERE (CAST(?1 AS TEXT) IS NULL OR model = ?1)
                       AND (CAST(?2 AS BIGINT) IS NULL OR rollout = ?2) AND seq > ?3
                     ORDER BY seq LIMIT ?4"
            ),
            p![
                filter.model.as_deref(),
                filter.rollout,
                filter.after_seq.unwrap_or(0),
                filter.limit.unwrap_or(u64::MAX)
            ],
        )?;
        all(rows, audit_row)
    })
}

pub(super) fn audit_sample(
    store: &SqlStore,
    rollout: i64,
    points: u64,
) -> Result<(Vec<AuditRecord>, u64)> {
    store.read_one(|db| {
        let evaluated = db
            .row(
                "SELECT COUNT(*) FROM audit WHERE rollout = ?1 AND kind = 'evaluated'",
                p![rollout],
            )?
            .map_or(Ok(0), |r| r.u64(0))?;
        let every = evaluated.div_ceil(points.max(1)).max(1);
        // Numbered in order, evaluations are kept at every `every`-th
        // and the last; a failing one's canonical body says so (the
        // caller reads the parsed outcome; this only keeps it).
        let rows = db.rows(
            &format!(
                "SELECT {AUDIT_COLS} FROM audit WHERE rollout = ?1 AND (kind <> 'evaluated' OR seq IN (
                       SELECT seq FROM (
                         SELECT seq, body, ROW_NUMBER() OVER (ORDER BY seq) AS n FROM audit
                         WHERE rollout = ?1 AND kind = 'evaluated') numbered
                       WHERE n % ?2 = 0 OR n = ?3 OR body LIKE '%\"outcome\":\"fail\"%'))
                     ORDER BY seq"
            ),
            p![rollout, every, evaluated],
        )?;
        Ok((all(rows, audit_row)?, evaluated))
    })
}

pub(super) fn prune_evaluations(store: &SqlStore, before: Timestamp) -> Result<u64> {
    store.write(|db, _| {
        db.exec(
            "UPDATE audit SET body = ?2, pruned = 1
                 WHERE kind = 'evaluated' AND pruned = 0 AND at < ?1 AND body_digest IS NOT NULL",
            p![before.0, PRUNED_BODY],
        )
    })
}

pub(super) fn audit_head(store: &SqlStore) -> Result<Option<(u64, String)>> {
    store.read_one(audit_head_in)
}

pub(super) fn audit_hashes(store: &SqlStore, seqs: &[u64]) -> Result<BTreeMap<u64, String>> {
    store.read(|db| {
        let mut out = BTreeMap::new();
        for &seq in seqs {
            if let Some(r) = db.row("SELECT hash FROM audit WHERE seq = ?1", p![seq])? {
                out.insert(seq, r.text(0)?);
            }
        }
        Ok(out)
    })
}

pub(super) fn verify_audit(store: &SqlStore) -> Result<ChainReport> {
    let records = store.read_one(|db| {
        let rows = db.rows(&format!("SELECT {AUDIT_COLS} FROM audit ORDER BY seq"), &[])?;
        all(rows, audit_row)
    })?;
    Ok(verify_chain(&records))
}

pub(super) fn notify_cursor(store: &SqlStore, receiver: &str) -> Result<Option<u64>> {
    store.read_one(|db| {
        db.row(
            "SELECT seq FROM notify_cursors WHERE receiver = ?1",
            p![receiver],
        )?
        .map(|r| r.u64(0))
        .transpose()
    })
}

pub(super) fn note(store: &SqlStore, n: crate::Note<'_>) -> Result<bool> {
    store.write(|db, now| {
        if let Some((cursor, seq)) = n.cursor {
            // Another writer (a deposed leader) already recorded it.
            let at = db
                .row(
                    "SELECT seq FROM notify_cursors WHERE receiver = ?1",
                    p![cursor],
                )?
                .map(|r| r.u64(0))
                .transpose()?;
            if at.is_some_and(|at| at >= seq) {
                return Ok(false);
            }
            move_cursor(db, now, cursor, seq)?;
        }
        super::chain::append_audit(db, now, n.actor, n.model, n.rollout, n.kind, n.body)?;
        Ok(true)
    })
}

fn move_cursor(db: &mut dyn Db, now: Timestamp, receiver: &str, seq: u64) -> Result<()> {
    db.exec(
        "INSERT INTO notify_cursors (receiver, seq, updated_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(receiver) DO UPDATE SET seq = excluded.seq, updated_at = excluded.updated_at
             WHERE notify_cursors.seq < excluded.seq",
        p![receiver, seq, now.0],
    )?;
    Ok(())
}

pub(super) fn set_notify_cursor(store: &SqlStore, receiver: &str, seq: u64) -> Result<()> {
    store.write(|db, now| move_cursor(db, now, receiver, seq))
}

pub(super) fn add_checkpoint(store: &SqlStore, cp: &Checkpoint) -> Result<()> {
    store.write(|db, _| {
        db.exec(
            "INSERT INTO checkpoints (seq, hash, at, mac, key_id) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (seq) DO NOTHING",
            p![cp.seq, &cp.hash, cp.at.0, &cp.mac, cp.key_id.as_deref()],
        )?;
        Ok(())
    })
}

pub(super) fn checkpoints(store: &SqlStore) -> Result<Vec<Checkpoint>> {
    store.read_one(|db| {
        let rows = db.rows(
            "SELECT seq, hash, at, mac, key_id FROM checkpoints ORDER BY seq",
            &[],
        )?;
        all(rows, checkpoint_row)
    })
}

pub(super) fn latest_checkpoint(store: &SqlStore) -> Result<Option<Checkpoint>> {
    store.read_one(|db| {
        db.row(
            "SELECT seq, hash, at, mac, key_id FROM checkpoints ORDER BY seq DESC LIMIT 1",
            &[],
        )?
        .map(|r| checkpoint_row(&r))
        .transpose()
    })
}

pub(super) fn claim_checkpoint_signer(store: &SqlStore, key_id: &str) -> Result<String> {
    store.write(|db, _| {
        db.exec(
            "INSERT INTO audit_signer (id, key_id) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
            p![key_id],
        )?;
        db.row("SELECT key_id FROM audit_signer WHERE id = 1", &[])?
            .ok_or_else(|| StoreError::Database("the signer row vanished".into()))?
            .text(0)
    })
}
