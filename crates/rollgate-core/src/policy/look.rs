//! What every policy is given at a look, and what it tells the state
//! machine to do next. Both policies answer in these terms, so
//! [`crate::rollout`] applies a look without knowing which policy made it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::exposure::Ledger;
use crate::snapshot::Snapshot;
use crate::stage::{RollbackReason, StageKind, StageReason, StageVerdict};
use crate::types::{Epoch, Timestamp};

/// One look at a stage, as the rollout sees it.
#[derive(Debug, Clone, Copy)]
pub struct LookInput<'a> {
    pub stage: StageKind,
    /// The rollout's evidence and this look's new counts per epoch; `None`
    /// if no stats could be read.
    pub evidence: Option<(&'a Ledger, &'a BTreeMap<Epoch, Snapshot>)>,
    /// The first epoch of each stage entered, in order; the last is the
    /// current stage's. A stage runs in one split, so its epochs are
    /// compared together.
    pub stage_starts: &'a [Epoch],
    /// The epoch in force now.
    pub epoch: Epoch,
    /// The epoch the current stage's clock started in: the windowed policy
    /// judges the requests that arrived from it on.
    pub stage_epoch: Epoch,
    /// The epoch from which the current stage's sample floors count: each
    /// stage must gather its own floor before it may pass (a stage whose
    /// traffic stopped never passes on earlier stages' evidence), and
    /// after an outage only what came after it counts.
    pub floor_epoch: Epoch,
    pub champion: &'a str,
    pub candidate: &'a str,
    /// Time since the current stage's clock started.
    pub elapsed: Duration,
    pub now: Timestamp,
    /// The rollout's recorded predictions with their labels, when its plan
    /// has a quality gate (`None`: none could be read, or none asked for).
    pub labels: Option<&'a [crate::labels::Recorded]>,
    /// An operator paused the rollout: a stage neither passes nor fails
    /// safe for lack of evidence (a breach still rolls back).
    pub paused: bool,
}

/// What the state machine does after a look.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Stay in the stage.
    Stay,
    /// Stay in the stage, and start a new routing epoch (the policy's
    /// tests ask for fresh strata).
    NewEpoch,
    /// Enter the next stage; `fresh_counts`: its counts start at zero.
    Advance {
        fresh_counts: bool,
    },
    RollBack(RollbackReason),
}

/// A policy's answer to one look.
#[derive(Debug, Clone)]
pub struct Judged {
    pub verdict: StageVerdict,
    /// Said in the audit record beside the verdict (e.g. why windows
    /// restarted).
    pub note: Option<String>,
    pub next: Next,
}

/// Why a stage that failed without a breach (starved of evidence, or its
/// metrics missing) rolls the rollout back: not noise, so no confirmation.
pub(super) fn failed_safe(reason: &StageReason) -> RollbackReason {
    match reason {
        StageReason::MetricsMissing { gates } => RollbackReason::MetricsMissing {
            gates: gates.clone(),
        },
        StageReason::EvidenceTimeout { gates } => RollbackReason::EvidenceTimeout {
            gates: gates.clone(),
        },
        &StageReason::TooFewKeys {
            keys,
            weight_percent,
        } => RollbackReason::TooFewKeys {
            keys,
            weight_percent,
        },
        &StageReason::LabelTimeout { labelled, recorded } => {
            RollbackReason::LabelTimeout { labelled, recorded }
        }
        _ => RollbackReason::EvidenceTimeout { gates: vec![] },
    }
}
