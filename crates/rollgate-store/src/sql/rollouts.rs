//! Rollouts and their transitions: starting a rollout against the model's
//! champion, reading rollouts, and committing a transition with every
//! effect the state machine returned (routing, promotion, rejection, audit
//! records) in the transaction that moves the rollout's version on, alone
//! or as a batch. (Concurrent single transitions are queued into groups
//! by `group_commit.rs` and committed here.)

use rollgate_core::{AuditEvent, Effect, Plan, RolloutSpec, RolloutState, Routing, Timestamp};

use super::chain::append_audit;
use super::engine::{Db, Val};
use super::gateways::routes_changed;
use super::lease::check_fence;
use super::registry::{not_blocked, promote_in, revision_of, set_state};
use super::rows::{
    ROLLOUT_COLS, active_rollout, all, get_model, get_revision, get_rollout, rollout_row,
};
use super::store::SqlStore;
use crate::{Result, RevisionState, RolloutRecord, StoreError, TransitionWrite};

pub(super) fn create_rollout(
    store: &SqlStore,
    model: &str,
    candidate: &str,
    plan: &Plan,
    actor: &str,
) -> Result<RolloutRecord> {
    plan.validate()
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    store.write(|db, now| {
        let m = get_model(db, model)?;
        let rev = revision_of(db, model, candidate)?;
        let Some(champion) = m.champion.clone() else {
            return Err(StoreError::Conflict(format!(
                "model {model:?} has no champion yet; set one first"
            )));
        };
        if champion == candidate {
            return Err(StoreError::Conflict(format!(
                "revision {candidate} is already the champion of {model:?}"
            )));
        }
        not_blocked(&rev)?;
        // Labels join answers the gateway read: a JSON model must say where
        // its predictions are, or every quality gate would time out.
        if plan.gates.quality.enabled && (m.spec.data_plane.is_some() || !plan.mode.is_enforce())
        {
            return Err(StoreError::Invalid(
                "plan.gates.quality: labels are judged on the answers rollgate's gateways \
                 serve; a dry run (mode = \"observe\") or a model on another data plane \
                 serves none in CANARY stages"
                    .into(),
            ));
        }
        if plan.gates.quality.enabled
            && m.spec.protocol == rollgate_core::Protocol::Json
            && m.spec.output_pointer.is_none()
        {
            return Err(StoreError::Invalid(format!(
                "plan.gates.quality: model {model:?} is generic JSON without an \
                 output_pointer, so its predictions are not read and no label could \
                 judge them; set the model's output_pointer"
            )));
        }
        if let Some(id) = active_rollout(db, model)? {
            return Err(StoreError::Conflict(format!(
                "rollout {id} is already active on model {model:?}"
            )));
        }
        let spec = RolloutSpec {
            model: model.to_string(),
            champion,
            candidate: candidate.to_string(),
            plan: plan.clone(),
        };
        let state = RolloutState::new(now);
        set_state(db, candidate, RevisionState::Candidate)?;
        let id = db
            .row(
                "INSERT INTO rollouts (model, spec, state, phase, active, routing, version, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, 1, ?5, 0, ?6, ?6) RETURNING id",
                p![
                    model,
                    serde_json::to_string(&spec)?,
                    serde_json::to_string(&state)?,
                    state.phase.name(),
                    serde_json::to_string(&Routing::CHAMPION_ONLY)?,
                    now.0
                ],
            )?
            .ok_or_else(|| StoreError::Database("INSERT returned no id".into()))?
            .i64(0)?;
        routes_changed(db);
        append_audit(
            db,
            now,
            actor,
            model,
            Some(id),
            "rollout_created",
            serde_json::json!({ "champion": spec.champion, "candidate": candidate, "plan": plan }),
        )?;
        get_rollout(db, id)
    })
}

pub(super) fn rollout(store: &SqlStore, id: i64) -> Result<RolloutRecord> {
    store.read_one(|db| get_rollout(db, id))
}

