//! What a stage's judgement is made of: its kind, its verdict and the
//! reason for it. The verdict is decided by the one safety-model rule chain
//! ([`crate::safety`]) from the gate verdicts of the plan's policy
//! ([`crate::policy`]).

use serde::{Deserialize, Serialize};

use crate::gate::{GateKind, GateVerdict, Outcome};
use crate::safety::ChampionHealth;

/// Which kind of stage is being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// The candidate answers mirrored traffic; nobody sees its answers.
    Shadow,
    /// The candidate serves a share of live traffic.
    Canary,
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
