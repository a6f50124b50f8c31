//! The rollout state machine: `PENDING -> SHADOW -> CANARY(i) -> PROMOTED`
//! (through `WATCHING` when the plan has a watch after promotion), or
//! `ROLLED_BACK(reason)`, or `ABORTED`; `paused` is a flag.
//!
//! [`step`] is a pure function of the plan, the state, one input and `now`.
//! Its effects are data (set routing, promote, reject, audit) that the
//! controller applies; the state is small and serialisable, so a rollout is a
//! durable record that any controller can resume.
//!
//! Each stage judges the window since its own clock started (its baseline
//! snapshot): candidate and champion over the same requests and time.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod state;

pub use state::{
    AuditedEvaluation, Awaiting, EPOCHS_TIMED, EVALUATION_SUMMARY_EVERY, Phase, RolloutSpec,
    RolloutState, Routing, StageClock, gates_fingerprint,
};

use crate::exposure::{Exposure, StaleSeries};
use crate::gate::Outcome;
use crate::plan::{ApprovalPoint, Mode, OnDeadline, Plan, Policy};
use crate::policy::sequential::{self, SequentialState};
use crate::policy::windowed::WindowedTests;
use crate::policy::{self, LookInput, Next, PolicyTests};
use crate::snapshot::Snapshot;
use crate::stage::{RollbackReason, StageKind, StageReason, StageVerdict};
use crate::types::{Epoch, Timestamp};

/// What the controller saw on one pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    /// The candidate's readiness probe passed.
    pub candidate_ready: bool,
    /// What the gateways that answered reported, per series and routing
    /// epoch; `None` if none answered.
    pub exposure: Option<Exposure>,
    /// Routing applied by an external data plane (an adapter): the latest
    /// epoch of this rollout it confirmed (0: none yet). `None`: routing is
    /// rollgate's own gateways', which count each request under the epoch
    /// it arrived in, so nothing waits for a confirmation.
    pub routing_applied: Option<Epoch>,
    /// The rollout's recorded predictions with their labels, read when its
    /// plan has a quality gate (`None`: not asked for, or not readable).
    /// (Shared: a caller that keeps them, as the simulator does, passes
    /// them each look without a copy.)
    pub labels: Option<std::sync::Arc<Vec<crate::labels::Recorded>>>,
}

/// Something an operator asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum OperatorAction {
    Pause,
    Resume,
    Abort {
        reason: String,
    },
    /// Promote now, skipping the remaining stages; the reason is required.
    Promote {
        reason: String,
    },
    /// Approve the step the rollout waits for; the reason is required.
    Approve {
        reason: String,
    },
}

/// One input to the state machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Observe(Observation),
    Operator {
        actor: String,
        action: OperatorAction,
    },
}

/// Who caused an audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Actor {
    Controller,
    Operator { name: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// The candidate became ready and the first stage started.
    Started,
    /// A stage was judged.
    Evaluated,
    /// A stage passed and the next began.
    Advanced,
    Promoted,
    RolledBack,
    Paused,
    Resumed,
    Aborted,
    /// A stage passed and the next step waits for a person's approval.
    AwaitingApproval,
    /// An operator approved the step the rollout waited for.
    Approved,
    /// The watch after promotion ended without a regression shown: the
    /// promotion is final.
    WatchEnded,
}

/// An audit record, before the store gives it a sequence number and hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEvent {
    pub kind: AuditKind,
    pub actor: Actor,
    pub from: Phase,
    pub to: Phase,
    pub verdict: Option<Arc<StageVerdict>>,
    /// Operator's reason, or the controller's explanation.
    pub note: Option<String>,
    /// A dry run's decision (plan `mode = "observe"`): recorded, not taken.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// What the controller must do, in order. Routing returns to the champion