pub(super) fn rollouts(store: &SqlStore, active_only: bool) -> Result<Vec<RolloutRecord>> {
    store.read_one(|db| {
        let rows = db.rows(
            &format!(
                "SELECT {ROLLOUT_COLS} FROM rollouts WHERE (?1 = 0 OR active = 1) ORDER BY id DESC"
            ),
            p![active_only],
        )?;
        all(rows, rollout_row)
    })
}

/// Commits one transition, grouped with whatever concurrent ones are
/// queued (see `group_commit.rs`).
pub(super) fn apply(store: &SqlStore, write: &TransitionWrite) -> Result<RolloutRecord> {
    store
        .group
        .apply(write, |writes| commit_group(store, writes))
}

/// Commits a group of transitions in one transaction; a group is
/// all-or-nothing, so when that fails (one version conflict, say) each is
/// applied on its own and gets its own answer.
fn commit_group(store: &SqlStore, writes: &[TransitionWrite]) -> Vec<Result<RolloutRecord>> {
    let one = |w: &TransitionWrite| store.write(|db, now| apply_in(db, now, w));
    if writes.len() > 1
        && let Ok(records) = apply_batch(store, writes)
    {
        return records.into_iter().map(Ok).collect();
    }
    writes.iter().map(one).collect()
}

/// Commits `writes` in one transaction, all or none.
pub(super) fn apply_batch(
    store: &SqlStore,
    writes: &[TransitionWrite],
) -> Result<Vec<RolloutRecord>> {
    store.write(|db, now| {
        prefetch_rollouts(db, writes)?;
        writes.iter().map(|w| apply_in(db, now, w)).collect()
    })
}

/// One read for a batch's rollouts, kept in the transaction's memo for
/// [`apply_in`] (a rollout twice in a batch is read again after its first
/// write).
fn prefetch_rollouts(db: &mut dyn Db, writes: &[TransitionWrite]) -> Result<()> {
    let mut ids: Vec<i64> = writes.iter().map(|w| w.rollout).collect();
    ids.sort_unstable();
    ids.dedup();
    for chunk in ids.chunks(100) {
        let ps: Vec<String> = (1..=chunk.len()).map(|i| format!("?{i}")).collect();
        let params: Vec<Val> = chunk.iter().map(|&id| Val::from(id)).collect();
        let rows = db.rows(
            &format!(
                "SELECT {ROLLOUT_COLS} FROM rollouts WHERE id IN ({})",
                ps.join(", ")
            ),
            &params,
        )?;
        for r in all(rows, rollout_row)? {
            db.memo().rollouts.insert(r.id, r);
        }
    }
    Ok(())
}

/// Commits one transition inside the write: the fence and the version are
/// checked first, then each effect lands in order, then the rollout's row
/// takes the new state, routing and version.
fn apply_in(db: &mut dyn Db, now: Timestamp, w: &TransitionWrite) -> Result<RolloutRecord> {
    if let Some(fence) = &w.fence {
        check_fence(db, fence)?;
    }
    let current = expected_rollout(db, w)?;
    let mut routing = current.routing;
    for effect in w.effects {
        if let Some(changed) = apply_effect(db, now, w, &current.spec, effect)? {
            routing = changed;
        }
    }
    let terminal = w.state.phase.is_terminal();
    if terminal {
        // An aborted rollout frees its candidate; promoted and rejected ones
        // were moved by their effects.
        db.exec(
            "UPDATE revisions SET state = 'available' WHERE id = ?1 AND state = 'candidate'",
            p![&current.spec.candidate],
        )?;
    }
    let version = current.version + 1;
    store_transition(db, now, w, &routing, version)?;
    // What gateways route: the routing, the champion (promotion), the
    // candidate while active (rejection, the end of the rollout).
    if routing != current.routing
        || terminal
        || w.effects.iter().any(|e| {
            matches!(
                e,
                Effect::PromoteCandidate | Effect::RejectCandidate | Effect::RestoreChampion
            )
        })
    {
        routes_changed(db);
    }
    Ok(RolloutRecord {
        state: w.state.clone(),
        routing,
        version,
        updated_at: now,
        ..current
    })
}

