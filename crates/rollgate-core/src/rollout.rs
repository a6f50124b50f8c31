//! The rollout state machine: `PENDING -> SHADOW -> CANARY(i) -> PROMOTED`,
//! or `ROLLED_BACK(reason)`, or `ABORTED`; `paused` is a flag.
//!
//! [`step`] is a pure function of the plan, the state, one input and `now`.
//! Its effects are data (set routing, promote, reject, audit) that the
//! controller applies; the state is small and serialisable, so a rollout is a
//! durable record that any controller can resume.
//!
//! Each stage judges the window since its own clock started (its baseline
//! snapshot): candidate and champion over the same requests and time.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::exposure::{Exposure, Ledger, StaleSeries};
use crate::gate::Outcome;
use crate::plan::{ApprovalPoint, Assignment, Mode, OnDeadline, Plan, Policy};
use crate::policy::sequential::{self, SequentialState};
use crate::policy::windowed::WindowedTests;
use crate::policy::{self, LookInput, Next, PolicyTests};
use crate::snapshot::Snapshot;
use crate::stage::{RollbackReason, StageKind, StageReason, StageVerdict};
use crate::types::{Epoch, Timestamp};

/// Where a rollout stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Created; waiting for the candidate to report ready. No traffic.
    Pending,
    /// Mirrored traffic only; zero live exposure.
    Shadow,
    /// Canary step `step` (0-based) of the plan, at `weight_percent`.
    Canary {
        step: usize,
        weight_percent: u32,
    },
    /// The candidate is the champion. `manual`: an operator promoted it.
    Promoted {
        manual: bool,
    },
    RolledBack {
        reason: RollbackReason,
    },
    Aborted,
}

impl Phase {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Phase::Promoted { .. } | Phase::RolledBack { .. } | Phase::Aborted
        )
    }

    /// Upper-case name for display and filtering: `CANARY` for every step.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Pending => "PENDING",
            Phase::Shadow => "SHADOW",
            Phase::Canary { .. } => "CANARY",
            Phase::Promoted { .. } => "PROMOTED",
            Phase::RolledBack { .. } => "ROLLED_BACK",
            Phase::Aborted => "ABORTED",
        }
    }

    fn stage_kind(&self) -> Option<StageKind> {
        match self {
            Phase::Shadow => Some(StageKind::Shadow),
            Phase::Canary { .. } => Some(StageKind::Canary),
            _ => None,
        }
    }
}

/// Traffic for the rollout's model, relative to its candidate, in basis
/// points (1/10,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Routing {
    /// Share of live requests the candidate serves.
    pub candidate_weight_bp: u32,
    /// Share of champion-served requests mirrored to the candidate.
    pub mirror_bp: u32,
    /// The rollout's routing epoch this routing starts (0: none). Gateways
    /// count each request under the epoch in force when it arrived.
    #[serde(default)]
    pub epoch: Epoch,
    /// Per key (sticky) or per request.
    #[serde(default, skip_serializing_if = "is_sticky")]
    pub assignment: Assignment,
    /// Candidate requests that cannot reach it go to the champion.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback_to_champion: bool,
}

fn is_sticky(a: &Assignment) -> bool {
    *a == Assignment::Sticky
}

impl Routing {
    /// Everything to the champion, nothing mirrored.
    pub const CHAMPION_ONLY: Routing = Routing {
        candidate_weight_bp: 0,
        mirror_bp: 0,
        epoch: 0,
        assignment: Assignment::Sticky,
        fallback_to_champion: false,
    };

    /// The routing a phase implies under `plan`.
    pub fn for_phase(plan: &Plan, phase: &Phase) -> Routing {
        match phase {
            Phase::Shadow => Routing {
                candidate_weight_bp: 0,
                mirror_bp: plan.shadow.mirror_percent * 100,
                epoch: 0,
                assignment: plan.assignment,
                fallback_to_champion: plan.fallback_to_champion,
            },
            Phase::Canary { weight_percent, .. } => Routing {
                candidate_weight_bp: weight_percent * 100,
                mirror_bp: 0,
                epoch: 0,
                assignment: plan.assignment,
                fallback_to_champion: plan.fallback_to_champion,
            },
            Phase::Promoted { .. } => Routing {
                candidate_weight_bp: 10_000,
                mirror_bp: 0,
                epoch: 0,
                assignment: plan.assignment,
                fallback_to_champion: plan.fallback_to_champion,
            },
            _ => Routing::CHAMPION_ONLY,
        }
    }
}

