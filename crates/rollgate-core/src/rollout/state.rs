//! What a rollout is between looks: its phase, the routing each phase asks
//! for, and the small, serialisable state any controller can resume from.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::exposure::Ledger;
use crate::plan::{ApprovalPoint, Assignment, Plan};
use crate::policy::PolicyTests;
use crate::policy::sequential::SequentialState;
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
    /// The candidate is the champion and serves every user; the previous
    /// champion answers mirrored copies, and the quality gate judges the
    /// two on labels until the plan's watch window from `since` ends.
    /// `manual`: an operator promoted it.
    Watching {
        manual: bool,
        since: Timestamp,
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
            Phase::Watching { .. } => "WATCHING",
            Phase::Promoted { .. } => "PROMOTED",
            Phase::RolledBack { .. } => "ROLLED_BACK",
            Phase::Aborted => "ABORTED",
        }
    }

    pub(super) fn stage_kind(&self) -> Option<StageKind> {
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

    /// The candidate's live share in percent while `phase` holds: all of
    /// the traffic while it is watched after promotion (the routing then
    /// mirrors the previous champion), else the routing's weight.
    pub fn live_percent(&self, phase: &Phase) -> u32 {
        match phase {
            Phase::Watching { .. } => 100,
            _ => self.candidate_weight_bp / 100,
        }
    }

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
            // The rollout's mirrored revision is now its previous champion
            // (what gateways route for a watching rollout: the store's).
            Phase::Watching { .. } => Routing {
                candidate_weight_bp: 0,
                mirror_bp: plan.watch.mirror_percent * 100,
                epoch: 0,
                assignment: plan.assignment,
                fallback_to_champion: false,
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
    pub(super) fn new(started_at: Timestamp, epoch: Epoch) -> Self {
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
    /// A fingerprint of its gates (verdicts and the evidence they read):
    /// a summary is written only if they moved since, so an idle rollout's
    /// looks, which all say the same, are not recorded again.
    #[serde(default)]
    pub gates: u64,
}

/// A fingerprint of what a verdict read, for [`AuditedEvaluation::gates`]:
/// its gates, the champion's health and its reason (but the time left of
/// a minimum duration, which moves at every look). Stable within a build;
/// after an upgrade at most one extra summary.
pub fn gates_fingerprint(v: &StageVerdict) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    let reason = match v.reason {
        StageReason::MinDuration { .. } => None,
        ref r => Some(r),
    };
    format!("{:?}{:?}{:?}", v.gates, v.champion, reason).hash(&mut h);
    h.finish()
}

/// An evaluation that says what the last one written said is written at
/// most this often (as a summary), and only if its gates moved; one that
/// says something new, at once.
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
    pub(super) fn begin_epoch(&mut self, now: Timestamp) -> Epoch {
        self.epoch += 1;
        self.epoch_began.insert(self.epoch, now);
        while self.epoch_began.len() > EPOCHS_TIMED {
            self.epoch_began.pop_first();
        }
        self.epoch
    }
}
