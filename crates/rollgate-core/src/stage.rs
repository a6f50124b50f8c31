//! What a stage's judgement is made of: its kind, its verdict and the
//! reason for it, the champion's health it was judged against, and why a
//! rollout rolled back. The verdict is decided by the one safety-model rule chain
//! ([`crate::safety`]) from the gate verdicts of the plan's policy
//! ([`crate::policy`]).

use serde::{Deserialize, Serialize};

use crate::gate::{GateKind, GateVerdict, Outcome};
use crate::plan::{ApprovalPoint, Plan, RejectOn};
use crate::stats::Interval;
use crate::types::Epoch;

/// Which kind of stage is being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// The candidate answers mirrored traffic; nobody sees its answers.
    Shadow,
    /// The candidate serves a share of live traffic.
    Canary,
    /// After promotion: the candidate serves everyone, the previous
    /// champion answers mirrored traffic (`Phase::Watching`).
    Watch,
}

/// Why the stage answered as it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum StageReason {
    StatsUnavailable,
    /// A series the look compares stopped before the look (a scrape target
    /// gone, a scrape paused): what it counted does not cover the look, so
    /// the stage waits, and fails safe at its deadline if it never returns.
    EvidenceStale {
        revision: String,
        series: String,
    },
    SharedOutage,
    Breach {
        gates: Vec<GateKind>,
    },
    MinDuration {
        remaining_ms: u64,
    },
    AwaitingEvidence {
        gates: Vec<GateKind>,
    },
    EvidenceTimeout {
        gates: Vec<GateKind>,
    },
    MetricsMissing {
        gates: Vec<GateKind>,
    },
    /// A sticky canary stage can never be judged per key: its weight gives
    /// the candidate on average fewer than half the keys a stage needs, of
    /// the `keys` the model's traffic carries (declared or estimated).
    /// Fails safe after the stage's minimum duration, not at its deadline.
    TooFewKeys {
        keys: u64,
        weight_percent: u32,
    },
    /// The quality gate still lacked labels (`min_labels`, or the labelled
    /// share `min_coverage` of the recorded pairs) at its label deadline.
    LabelTimeout {
        labelled: u64,
        recorded: u64,
    },
    /// Every gate showed the candidate within budget.
    AllGatesPass,
    /// The stage passed on time (`advance = "on_time"`): no gate showed a
    /// regression, but these gates did not show the candidate within
    /// budget either. Not a proof of non-inferiority.
    NoRegressionShown {
        gates: Vec<GateKind>,
    },
}

impl StageReason {
    /// A short stable code, for metrics labels and the CLI.
    pub fn code(&self) -> &'static str {
        match self {
            StageReason::StatsUnavailable => "stats_unavailable",
            StageReason::EvidenceStale { .. } => "evidence_stale",
            StageReason::SharedOutage => "shared_outage",
            StageReason::Breach { .. } => "breach",
            StageReason::MinDuration { .. } => "min_duration",
            StageReason::AwaitingEvidence { .. } => "awaiting_evidence",
            StageReason::EvidenceTimeout { .. } => "evidence_timeout",
            StageReason::MetricsMissing { .. } => "metrics_missing",
            StageReason::TooFewKeys { .. } => "too_few_keys",
            StageReason::LabelTimeout { .. } => "label_timeout",
            StageReason::AllGatesPass => "all_gates_pass",
            StageReason::NoRegressionShown { .. } => "no_regression_shown",
        }
    }
}

/// A stage's verdict: outcome, reason, and every gate's verdict as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StageVerdict {
    pub stage: StageKind,
    pub outcome: Outcome,
    pub reason: StageReason,
    /// A gross breach rolls back without waiting for confirmation.
    pub gross: bool,
    pub elapsed_ms: u64,
    pub champion: Option<ChampionHealth>,
    pub gates: Vec<GateVerdict>,
    /// The breach-confirmation window, filled in by the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<WindowCheck>,
}

/// Breach confirmation on disjoint windows (the `windowed` policy).
///
/// Re-testing one growing window every few seconds would look at the same
/// evidence again and again, and a single unlucky stretch would "confirm"
/// itself. So a non-gross breach counts once per window: a window closes
/// when its gates have judged (or breached), and the next one starts empty.
/// `confirm_breaches` consecutive breached windows roll back; a window that
/// judged without a breach resets the count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WindowCheck {
    pub gates: Vec<GateVerdict>,
    /// Some gate failed in this window (and the champion was not in outage).
    pub breached: bool,
    pub gross: bool,
    /// Every gate had enough samples in both arms to judge.
    pub judged: bool,
    /// Consecutive breached windows, including this one.
    pub consecutive_breaches: u32,
    pub needed: u32,
}

