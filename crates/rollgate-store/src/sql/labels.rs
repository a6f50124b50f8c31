//! Answers recorded for labels, and the labels: answers inserted once per
//! (model, request, revision); labels once per (model, request), a batch
//! in one transaction with one audit record of its counts. A label may
//! come before its answer is read from the gateway: it is kept, and joins
//! the answer when it comes.

use rollgate_core::Timestamp;
use rollgate_core::labels::Recorded;

use super::chain::append_audit;
use super::rows::get_model;
use super::store::SqlStore;
use crate::Result;
use crate::labels::{AnswerRow, LabelCounts, LabelIn};

pub(super) fn record_answers(store: &SqlStore, rows: &[AnswerRow]) -> Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    store.write(|db, _| {
        let mut added = 0;
        for r in rows {
            added += db.exec(
                "INSERT INTO answers (model, request_id, revision, rollout, epoch, unit, at, class, value)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                     ON CONFLICT DO NOTHING",
                p![
                    r.model.as_str(),
                    r.request_id.as_str(),
                    r.revision.as_str(),
                    r.rollout,
                    i64::from(r.epoch),
                    i64::from(r.unit),
                    r.at.0,
                    r.class.clone(),
                    r.value.map(|v| v.to_string())
                ],
            )?;
        }
        Ok(added)
    })
}

pub(super) fn add_labels(
    store: &SqlStore,
    model: &str,
    labels: &[LabelIn],
    actor: &str,
) -> Result<LabelCounts> {
    store.write(|db, now| {
        get_model(db, model)?;
        let mut counts = LabelCounts {
            received: labels.len() as u64,
            ..LabelCounts::default()
        };
        for l in labels {
            let known = db
                .row(
                    "SELECT 1 FROM answers WHERE model = ?1 AND request_id = ?2",
                    p![model, l.request_id.as_str()],
                )?
                .is_some();
            let had = db.row(
                "SELECT label FROM labels WHERE model = ?1 AND request_id = ?2",
                p![model, l.request_id.as_str()],
            )?;
            match had {
                Some(r) if r.text(0)? == l.label => counts.duplicates += 1,
                Some(_) => counts.conflicts += 1,
                None => {
                    // Kept even before its answer is: gateways hand their
                    // answers to the store a follow cycle behind.
                    db.exec(
                        "INSERT INTO labels (model, request_id, label, observed_at, received_at, received_by)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        p![
                            model,
                            l.request_id.as_str(),
                            l.label.as_str(),
                            l.observed_at.map(|t| t.0),
                            now.0,
                            actor
                        ],
                    )?;
                    if known {
                        counts.applied += 1;
                    } else {
                        counts.unknown += 1;
                    }
                }
            }
        }
        // A batch that changed nothing (empty, or only duplicates: a
        // pipeline's retry) leaves no record.
        if counts.applied + counts.unknown + counts.conflicts > 0 {
            append_audit(
                db,
                now,
                actor,
                model,
                None,
                "labels_received",
                serde_json::to_value(counts).unwrap_or_default(),
            )?;
        }
        Ok(counts)
    })
}

pub(super) fn labelled_answers(store: &SqlStore, rollout: i64) -> Result<Vec<Recorded>> {
    store.read(|db| {
        let rows = db.rows(
            "SELECT a.request_id, a.revision, a.epoch, a.unit, a.class, a.value, l.label,
                    a.at, l.received_at
                 FROM answers a LEFT JOIN labels l
                   ON l.model = a.model AND l.request_id = a.request_id
                 WHERE a.rollout = ?1
                 ORDER BY a.at, a.request_id, a.revision",
            p![rollout],
        )?;
        rows.into_iter()
            .map(|r| {
                Ok(Recorded {
                    request_id: r.text(0)?,
                    revision: r.text(1)?,
                    epoch: r.u32(2)?,
                    unit: u16::try_from(r.u64(3)?).unwrap_or(0),
                    class: r.opt_text(4)?,
                    value: r.opt_text(5)?.and_then(|v| v.parse().ok()),
                    label: r.opt_text(6)?,
                    at_ms: r.u64(7)?,
                    labelled_at_ms: r.opt_u64(8)?,
                })
            })
            .collect()
    })
}

pub(super) fn prune_answers(store: &SqlStore, before: Timestamp) -> Result<u64> {
    store.write(|db, _| {
        // An active rollout keeps its answers and their labels: its tests'
        // counts must never go down.
        let answers = db.exec(
            "DELETE FROM answers WHERE at < ?1
                 AND rollout NOT IN (SELECT id FROM rollouts WHERE active = 1)",
            p![before.0],
        )?;
        let labels = db.exec(
            "DELETE FROM labels WHERE received_at < ?1 AND NOT EXISTS (
                 SELECT 1 FROM answers a JOIN rollouts r ON r.id = a.rollout AND r.active = 1
                 WHERE a.model = labels.model AND a.request_id = labels.request_id)",
            p![before.0],
        )?;
        Ok(answers + labels)
    })
}