/// The rollout as the transition found it (the batch's read, or read now),
/// if it is still at the version the transition was computed from.
fn expected_rollout(db: &mut dyn Db, w: &TransitionWrite) -> Result<RolloutRecord> {
    let current = match db.memo().rollouts.remove(&w.rollout) {
        Some(prefetched) => prefetched,
        None => get_rollout(db, w.rollout)?,
    };
    if current.version != w.expected_version {
        return Err(StoreError::VersionConflict {
            id: w.rollout,
            expected: w.expected_version,
            found: current.version,
        });
    }
    Ok(current)
}

/// Lands one effect; returns the routing it sets, if it sets one.
fn apply_effect(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    spec: &RolloutSpec,
    effect: &Effect,
) -> Result<Option<Routing>> {
    match effect {
        Effect::SetRouting { routing } => return Ok(Some(*routing)),
        Effect::PromoteCandidate => {
            promote_candidate(db, now, w, spec)?;
            return Ok(Some(Routing::CHAMPION_ONLY));
        }
        Effect::RejectCandidate => reject_candidate(db, now, w, spec)?,
        Effect::RestoreChampion => restore_champion(db, now, w, spec)?,
        Effect::Audit { event } => record_event(db, now, w, spec, event)?,
    }
    Ok(None)
}

/// The candidate becomes the champion (the old one archived).
fn promote_candidate(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    spec: &RolloutSpec,
) -> Result<()> {
    let model = get_model(db, &spec.model)?;
    champion_of_rollout(db, now, w, &model, &spec.candidate)
}

/// The previous champion is champion again (the candidate, promoted when
/// the watch began, archived) — only while the candidate is still the
/// model's champion: a champion an operator set meanwhile stays.
fn restore_champion(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    spec: &RolloutSpec,
) -> Result<()> {
    let model = get_model(db, &spec.model)?;
    if model.champion.as_deref() != Some(spec.candidate.as_str()) {
        return Ok(());
    }
    champion_of_rollout(db, now, w, &model, &spec.champion)
}

/// `to` becomes `model`'s champion by the rollout's decision.
fn champion_of_rollout(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    model: &crate::Model,
    to: &str,
) -> Result<()> {
    let body = serde_json::json!({ "from": model.champion, "to": to, "rollout": w.rollout });
    promote_in(db, now, model, to, w.actor, body, Some(w.rollout))
}

/// The candidate is rejected and blocked until an operator unblocks it.
fn reject_candidate(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    spec: &RolloutSpec,
) -> Result<()> {
    db.exec(
        "UPDATE revisions SET state = 'rejected', rejections = rejections + 1, blocked = 1
                     WHERE id = ?1",
        p![&spec.candidate],
    )?;
    let rev = get_revision(db, &spec.candidate)?;
    append_audit(
        db,
        now,
        w.actor,
        &spec.model,
        Some(w.rollout),
        "revision_rejected",
        serde_json::json!({ "revision": rev.id, "rejections": rev.rejections }),
    )
}

/// The state machine's event, as an audit record of its kind.
fn record_event(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    spec: &RolloutSpec,
    event: &AuditEvent,
) -> Result<()> {
    let kind = serde_json::to_value(event.kind)?;
    let kind = kind.as_str().unwrap_or("event").to_string();
    append_audit(
        db,
        now,
        w.actor,
        &spec.model,
        Some(w.rollout),
        &kind,
        serde_json::to_value(event)?,
    )
}

/// The rollout's row takes the transition's state, routing and version.
fn store_transition(
    db: &mut dyn Db,
    now: Timestamp,
    w: &TransitionWrite,
    routing: &Routing,
    version: u64,
) -> Result<()> {
    db.exec(
        "UPDATE rollouts SET state = ?2, phase = ?3, active = ?4, routing = ?5, version = ?6, updated_at = ?7
         WHERE id = ?1",
        p![
            w.rollout,
            serde_json::to_string(w.state)?,
            w.state.phase.name(),
            !w.state.phase.is_terminal(),
            serde_json::to_string(routing)?,
            version,
            now.0
        ],
    )?;
    Ok(())
}