/// The champion's own health in the window: the candidate is judged only
/// against a champion that has a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChampionHealth {
    pub requests: u64,
    pub failures: u64,
    pub error_rate: Interval,
    /// The lower bound of the champion's error rate is above the outage
    /// threshold (or its p95 lower bound above `max_p95_ms`).
    pub outage: bool,
}

/// Why a rollout rolled back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum RollbackReason {
    /// The candidate did not report ready within the readiness timeout.
    ReadinessTimeout,
    /// Gates breached on `confirmations` consecutive evaluations.
    Breach {
        gates: Vec<GateKind>,
        confirmations: u32,
    },
    /// A breach so large it needed no confirmation.
    GrossBreach { gates: Vec<GateKind> },
    /// The stage had too little evidence by its deadline.
    EvidenceTimeout { gates: Vec<GateKind> },
    /// Traffic was seen but metrics were missing.
    MetricsMissing { gates: Vec<GateKind> },
    /// A sticky stage could never be judged per key with the keys the
    /// model's traffic carries (the candidate is not rejected: nothing was
    /// shown against it).
    TooFewKeys { keys: u64, weight_percent: u32 },
    /// The `sequential` policy's anytime-valid test rejected "no worse than
    /// the champion" (its error is bounded by `sequential.alpha` over the
    /// whole rollout, so no confirmation is needed).
    AnytimeBreach { gates: Vec<GateKind> },
    /// Nobody approved the step before `before` by its deadline (the
    /// candidate is not rejected: nothing was shown against it).
    ApprovalTimeout { before: ApprovalPoint },
    /// The external data plane did not confirm the routing of `epoch`
    /// within the stage's evidence timeout (the candidate is not rejected).
    RoutingNotApplied { epoch: Epoch },
    /// Too few labels came by the quality gate's label deadline (the
    /// candidate is not rejected: nothing was shown against it).
    LabelTimeout { labelled: u64, recorded: u64 },
    /// After promotion, the watch's labels showed the promoted revision
    /// worse than the previous champion, which is champion again.
    WatchRegression { gates: Vec<GateKind> },
}

impl RollbackReason {
    /// A gate showed the candidate worse (as opposed to failing safe for
    /// lack of readiness, evidence or metrics).
    pub fn is_breach(&self) -> bool {
        matches!(
            self,
            RollbackReason::Breach { .. }
                | RollbackReason::GrossBreach { .. }
                | RollbackReason::AnytimeBreach { .. }
                | RollbackReason::WatchRegression { .. }
        )
    }

    /// Whether this rollback rejects (blocks) the candidate under `plan`:
    /// by default only when it was shown worse or never became ready; a
    /// rollout that ended for lack of evidence leaves it startable again.
    pub fn rejects(&self, plan: &Plan) -> bool {
        match plan.reject_on {
            RejectOn::AnyRollback => true,
            RejectOn::ShownWorse => {
                self.is_breach() || matches!(self, RollbackReason::ReadinessTimeout)
            }
        }
    }

    /// Every reason's [`code`](Self::code), so a counter by reason can
    /// start at zero for each (an alert on its increase fires on the first).
    pub const CODES: [&'static str; 11] = [
        "readiness_timeout",
        "breach",
        "gross_breach",
        "evidence_timeout",
        "metrics_missing",
        "too_few_keys",
        "anytime_breach",
        "approval_timeout",
        "routing_not_applied",
        "label_timeout",
        "watch_regression",
    ];

    pub fn code(&self) -> &'static str {
        match self {
            RollbackReason::ReadinessTimeout => "readiness_timeout",
            RollbackReason::Breach { .. } => "breach",
            RollbackReason::GrossBreach { .. } => "gross_breach",
            RollbackReason::EvidenceTimeout { .. } => "evidence_timeout",
            RollbackReason::MetricsMissing { .. } => "metrics_missing",
            RollbackReason::TooFewKeys { .. } => "too_few_keys",
            RollbackReason::AnytimeBreach { .. } => "anytime_breach",
            RollbackReason::ApprovalTimeout { .. } => "approval_timeout",
            RollbackReason::RoutingNotApplied { .. } => "routing_not_applied",
            RollbackReason::LabelTimeout { .. } => "label_timeout",
            RollbackReason::WatchRegression { .. } => "watch_regression",
        }
    }
}