/// before a rollout is marked rolled back: `SetRouting` comes first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    SetRouting {
        routing: Routing,
    },
    /// The candidate becomes champion; the old champion is archived.
    PromoteCandidate,
    /// The candidate is marked REJECTED.
    RejectCandidate,
    /// The previous champion (the rollout's `champion`) is champion again
    /// and the candidate, promoted when the watch began, steps down: a
    /// regression shown in the watch, or an abort. Lands only while the
    /// candidate is still the model's champion.
    RestoreChampion,
    Audit {
        event: Box<AuditEvent>,
    },
}

/// The new state and the effects to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub state: RolloutState,
    pub effects: Vec<Effect>,
}

/// An operator action that does not apply to the rollout's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("rollout is already {phase}")]
    Terminal { phase: &'static str },
    #[error("rollout is already paused")]
    AlreadyPaused,
    #[error("rollout is not paused")]
    NotPaused,
    #[error("{action} requires a non-empty reason")]
    ReasonRequired { action: &'static str },
    #[error("the rollout is not waiting for an approval")]
    NothingToApprove,
    #[error("a dry run (mode = \"observe\") cannot promote: abort it and start a rollout")]
    DryRunCannotPromote,
}

/// Advances a rollout by one input. Pure: no clock, no I/O.
pub fn step(
    spec: &RolloutSpec,
    state: &RolloutState,
    input: Input,
    now: Timestamp,
) -> Result<Transition, StepError> {
    let mut t = Transition {
        state: state.clone(),
        effects: Vec::new(),
    };
    match input {
        Input::Observe(obs) => observe(spec, &mut t, obs, now),
        Input::Operator { actor, action } => {
            if spec.plan.mode == Mode::Observe && matches!(action, OperatorAction::Promote { .. }) {
                return Err(StepError::DryRunCannotPromote);
            }
            operate(spec, &mut t, actor, action, now)?
        }
    }
    if spec.plan.mode == Mode::Observe {
        dry_run(state, &mut t);
    }
    Ok(t)
}

/// A dry run's transition: the enforcing one with its consequences taken
/// out. The decisions (phases, verdicts, audit records) are the same; the
/// candidate never serves a user — a live share becomes a mirrored one of
/// the same size, and a "promotion" routes everything back to the
/// champion — and the registry is never touched (no promotion, no
/// rejection). Every audit record says it was a dry run.
fn dry_run(before: &RolloutState, t: &mut Transition) {
    let promoted_now = matches!(t.state.phase, Phase::Promoted { .. })
        && !matches!(before.phase, Phase::Promoted { .. });
    let mut effects = Vec::with_capacity(t.effects.len() + 1);
    for effect in t.effects.drain(..) {
        match effect {
            Effect::PromoteCandidate | Effect::RejectCandidate | Effect::RestoreChampion => {}
            Effect::SetRouting { routing } => effects.push(Effect::SetRouting {
                routing: Routing {
                    candidate_weight_bp: 0,
                    mirror_bp: routing.mirror_bp.max(routing.candidate_weight_bp),
                    ..routing
                },
            }),
            Effect::Audit { mut event } => {
                if promoted_now && event.kind == AuditKind::Promoted {
                    // Routing returns to the champion before the record.
                    effects.push(Effect::SetRouting {
                        routing: Routing::CHAMPION_ONLY,
                    });
                }
                event.dry_run = true;
                effects.push(Effect::Audit { event });
            }
        }
    }
    t.effects = effects;
}

fn audit(
    t: &mut Transition,
    kind: AuditKind,
    actor: Actor,
    from: Phase,
    verdict: Option<Arc<StageVerdict>>,
    note: Option<String>,
) {
    let to = t.state.phase.clone();
    t.effects.push(Effect::Audit {
        event: Box::new(AuditEvent {
            kind,
            actor,
            from,
            to,
            verdict,
            note,
            dry_run: false,
        }),
    });
}

/// The phase after `phase` passes; `None` means promote.
fn next_phase(plan: &Plan, phase: &Phase) -> Option<Phase> {
    let i = match phase {
        Phase::Pending if plan.shadow.enabled => return Some(Phase::Shadow),
        Phase::Pending | Phase::Shadow => 0,
        Phase::Canary { step, .. } => step + 1,
        _ => return None,
    };
    plan.steps.get(i).map(|&w| Phase::Canary {
        step: i,
        weight_percent: w,
    })
}

fn enter(
    spec: &RolloutSpec,
    t: &mut Transition,
    next: Phase,
    baseline: Option<Snapshot>,
    now: Timestamp,
) {
    t.state.phase = next;
    t.state.begin_epoch(now);
    t.state.stage_starts.push(t.state.epoch);
    t.state.stage = Some(StageClock::new(now, t.state.epoch));
    if spec.plan.policy == Policy::Windowed {
        t.state.tests = Some(PolicyTests::Windowed(WindowedTests::starting_at(baseline)));
    }
    t.effects.push(Effect::SetRouting {
        routing: Routing {
            epoch: t.state.epoch,
            ..Routing::for_phase(&spec.plan, &t.state.phase)
        },
    });
}

/// Counts one evaluation, and audits it when it says something new (its
/// outcome or reason changed, or it carries a note) or a summary is due;
/// decisions are always audited in full by their own records. Returns the
/// phase it judged.
fn record_evaluation(
    t: &mut Transition,
    verdict: StageVerdict,
    note: Option<String>,
    now: Timestamp,
) -> (Phase, Arc<StageVerdict>) {
    t.state.evaluations += 1;
    let verdict = Arc::new(verdict);
    t.state.last_verdict = Some(Arc::clone(&verdict));
    let phase = t.state.phase.clone();
    let said = format!(
        "{:?}/{}/{}",
        verdict.outcome,
        verdict.reason.code(),
        verdict
            .confirmation
            .as_ref()
            .map_or(0, |c| c.consecutive_breaches)
    );
    let (due, alike) = match &mut t.state.audited {
        None => (true, 0),
        Some(a) => {
            // A failing look is news (it decides), but not again and again
            // while a pause holds the rollout on it.
            let failing = verdict.outcome == Outcome::Fail && !t.state.paused;
            let news = a.said != said || note.is_some() || failing;
            let summary = !news && now.since(a.at) >= EVALUATION_SUMMARY_EVERY;
            let moved = summary && gates_fingerprint(&verdict) != a.gates;
            if summary && !moved {
                // Nothing to say: look again in a summary's time, not at
                // every look (the fingerprint is not free).
                a.at = now;
            }
            (news || moved, t.state.evaluations - a.evaluation - 1)
        }
    };
    if due {
        let summary =
            (alike > 0).then(|| format!("{alike} evaluations alike since the last record"));
        let note = match (note, summary) {
            (Some(n), Some(s)) => Some(format!("{n}; {s}")),
            (n, s) => n.or(s),
        };
        t.state.audited = Some(AuditedEvaluation {
            at: now,
            evaluation: t.state.evaluations,
            said,
            gates: gates_fingerprint(&verdict),
        });
        audit(
            t,
            AuditKind::Evaluated,
            Actor::Controller,
            phase.clone(),
            Some(Arc::clone(&verdict)),
            note,
        );
    }
    (phase, verdict)
}

/// A stage passed: enter the next one, or promote after the last.
fn advance(
    spec: &RolloutSpec,
    t: &mut Transition,
    phase: Phase,
    verdict: Arc<StageVerdict>,
    current: Option<Snapshot>,
    now: Timestamp,
) {
    let next = next_phase(&spec.plan, &phase);
    let point = match &next {
        Some(Phase::Canary { weight_percent, .. }) => ApprovalPoint::Weight(*weight_percent),
        _ => ApprovalPoint::PROMOTION,
    };
    if spec.plan.approval_before(point).is_some()
        && !t.state.approved.contains(&point)
        && spec.plan.mode != Mode::Observe
    {
        // The stage passed; what comes next waits for a person.
        if t.state.awaiting.is_none() {
            t.state.awaiting = Some(Awaiting {
                before: point,
                since: now,
                deadline_passed: false,
            });
            audit(
                t,
                AuditKind::AwaitingApproval,
                Actor::Controller,
                phase,
                Some(verdict),
                Some(format!("waiting for an operator to approve {point}")),
            );
        }
        return;
    }
    t.state.awaiting = None;
    match next {
        Some(next) => {
            enter(spec, t, next, current, now);
            audit(
                t,
                AuditKind::Advanced,
                Actor::Controller,
                phase,
                Some(verdict),
                None,
            );
        }
        None => promote(spec, t, Actor::Controller, false, Some(verdict), None, now),
    }
}

fn roll_back(
    plan: &Plan,
    t: &mut Transition,
    reason: RollbackReason,
    verdict: Option<Arc<StageVerdict>>,
) {
    let from = t.state.phase.clone();
    let rejects = reason.rejects(plan);
    t.state.awaiting = None;
    t.state.phase = Phase::RolledBack { reason };
    t.effects.push(Effect::SetRouting {
        routing: Routing::CHAMPION_ONLY,
    });
    // Rolled back after promotion: the previous champion serves again.
    let watched = matches!(from, Phase::Watching { .. });
    if watched {
        t.effects.push(Effect::RestoreChampion);
    }
    if rejects {
        t.effects.push(Effect::RejectCandidate);
    }
    let note = match (watched, rejects) {
        (false, true) => "candidate rejected: it was shown worse or never became ready",
        (false, false) => {
            "candidate not rejected: no regression was shown; it may be rolled out again"
        }
        (true, true) => {
            "after promotion: the previous champion is champion again; the candidate rejected"
        }
        (true, false) => {
            "after promotion: the previous champion is champion again; the candidate not rejected"
        }
    };
    audit(
        t,
        AuditKind::RolledBack,
        Actor::Controller,
        from,
        verdict,
        Some(note.to_string()),
    );
}

/// The candidate becomes champion: the rollout ends, or, when the plan
/// has a watch, watches it against the previous champion (mirrored) on
/// labels for the watch's window.
fn promote(
    spec: &RolloutSpec,
    t: &mut Transition,
    actor: Actor,
    manual: bool,
    verdict: Option<Arc<StageVerdict>>,
    note: Option<String>,
    now: Timestamp,
) {
    let from = t.state.phase.clone();
    t.effects.push(Effect::PromoteCandidate);
    if spec.plan.watch.is_off() || spec.plan.mode == Mode::Observe {
        t.state.phase = Phase::Promoted { manual };
    } else {
        t.state.phase = Phase::Watching { manual, since: now };
        t.state.begin_epoch(now);
        t.state.stage = Some(StageClock::new(now, t.state.epoch));
        t.effects.push(Effect::SetRouting {
            routing: Routing {
                epoch: t.state.epoch,
                ..Routing::for_phase(&spec.plan, &t.state.phase)
            },
        });
    }
    audit(t, AuditKind::Promoted, actor, from, verdict, note);
}

/// One look in the watch after promotion: the labels judge the promoted
/// revision against the previous champion; a regression shown restores the
/// previous champion, and the window's end makes the promotion final (a
/// pause holds the end, not a rollback).
fn watch(spec: &RolloutSpec, t: &mut Transition, obs: Observation, now: Timestamp) {
    let Phase::Watching { manual, since } = t.state.phase else {
        return;
    };
    // The gateways' counts are read as in a stage (nothing judges them
    // here), so each gateway sees the controller is following its series.
    if let Some(e) = obs.exposure.as_ref().filter(|e| e.stale.is_none()) {
        t.state.evidence.absorb(e, t.state.epoch, now);
    }
    let labels = obs.labels.as_deref().map(Vec::as_slice);
    let verdict = sequential::watch_verdict(
        &spec.plan,
        labels,
        (&spec.champion, &spec.candidate),
        (now, now.since(since)),
    );
    let (_, verdict) = record_evaluation(t, verdict, None, now);
    if verdict.outcome == Outcome::Fail {
        // A regression shown rolls back, paused or not (as a breach does
        // in a stage).
        let reason = RollbackReason::WatchRegression {
            gates: vec![crate::gate::GateKind::Quality],
        };
        roll_back(&spec.plan, t, reason, Some(verdict));
    } else if now.since(since) >= spec.plan.watch.window && !t.state.paused && labels.is_some() {
        // The window's end, judged on labels that could be read: then the
        // promotion is final. A pause holds it.
        finish_watch(t, manual, Actor::Controller, Some(verdict), None);
    }
}

/// The watch ends with the promotion kept.
fn finish_watch(
    t: &mut Transition,
    manual: bool,
    actor: Actor,
    verdict: Option<Arc<StageVerdict>>,
    note: Option<String>,
) {
    let from = t.state.phase.clone();
    t.state.phase = Phase::Promoted { manual };
    t.effects.push(Effect::SetRouting {
        routing: Routing::CHAMPION_ONLY,
    });
    audit(t, AuditKind::WatchEnded, actor, from, verdict, note);
}

fn observe(spec: &RolloutSpec, t: &mut Transition, obs: Observation, now: Timestamp) {
    if let Some(legacy) = t.state.legacy_sequential.take() {
        t.state.tests.get_or_insert(PolicyTests::Sequential(legacy));
    }
    if t.state.phase.is_terminal() {
        return;
    }
    if t.state.phase == Phase::Pending {
        return start_when_ready(spec, t, &obs, now);
    }
    if matches!(t.state.phase, Phase::Watching { .. }) {
        return watch(spec, t, obs, now);
    }
    if approval_deadline_rolled_back(&spec.plan, t, now) {
        return;
    }
    let Some(kind) = t.state.phase.stage_kind() else {
        return;
    };
    if let Some(applied) = obs.routing_applied
        && !routing_confirmed(&spec.plan, t, applied, now)
    {
        return;
    }
    look(spec, t, obs, kind, now);
}

/// A pending rollout starts its first stage once the candidate is ready,
/// and rolls back if it is not by the readiness timeout (a pause holds it).
fn start_when_ready(spec: &RolloutSpec, t: &mut Transition, obs: &Observation, now: Timestamp) {
    let plan = &spec.plan;
    if t.state.paused {
        return;
    }
    if obs.candidate_ready {
        let next = next_phase(plan, &Phase::Pending).unwrap_or(Phase::Shadow);
        if plan.policy == Policy::Sequential {
            t.state.tests = Some(PolicyTests::Sequential(SequentialState::default()));
        }
        // What was counted before the first stage is not the rollout's.
        if let Some(e) = &obs.exposure {
            t.state.evidence.baseline(e);
        }
        let baseline = obs.exposure.as_ref().map(|_| Snapshot::default());
        enter(spec, t, next, baseline, now);
        audit(
            t,
            AuditKind::Started,
            Actor::Controller,
            Phase::Pending,
            None,
            None,
        );
    } else if now.since(t.state.created_at) >= plan.readiness_timeout {
        roll_back(plan, t, RollbackReason::ReadinessTimeout, None);
    }
}

/// An approval whose deadline passed: held (said once) or rolled back, as
/// the plan says. True when it rolled back.
fn approval_deadline_rolled_back(plan: &Plan, t: &mut Transition, now: Timestamp) -> bool {
    if let Some(a) = t.state.awaiting.clone()
        && let Some(deadline) = plan.approval_before(a.before).and_then(|s| s.deadline)
        && !a.deadline_passed
        && !t.state.paused
        && now.since(a.since) >= deadline
    {
        match plan.approval_before(a.before).map(|s| s.on_deadline) {
            Some(OnDeadline::Hold) => {
                t.state.awaiting = Some(Awaiting {
                    deadline_passed: true,
                    ..a
                });
                let phase = t.state.phase.clone();
                audit(
                    t,
                    AuditKind::AwaitingApproval,
                    Actor::Controller,
                    phase,
                    None,
                    Some(format!(
                        "the approval deadline for {} passed; holding until an operator approves",
                        a.before
                    )),
                );
            }
            _ => {
                t.state.awaiting = None;
                roll_back(
                    plan,
                    t,
                    RollbackReason::ApprovalTimeout { before: a.before },
                    None,
                );
                return true;
            }
        }
    }
    false
}

/// One look at a stage: the new counts go into the rollout's ledger, the
/// plan's policy judges them, and the state machine does what it says.
fn look(spec: &RolloutSpec, t: &mut Transition, obs: Observation, kind: StageKind, now: Timestamp) {
    let plan = &spec.plan;
    // Counts that stopped before the look (a series gone stale) are no
    // evidence for it: the look runs as if no stats came (it waits, and
    // fails safe at the deadline), saying which series stopped.
    let stale = obs.exposure.as_ref().and_then(|e| e.stale.clone());
    let obs = match stale {
        Some(_) => Observation {
            exposure: None,
            ..obs
        },
        None => obs,
    };
    // Every series' new counts, per epoch of arrival; the champion's recent
    // counts for outage detection.
    let increments = obs.exposure.as_ref().map(|e| {
        let new = t.state.evidence.absorb(e, t.state.epoch, now);
        let (mut requests, mut failures) = (0, 0);
        for inc in new.values() {
            let h = inc.revision(&spec.champion);
            requests += h.requests();
            failures += h.failure_count();
        }
        let window = plan.outage_window.as_millis() as u64;
        t.state
            .evidence
            .note_champion(now, requests, failures, window);
        new
    });
    let state = &mut t.state;
    let epoch = state.epoch;
    let clock = state
        .stage
        .get_or_insert_with(|| StageClock::new(now, epoch));
    let (started, stage_epoch) = (clock.started_at, clock.epoch);
    let floor_epoch = clock.floor_epoch.unwrap_or(stage_epoch);
    let judged = policy::look(
        plan,
        &mut state.tests,
        &LookInput {
            stage: kind,
            evidence: increments.as_ref().map(|inc| (&state.evidence, inc)),
            stage_starts: &state.stage_starts,
            epoch,
            stage_epoch,
            floor_epoch,
            champion: &spec.champion,
            candidate: &spec.candidate,
            elapsed: now.since(started),
            now,
            paused: state.paused,
            labels: obs.labels.as_deref().map(Vec::as_slice),
        },
    );
    let verdict = named_stale(judged.verdict, stale.as_ref());
    let (phase, verdict) = record_evaluation(t, verdict, judged.note, now);
    match judged.next {
        Next::Stay => {}
        Next::NewEpoch => restart_epoch(plan, t, now),
        Next::RollBack(reason) => roll_back(plan, t, reason, Some(verdict)),
        Next::Advance { fresh_counts } => {
            let baseline = fresh_counts.then(Snapshot::default);
            advance(spec, t, phase, verdict, baseline, now);
        }
    }
}

/// A look without stats because a series stopped says which one.
fn named_stale(mut verdict: StageVerdict, stale: Option<&StaleSeries>) -> StageVerdict {
    if let Some(s) = stale
        && verdict.reason == StageReason::StatsUnavailable
    {
        verdict.reason = StageReason::EvidenceStale {
            revision: s.revision.clone(),
            series: s.series.clone(),
        };
    }
    verdict
}

/// Whether the external data plane applies the current epoch's routing,
/// given the latest epoch it confirmed. At the first look that sees it
/// confirmed, the epoch (and a stage entered with it) starts its clock:
/// nothing before counts for it, since the split it judges was not yet in
/// force. Unconfirmed past the stage's evidence timeout: rolled back (the
/// adapter returns the data plane to the champion first).
fn routing_confirmed(plan: &Plan, t: &mut Transition, applied: Epoch, now: Timestamp) -> bool {
    let epoch = t.state.epoch;
    if t.state.confirmed_epoch >= epoch {
        return true;
    }
    if applied >= epoch {
        t.state.confirmed_epoch = epoch;
        t.state.epoch_began.insert(epoch, now);
        if let Some(clock) = t.state.stage.as_mut()
            && clock.epoch == epoch
        {
            clock.started_at = now;
        }
        return true;
    }
    let sent = t.state.epoch_began.get(&epoch).copied().unwrap_or(now);
    if now.since(sent) >= plan.evidence_timeout {
        roll_back(plan, t, RollbackReason::RoutingNotApplied { epoch }, None);
    }
    false
}

/// A champion outage ended: the same split continues in a new routing
/// epoch, where a fresh component of the error e-process and the stage's
/// sample floors start (docs/statistics.md, "Outages").
fn restart_epoch(plan: &Plan, t: &mut Transition, now: Timestamp) {
    let state = &mut t.state;
    let epoch = state.begin_epoch(now);
    if let Some(PolicyTests::Sequential(seq)) = &mut state.tests
        && seq.restarts.len() < sequential::MAX_RESTARTS
    {
        seq.restarts.push(epoch);
    }
    if let Some(clock) = &mut state.stage {
        clock.floor_epoch = Some(epoch);
    }
    t.effects.push(Effect::SetRouting {
        routing: Routing {
            epoch,
            ..Routing::for_phase(plan, &state.phase)
        },
    });
}

fn operate(
    spec: &RolloutSpec,
    t: &mut Transition,
    actor: String,
    action: OperatorAction,
    now: Timestamp,
) -> Result<(), StepError> {
    if t.state.phase.is_terminal() {
        return Err(StepError::Terminal {
            phase: t.state.phase.name(),
        });
    }
    let from = t.state.phase.clone();
    let who = Actor::Operator { name: actor };
    match action {
        OperatorAction::Pause => {
            if t.state.paused {
                return Err(StepError::AlreadyPaused);
            }
            t.state.paused = true;
            audit(t, AuditKind::Paused, who, from, None, None);
        }
        OperatorAction::Resume => {
            if !t.state.paused {
                return Err(StepError::NotPaused);
            }
            t.state.paused = false;
            audit(t, AuditKind::Resumed, who, from, None, None);
        }
        OperatorAction::Promote { reason } if matches!(from, Phase::Watching { .. }) => {
            // The promotion made final before the watch's end.
            let reason = required(reason, "promote")?;
            let manual = matches!(from, Phase::Watching { manual: true, .. });
            finish_watch(t, manual, who, None, Some(reason));
        }
        OperatorAction::Abort { reason } => {
            let reason = required(reason, "abort")?;
            t.state.awaiting = None;
            t.state.phase = Phase::Aborted;
            t.effects.push(Effect::SetRouting {
                routing: Routing::CHAMPION_ONLY,
            });
            // Aborted after promotion: the previous champion serves again.
            if matches!(from, Phase::Watching { .. }) {
                t.effects.push(Effect::RestoreChampion);
            }
            audit(t, AuditKind::Aborted, who, from, None, Some(reason));
        }
        OperatorAction::Promote { reason } => {
            let reason = required(reason, "promote")?;
            t.state.awaiting = None;
            promote(spec, t, who, true, None, Some(reason), now);
        }
        OperatorAction::Approve { reason } => {
            let reason = required(reason, "approve")?;
            let Some(a) = t.state.awaiting.take() else {
                return Err(StepError::NothingToApprove);
            };
            t.state.approved.push(a.before);
            audit(
                t,
                AuditKind::Approved,
                who,
                from,
                None,
                Some(format!("{}: {reason}", a.before)),
            );
        }
    }
    Ok(())
}

fn required(reason: String, action: &'static str) -> Result<String, StepError> {
    let r = reason.trim();
    if r.is_empty() {
        Err(StepError::ReasonRequired { action })
    } else {
        Ok(r.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_beginnings_are_kept_for_the_latest_epochs_only() {
        let mut s = RolloutState::new(Timestamp(0));
        for i in 1..=20u64 {
            assert_eq!(s.begin_epoch(Timestamp(i * 1000)), i as Epoch);
        }
        assert_eq!(s.epoch_began.len(), EPOCHS_TIMED);
        assert_eq!(
            s.epoch_began.last_key_value(),
            Some((&20, &Timestamp(20_000)))
        );
        assert_eq!(s.epoch_began.first_key_value().map(|(e, _)| *e), Some(13));
    }
}