/// What a rollout is about. Immutable for the rollout's life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutSpec {
    pub model: String,
    pub champion: String,
    pub candidate: String,
    pub plan: Plan,
}

/// The clock of the current stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StageClock {
    pub started_at: Timestamp,
    /// The routing epoch the stage started in: its own evidence is that
    /// epoch's and any later one's.
    #[serde(default)]
    pub epoch: Epoch,
    /// The epoch from which the stage's sample floors count (after a
    /// champion outage: the epoch started when it ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_epoch: Option<Epoch>,
}

impl StageClock {
    fn new(started_at: Timestamp, epoch: Epoch) -> Self {
        StageClock {
            started_at,
            epoch,
            floor_epoch: None,
        }
    }
}

/// A rollout's mutable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutState {
    pub phase: Phase,
    pub paused: bool,
    pub created_at: Timestamp,
    pub stage: Option<StageClock>,
    /// The latest stage verdict, for status views.
    /// Shared with the evaluation's audit record (cloned on every look).
    pub last_verdict: Option<Arc<StageVerdict>>,
    pub evaluations: u64,
    /// The policy's test state (from the first stage on). Its shape is the
    /// policy's own and not part of the API's contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub tests: Option<PolicyTests>,
    /// The sequential state as rollouts stored it before the policies had
    /// one enum: read, moved into `tests` at the next look, never written.
    /// (A `windowed` rollout stored then kept its windows in its stage
    /// clock; they start again at the next look: evidence is lost, never
    /// invented.)
    #[doc(hidden)]
    #[serde(default, rename = "sequential", skip_serializing)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub legacy_sequential: Option<SequentialState>,
    /// The current routing epoch (0 before the first stage).
    #[serde(default)]
    pub epoch: Epoch,
    /// The first epoch of each stage entered, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_starts: Vec<Epoch>,
    /// When the latest epochs began (the last [`EPOCHS_TIMED`]): what
    /// evidence read by time rather than labelled by the gateway (scraped
    /// counters, [`crate::scraped`]) is windowed by.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, u64>))]
    pub epoch_began: BTreeMap<Epoch, Timestamp>,
    /// The latest epoch an external data plane confirmed it applied (0:
    /// none, or routing is rollgate's own gateways', which need no
    /// confirmation).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub confirmed_epoch: Epoch,
    /// Every gateway series' counts per epoch: the rollout's evidence. Its
    /// shape is not part of the API's contract.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub evidence: Ledger,
    /// The last evaluation written to the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audited: Option<AuditedEvaluation>,
    /// The approval the rollout waits for: its stage passed, and the plan
    /// wants a person to approve what comes next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting: Option<Awaiting>,
    /// The approval points operators approved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<ApprovalPoint>,
}

/// An approval a rollout waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Awaiting {
    pub before: ApprovalPoint,
    /// When its stage passed and the wait began.
    pub since: Timestamp,
    /// The step's deadline passed under `on_deadline = "hold"`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deadline_passed: bool,
}

/// An evaluation written to the audit log: evaluations that say the same
/// (outcome and reason) after it are summarised, not written one by one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditedEvaluation {
    pub at: Timestamp,
    /// Its number among the rollout's evaluations.
    pub evaluation: u64,
    /// Its outcome and reason code.
    pub said: String,
}

