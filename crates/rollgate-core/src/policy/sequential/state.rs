//! What the sequential policy keeps between looks (small, serialisable,
//! restored exactly) and the per-arm tallies its stage floors count.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::exposure::Epoch;
use crate::snapshot::{RevisionStats, Snapshot};
use crate::unit::UnitTotals;

/// Classes beyond this many are not named (they stay in "other").
pub const MAX_CLASSES: usize = 1000;

/// The sequential test's state: small, serialisable, restored exactly.
/// (The evidence itself is the rollout's [`Ledger`]; the error e-process
/// is recomputed from it at every look.)
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SequentialState {
    /// Epochs at which a fresh component of the error e-process starts
    /// (one after each champion outage), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<Epoch>,
    /// The champion was in an outage at the last look.
    #[serde(default)]
    pub champion_outage: bool,
    /// An outage ended at this look: the caller starts a new epoch (same
    /// split), where a fresh component of the e-process and the stage's
    /// floors start.
    #[serde(default)]
    pub new_epoch_due: bool,
    /// Predicted classes named so far, in order: a class gets its own cell
    /// in the prediction-shift test once its share of all predictions has
    /// reached `min_class_share` (and keeps it); rarer ones share the
    /// "other" cell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// How many of `classes` were named when each epoch was first looked
    /// at: that epoch's cells, fixed before any of its data was seen.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub class_cells: BTreeMap<Epoch, usize>,
}

impl SequentialState {
    /// Names the classes whose share of all predictions in `snapshot` is at
    /// least `min_share`, in name order among those new at this look.
    pub(super) fn note_classes(&mut self, snapshot: &Snapshot, min_share: f64) {
        let mut counts: BTreeMap<&String, u64> = BTreeMap::new();
        for r in snapshot.revisions().values() {
            for (class, n) in r.predictions() {
                *counts.entry(class).or_default() += n;
            }
        }
        let total: u64 = counts.values().sum();
        for (class, n) in counts {
            if self.classes.len() < MAX_CLASSES
                && n as f64 >= min_share * total as f64
                && !self.classes.contains(class)
            {
                self.classes.push(class.clone());
            }
        }
    }

    /// The named classes of `epoch`'s cells.
    pub(super) fn cells_of(&self, epoch: Epoch) -> &[String] {
        let n = self.class_cells.get(&epoch).copied().unwrap_or(0);
        &self.classes[..n.min(self.classes.len())]
    }
}

/// Counts of both arms: what each stage's sample floors count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub candidate: ArmTally,
    pub champion: ArmTally,
    /// Compared champion/shadow pairs.
    pub pairs: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmTally {
    pub requests: u64,
    pub failures: u64,
    pub latencies: u64,
    pub predictions: u64,
}

impl ArmTally {
    pub(super) fn of(s: &RevisionStats) -> Self {
        ArmTally {
            requests: s.requests(),
            failures: s.failure_count(),
            latencies: s.latency().len(),
            predictions: s.predictions().values().sum(),
        }
    }
}

impl Tally {
    pub(super) fn of(s: &Snapshot, champion: &str, candidate: &str) -> Self {
        Tally {
            candidate: ArmTally::of(s.revision(candidate)),
            champion: ArmTally::of(s.revision(champion)),
            pairs: s.pairs_for(candidate).map_or(0, |p| p.pairs()),
        }
    }
}

/// What an error e-process counts against a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    /// Failures (5xx, timeouts, connect errors, unreadable output) among
    /// requests with an outcome.
    Failures,
    /// Client errors (4xx) among all answered requests: a candidate that
    /// answers 4xx where the champion answers 2xx to the same traffic is
    /// worse; a client that sends garbage to both moves neither.
    ClientErrors,
}

impl Counted {
    /// A unit group's `(trials, count)`.
    pub(super) fn in_unit(self) -> fn(&UnitTotals) -> (u64, u64) {
        match self {
            Counted::Failures => |u| (u.requests, u.failures),
            Counted::ClientErrors => |u| (u.requests + u.client_errors, u.client_errors),
        }
    }
}