/// An evaluation that says what the last one written said is written at
/// most this often (as a summary); one that says something new, at once.
pub const EVALUATION_SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl RolloutState {
    /// Breaches awaiting confirmation in the current stage (`windowed`).
    pub fn unconfirmed_breaches(&self) -> Option<u32> {
        match &self.tests {
            Some(PolicyTests::Windowed(w)) => Some(w.consecutive_breaches),
            _ => None,
        }
    }

    pub fn new(created_at: Timestamp) -> Self {
        RolloutState {
            phase: Phase::Pending,
            paused: false,
            created_at,
            stage: None,
            last_verdict: None,
            evaluations: 0,
            tests: None,
            legacy_sequential: None,
            audited: None,
            epoch: 0,
            stage_starts: Vec::new(),
            epoch_began: BTreeMap::new(),
            confirmed_epoch: 0,
            evidence: Ledger::default(),
            awaiting: None,
            approved: Vec::new(),
        }
    }
}

fn is_zero(e: &Epoch) -> bool {
    *e == 0
}

/// How many epochs' beginnings a rollout keeps: evidence read by time
/// needs the current epoch's and the one before (whose tail may still be
/// scraped); a few more cost little.
pub const EPOCHS_TIMED: usize = 8;

impl RolloutState {
    /// Starts the next routing epoch at `now`.
    fn begin_epoch(&mut self, now: Timestamp) -> Epoch {
        self.epoch += 1;
        self.epoch_began.insert(self.epoch, now);
        while self.epoch_began.len() > EPOCHS_TIMED {
            self.epoch_began.pop_first();
        }
        self.epoch
    }
}

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
            operate(&mut t, actor, action)?
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
            Effect::PromoteCandidate | Effect::RejectCandidate => {}
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
    let (due, alike) = match &t.state.audited {
        None => (true, 0),
        Some(a) => (
            a.said != said
                || note.is_some()
                || verdict.outcome == Outcome::Fail
                || now.since(a.at) >= EVALUATION_SUMMARY_EVERY,
            t.state.evaluations - a.evaluation - 1,
        ),
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
        None => promote(t, Actor::Controller, false, Some(verdict), None),
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
    let note = if rejects {
        t.effects.push(Effect::RejectCandidate);
        "candidate rejected: it was shown worse or never became ready"
    } else {
        "candidate not rejected: no regression was shown; it may be rolled out again"
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

fn promote(
    t: &mut Transition,
    actor: Actor,
    manual: bool,
    verdict: Option<Arc<StageVerdict>>,
    note: Option<String>,
) {
    let from = t.state.phase.clone();
    t.state.phase = Phase::Promoted { manual };
    t.effects.push(Effect::PromoteCandidate);
    audit(t, AuditKind::Promoted, actor, from, verdict, note);
}

fn observe(spec: &RolloutSpec, t: &mut Transition, obs: Observation, now: Timestamp) {
    let plan = &spec.plan;
    if let Some(legacy) = t.state.legacy_sequential.take() {
        t.state.tests.get_or_insert(PolicyTests::Sequential(legacy));
    }
    if t.state.phase.is_terminal() {
        return;
    }
    if t.state.phase == Phase::Pending {
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
        return;
    }
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
                return roll_back(
                    plan,
                    t,
                    RollbackReason::ApprovalTimeout { before: a.before },
                    None,
                );
            }
        }
    }
    let Some(kind) = t.state.phase.stage_kind() else {
        return;
    };
    if let Some(applied) = obs.routing_applied
        && !routing_confirmed(plan, t, applied, now)
    {
        return;
    }
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

fn operate(t: &mut Transition, actor: String, action: OperatorAction) -> Result<(), StepError> {
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
        OperatorAction::Abort { reason } => {
            let reason = required(reason, "abort")?;
            t.state.awaiting = None;
            t.state.phase = Phase::Aborted;
            t.effects.push(Effect::SetRouting {
                routing: Routing::CHAMPION_ONLY,
            });
            audit(t, AuditKind::Aborted, who, from, None, Some(reason));
        }
        OperatorAction::Promote { reason } => {
            let reason = required(reason, "promote")?;
            t.state.awaiting = None;
            promote(t, who, true, None, Some(reason));
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
