//! A rollout plan: its stages, clocks and gate budgets, with validation that
//! names the offending field (in `plan/validate.rs`). Plans are TOML files;
//! every field has a default, so an empty plan is the recommended one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod validate;

/// An invalid plan: `field` is the dotted path of the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("plan field `{field}`: {message}")]
pub struct PlanError {
    pub field: String,
    pub message: String,
}

/// How a rollout walks from SHADOW through the canary steps to PROMOTED.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Plan {
    /// The mirrored, zero-exposure stage before any canary step.
    pub shadow: ShadowPlan,
    /// Canary weights in percent, strictly increasing, each in 1..=99.
    /// After the last one passes, the candidate is promoted.
    pub steps: Vec<u32>,
    /// A clean stage waits at least this long before it may pass.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, default = "1m"))]
    pub min_stage_duration: Duration,
    /// A stage without enough evidence by this time (since its clock
    /// started) fails with `evidence_timeout`. At least `min_stage_duration`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, default = "10m"))]
    pub evidence_timeout: Duration,
    /// The candidate must report ready within this time of the rollout's
    /// creation, or the rollout rolls back with `readiness_timeout`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, default = "2m"))]
    pub readiness_timeout: Duration,
    /// Consecutive failing evaluations needed to roll back (gross breaches
    /// roll back at once). At least 1.
    pub confirm_breaches: u32,
    /// Error level of each confidence bound: two-sided `1 - alpha` intervals.
    /// In (0, 0.5]. (The `windowed` policy.)
    pub alpha: f64,
    /// How gates are decided: fixed windows, or anytime-valid sequences.
    pub policy: Policy,
    /// Settings of the `sequential` policy.
    pub sequential: SequentialPlan,
    /// The champion is judged for an outage on this much recent evidence
    /// (not on totals since the rollout began, which dilute an outage).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, default = "5s"))]
    pub outage_window: Duration,
    /// Which rollbacks reject (block) the candidate.
    pub reject_on: RejectOn,
    /// How live traffic is split: per key (sticky) or per request.
    pub assignment: Assignment,
    /// About how many distinct keys (users, tenants) the model's traffic
    /// carries, when a team knows it is few: a sticky `sequential` plan
    /// whose steps cannot hold the keys a stage needs to be judged per key
    /// is refused up front (see `rollgate_core::keys`). Unset, rollgate
    /// estimates it from the traffic during the rollout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<u64>,
    /// A candidate request that cannot reach the candidate (connection
    /// refused) is sent to the champion instead; the candidate's failure
    /// is still counted, and so is the fallback.
    pub fallback_to_champion: bool,
    pub gates: Gates,
    /// Points a person must approve before the rollout passes them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalStep>,
    /// `enforce` (the default) moves traffic and the registry; `observe` is
    /// a dry run (see [`Mode`]).
    #[serde(skip_serializing_if = "Mode::is_enforce")]
    pub mode: Mode,
    /// After promotion, the quality gate keeps judging the promoted
    /// revision against the previous champion for a while (see [`Watch`]).
    #[serde(skip_serializing_if = "Watch::is_off")]
    pub watch: Watch,
}

/// A watch after promotion, for labels slower than the rollout: the
/// promoted revision serves every user while the previous champion stays
/// routable as a mirror of `mirror_percent` of the requests, and the
/// quality gate's paired test (the SHADOW stage's, continued) judges the
/// two on the labels that keep coming. A shown regression within `window`
/// rolls back to the previous champion; at its end the promotion is final.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Watch {
    /// How long the watch lasts from the promotion (`0s`: no watch).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, default = "0s"))]
    pub window: Duration,
    /// Share of the promoted revision's requests mirrored to the previous
    /// champion, in percent (1..=100).
    pub mirror_percent: u32,
}

impl Watch {
    pub fn is_off(&self) -> bool {
        self.window.is_zero()
    }
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            window: Duration::ZERO,
            mirror_percent: 100,
        }
    }
}

/// Whether a rollout's decisions take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Decisions move traffic, promote and reject.
    #[default]
    Enforce,
    /// A dry run: every gate is evaluated on live traffic and every
    /// decision the rollout would take is recorded (marked `dry_run`), but
    /// no user is ever served by the candidate — it gets mirrored copies of
    /// the traffic at each stage's share (the shadow's share in SHADOW, the
    /// step's weight in a canary step) — and nothing in the registry
    /// changes: a "promotion" leaves the champion, a "rollback" rejects
    /// nothing. Approval steps are not waited for.
    Observe,
}

impl Mode {
    pub fn is_enforce(&self) -> bool {
        *self == Mode::Enforce
    }
}

/// A step that waits for a person: once the stage before `before` has
/// passed, the rollout stays where it is (still judged: a breach still
/// rolls back) until an operator approves, or the deadline passes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ApprovalStep {
    /// A canary weight of `steps` (before entering it), or `"promotion"`.
    pub before: ApprovalPoint,
    /// How long it may wait once its stage has passed; unset: for ever.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub deadline: Option<Duration>,
    /// What the deadline does.
    #[serde(default)]
    pub on_deadline: OnDeadline,
}

/// Where an approval step stands: before a canary weight, or before
/// promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum ApprovalPoint {
    /// Before entering this canary weight, in percent.
    Weight(u32),
    /// Before promotion: `"promotion"`.
    Promotion(Promotion),
}

/// The word `promotion` (an [`ApprovalPoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Promotion {
    Promotion,
}

impl ApprovalPoint {
    pub const PROMOTION: ApprovalPoint = ApprovalPoint::Promotion(Promotion::Promotion);
}

impl std::fmt::Display for ApprovalPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApprovalPoint::Weight(w) => write!(f, "{w}%"),
            ApprovalPoint::Promotion(_) => f.write_str("promotion"),
        }
    }
}

/// What an approval step's deadline does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnDeadline {
    /// Roll back (`approval_timeout`; the candidate is not rejected).
    #[default]
    RollBack,
    /// Keep waiting, at the same weight (the deadline is audited).
    Hold,
}

/// How live traffic is split between the champion and the candidate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// The default: by a salted hash of the request's key, so a user's
    /// requests all go to one arm. The key is the statistical unit; the
    /// tests account for users who differ (see `docs/statistics.md`).
    #[default]
    Sticky,
    /// Each request at random, whatever its key: for models where users
    /// need no consistency. The request is then the unit.
    PerRequest,
}

/// Which rollbacks reject the candidate, so that it cannot be rolled out
/// again until an operator unblocks it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RejectOn {
    /// The default: a candidate shown worse (a breach) or never ready. A
    /// rollout that ended for lack of evidence leaves it startable.
    #[default]
    ShownWorse,
    /// Every rollback, whatever its reason.
    AnyRollback,
}

/// How gates are decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Fixed-horizon bounds per stage window; breaches confirmed on
    /// `confirm_breaches` disjoint windows.
    Windowed,
    /// The default. Anytime-valid bounds and e-processes over the whole
    /// rollout: the probability of ever rolling back a candidate that is no
    /// worse than the champion stays below `sequential.alpha`, however often
    /// it is evaluated. A failing metric rolls back at once.
    #[default]
    Sequential,
}

/// When a `sequential` stage advances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Advance {
    /// After the minimum duration, once every gate has its sample floor and
    /// none failed.
    #[default]
    OnTime,
    /// Only once every gate has shown non-inferiority; at the evidence
    /// deadline an inconclusive stage rolls back.
    OnEvidence,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct SequentialPlan {
    /// The rollout-wide error level, split across the gates (Bonferroni).
    /// In (0, 0.5].
    pub alpha: f64,
    pub advance: Advance,
    /// Non-inferiority margin of the error e-process, as a rate ratio: it
    /// fails only once the candidate's failure rate is shown above this
    /// many times the champion's. At least 1 (1 = no margin).
    pub max_error_ratio: f64,
    /// `on_evidence` only: the error gate passes once the candidate's
    /// failure rate is shown *below* this many times the champion's (a
    /// second e-process, the non-inferiority side of `max_error_ratio`),
    /// or below `negligible_error_rate`. Greater than 1.
    pub non_inferiority_ratio: f64,
    /// `on_evidence` only: a candidate whose own failure rate is shown
    /// below this passes the error gate whatever the champion's (a ratio
    /// cannot be shown when neither arm fails). In [0, 1).
    pub negligible_error_rate: f64,
}

impl Default for SequentialPlan {
    fn default() -> Self {
        SequentialPlan {
            alpha: 0.01,
            advance: Advance::OnTime,
            max_error_ratio: 1.0,
            non_inferiority_ratio: 1.5,
            negligible_error_rate: 0.001,
        }
    }
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            shadow: ShadowPlan::default(),
            steps: vec![5, 25, 50],
            min_stage_duration: Duration::from_secs(60),
            evidence_timeout: Duration::from_secs(600),
            readiness_timeout: Duration::from_secs(120),
            confirm_breaches: 2,
            alpha: 0.05,
            policy: Policy::Sequential,
            sequential: SequentialPlan::default(),
            outage_window: Duration::from_secs(5),
            reject_on: RejectOn::ShownWorse,
            assignment: Assignment::Sticky,
            keys: None,
            fallback_to_champion: false,
            gates: Gates::default(),
            approvals: Vec::new(),
            mode: Mode::Enforce,
            watch: Watch::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ShadowPlan {
    pub enabled: bool,
    /// Share of champion traffic mirrored to the shadow, in percent (1..=100).
    pub mirror_percent: u32,
}

impl Default for ShadowPlan {
    fn default() -> Self {
        ShadowPlan {
            enabled: true,
            mirror_percent: 100,
        }
    }
}

/// Budgets of every gate. All comparisons are candidate versus champion over
/// the same window; only the guard rails are absolute.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Gates {
    pub error_rate: ErrorRateGate,
    pub latency: LatencyGate,
    pub prediction_shift: ShiftGate,
    pub shadow: ShadowGate,
    pub guard_rails: GuardRails,
    pub quality: QualityGate,
}

/// Candidate error rate minus champion error rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ErrorRateGate {
    pub enabled: bool,
    /// Fail iff the lower bound of the difference is **above** this margin;
    /// pass iff the upper bound is **at or below** it. In [0, 1].
    pub margin: f64,
    /// Requests each arm needs in the window before the gate judges.
    pub min_requests: u64,
    /// A candidate whose own error-rate lower bound is above this, against a
    /// champion whose upper bound is below it, is a gross breach: it rolls
    /// back without waiting for confirmation. In (0, 1].
    pub gross_error_rate: f64,
}

impl Default for ErrorRateGate {
    fn default() -> Self {
        ErrorRateGate {
            enabled: true,
            margin: 0.01,
            min_requests: 50,
            gross_error_rate: 0.5,
        }
    }
}

/// Latency of successful requests. A regression needs the median AND the
/// tail to be worse by both the ratio and the absolute margin, with
/// confidence: on ~100-request windows a tail alone is noise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct LatencyGate {
    pub enabled: bool,
    /// Successful requests each arm needs before the gate judges.
    pub min_requests: u64,
    /// The tail quantile, in (0.5, 1).
    pub tail_quantile: f64,
    /// Median regressed iff candidate > champion × ratio AND candidate −
    /// champion > ms (strict). Ratio at least 1, ms at least 0.
    pub median_ratio: f64,
    pub median_ms: f64,
    pub tail_ratio: f64,
    pub tail_ms: f64,
}

impl Default for LatencyGate {
    fn default() -> Self {
        LatencyGate {
            enabled: true,
            min_requests: 50,
            tail_quantile: 0.95,
            median_ratio: 1.25,
            median_ms: 5.0,
            tail_ratio: 1.5,
            tail_ms: 25.0,
        }
    }
}

/// Per-class prediction rates, candidate versus champion. Needs the gateway
/// to read predictions from the model's output, so it is opt-in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ShiftGate {
    pub enabled: bool,
    /// `windowed`: fail iff some class's rate difference is confidently
    /// beyond ±margin.
    pub margin: f64,
    /// `sequential`: fail once some class's rate in the candidate is shown
    /// above this many times the champion's, or below its inverse (> 1).
    pub max_class_ratio: f64,
    /// `sequential`: classes rarer than this share of all predictions are
    /// judged together as one "other" class, and a class shown rarer than
    /// this in both arms needs no ratio shown to pass. In [0, 1).
    pub min_class_share: f64,
    /// Predictions each arm needs before the gate judges.
    pub min_predictions: u64,
}

impl Default for ShiftGate {
    fn default() -> Self {
        ShiftGate {
            enabled: false,
            margin: 0.1,
            max_class_ratio: 1.5,
            min_class_share: 0.01,
            min_predictions: 100,
        }
    }
}

/// Paired answers in the SHADOW stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ShadowGate {
    /// Pass needs the agreement lower bound at or above this; fail when the
    /// agreement upper bound is below it. In [0, 1].
    pub min_agreement: f64,
    /// Flips are disagreements on pairs where the champion was highly
    /// confident, as a share of those pairs. Pass needs the upper bound at or
    /// below this; fail when the lower bound is above it. 1 turns it off
    /// (e.g. for regression models, which have no confidence).
    pub max_flip_rate: f64,
    /// Pairs needed before the gate judges.
    pub min_pairs: u64,
}

impl Default for ShadowGate {
    fn default() -> Self {
        ShadowGate {
            min_agreement: 0.9,
            max_flip_rate: 0.02,
            min_pairs: 100,
        }
    }
}

/// What a label says of a prediction: a class to match, or a number to
/// come within a tolerance of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QualityKind {
    /// Wrong when the predicted class is not the label.
    #[default]
    Classification,
    /// Wrong when the predicted value is more than `tolerance` from the label.
    Regression,
}

/// Quality from delayed labels (ground truth sent to
/// `POST /api/v1/models/{model}/labels`): in the SHADOW stage on labelled
/// mirrored pairs, in CANARY stages on each arm's labelled answers
/// (docs/statistics.md, "Quality from labels"). Needs the `sequential`
/// policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct QualityGate {
    pub enabled: bool,
    pub kind: QualityKind,
    /// Regression: an answer further than this from its label is wrong.
    pub tolerance: f64,
    /// Fail once the candidate's own mistakes (labelled pairs it got wrong
    /// and the champion right) are shown above this many times the
    /// champion's own mistakes (at least 1).
    pub max_error_ratio: f64,
    /// Pass needs the candidate's error rate shown at most this far above
    /// the champion's, on the labelled pairs. In [0, 1].
    pub margin: f64,
    /// Labelled pairs (SHADOW), or each arm's labelled answers in the
    /// stage (CANARY), needed before the gate may pass.
    pub min_labels: u64,
    /// Labelled share of the stage's recorded pairs (CANARY: of the
    /// candidate's recorded answers) needed by the label deadline. In
    /// [0, 1].
    pub min_coverage: f64,
    /// Labels wait at most this long from the stage's start: a stage still
    /// short of `min_labels` or `min_coverage` then fails with
    /// `label_timeout`. Until then the gate does not hold the stage to
    /// `evidence_timeout`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, default = "30m"))]
    pub label_deadline: Duration,
    /// The stages wait for labels (SHADOW, CANARY). `false`: labels come
    /// too late for them; the gate judges only in the watch after
    /// promotion (`[watch]`), on every pair recorded since SHADOW.
    pub in_stages: bool,
    /// The longest a label takes after its answer (required): an answer is
    /// judged only once this old (*matured*), with the label it had by
    /// then; a label later than this is not counted. When labels come
    /// then says nothing of which answers were right.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "90d"))]
    pub label_window: Option<Duration>,
    /// What no label by the end of `label_window` means, for labels that
    /// exist for one outcome only (`"0"`: no chargeback, legitimate).
    /// Unset: a matured answer without a label is unlabelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent_label: Option<String>,
    /// How matured answers without a label are judged.
    pub unlabelled: Unlabelled,
}

/// How the quality tests treat matured answers that have no label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Unlabelled {
    /// Each counts against the verdict being tested (wrong for the
    /// candidate's pass, right for its refusal): sound whatever decides
    /// which answers get labels, and decisive only when nearly all do.
    #[default]
    WorstCase,
    /// Left out: declares that whether an answer gets a label does not
    /// depend on its being right (labels sampled at random, per arm).
    AtRandom,
}

impl QualityGate {
    /// `label_window` in milliseconds, the unit answers are timed in (0:
    /// no window declared).
    pub fn label_window_ms(&self) -> u64 {
        self.label_window
            .map_or(0, |w| w.as_millis().min(u128::from(u64::MAX)) as u64)
    }
}

impl Default for QualityGate {
    fn default() -> Self {
        QualityGate {
            enabled: false,
            kind: QualityKind::Classification,
            tolerance: 0.0,
            max_error_ratio: 1.0,
            margin: 0.02,
            min_labels: 100,
            min_coverage: 0.0,
            label_deadline: Duration::from_secs(30 * 60),
            in_stages: true,
            label_window: None,
            absent_label: None,
            unlabelled: Unlabelled::WorstCase,
        }
    }
}

/// Absolute limits on the candidate, and what counts as a champion outage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct GuardRails {
    /// Fail iff the candidate's error-rate lower bound is above this.
    pub max_error_rate: Option<f64>,
    /// Fail iff the candidate's p95 lower bound is above this (ms).
    pub max_p95_ms: Option<f64>,
    /// The champion is in an outage when its own error-rate lower bound is
    /// above this; candidate breaches then hold instead of rolling back.
    pub champion_outage_error_rate: f64,
}

impl Default for GuardRails {
    fn default() -> Self {
        GuardRails {
            max_error_rate: None,
            max_p95_ms: None,
            champion_outage_error_rate: 0.25,
        }
    }
}

impl Plan {
    /// Settings this plan's policy never reads, as dotted paths into the
    /// plan's JSON: views of a plan (the API's rollout answers, `rollout
    /// status`) leave them out, so a reader sees only what decides.
    pub fn unused_by_policy(&self) -> &'static [&'static str] {
        match self.policy {
            Policy::Sequential => &[
                "confirm_breaches",
                "gates.error_rate.margin",
                "gates.error_rate.gross_error_rate",
                "gates.prediction_shift.margin",
            ],
            Policy::Windowed => &[
                "sequential",
                "gates.prediction_shift.max_class_ratio",
                "gates.prediction_shift.min_class_share",
            ],
        }
    }

    /// The approval step before `point`, if the plan has one.
    pub fn approval_before(&self, point: ApprovalPoint) -> Option<&ApprovalStep> {
        self.approvals.iter().find(|a| a.before == point)
    }

    /// Candidate weight of canary step `i`, in basis points (1/10,000).
    pub fn step_weight_bp(&self, i: usize) -> u32 {
        self.steps.get(i).copied().unwrap_or(0) * 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(mutate: impl FnOnce(&mut Plan)) -> String {
        let mut p = Plan::default();
        mutate(&mut p);
        p.validate().expect_err("invalid").field
    }

    #[test]
    fn default_plan_is_valid() {
        assert_eq!(Plan::default().validate(), Ok(()));
    }

    #[test]
    fn steps_must_be_strictly_increasing() {
        assert_eq!(field_of(|p| p.steps = vec![5, 25, 25]), "steps[2]");
        assert_eq!(field_of(|p| p.steps = vec![50, 25]), "steps[1]");
    }

    #[test]
    fn steps_must_be_between_1_and_99_percent() {
        assert_eq!(field_of(|p| p.steps = vec![0, 5]), "steps[0]");
        assert_eq!(field_of(|p| p.steps = vec![5, 100]), "steps[1]");
        assert_eq!(field_of(|p| p.steps = vec![]), "steps");
    }

    /// A declared key count that a sticky step cannot hold enough of is
    /// refused at that step, saying what works; split per request, or with
    /// steps large enough, the same count is fine.
    #[test]
    fn steps_must_hold_enough_of_the_declared_keys() {
        let few = |p: &mut Plan| p.keys = Some(12);
        assert_eq!(field_of(few), "steps[0]");
        let mut p = Plan::default();
        few(&mut p);
        let e = p.validate().expect_err("5% of 12 keys");
        assert!(
            e.message.contains("0.6 keys") && e.message.contains("67%"),
            "{e}"
        );
        p.steps = vec![70, 90];
        assert_eq!(p.validate(), Ok(()));
        p.steps = vec![5, 25, 50];
        p.assignment = Assignment::PerRequest;
        assert_eq!(p.validate(), Ok(()));
        p.assignment = Assignment::Sticky;
        p.keys = Some(10_000);
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(field_of(|p| p.keys = Some(0)), "keys");
    }

    #[test]
    fn budgets_must_be_probabilities() {
        assert_eq!(
            field_of(|p| p.gates.error_rate.margin = 1.5),
            "gates.error_rate.margin"
        );
        assert_eq!(
            field_of(|p| p.gates.shadow.min_agreement = -0.1),
            "gates.shadow.min_agreement"
        );
        assert_eq!(
            field_of(|p| p.gates.shadow.max_flip_rate = f64::NAN),
            "gates.shadow.max_flip_rate"
        );
        assert_eq!(
            field_of(|p| p.sequential.max_error_ratio = 0.5),
            "sequential.max_error_ratio"
        );
        assert_eq!(field_of(|p| p.sequential.alpha = 0.0), "sequential.alpha");
        assert_eq!(
            field_of(|p| p.gates.prediction_shift.max_class_ratio = 1.0),
            "gates.prediction_shift.max_class_ratio"
        );
        assert_eq!(
            field_of(|p| p.gates.prediction_shift.min_class_share = 1.0),
            "gates.prediction_shift.min_class_share"
        );
        assert_eq!(
            field_of(|p| p.gates.guard_rails.max_error_rate = Some(2.0)),
            "gates.guard_rails.max_error_rate"
        );
    }

    #[test]
    fn clocks_must_be_consistent() {
        assert_eq!(
            field_of(|p| p.evidence_timeout = Duration::from_secs(10)),
            "evidence_timeout"
        );
        assert_eq!(
            field_of(|p| p.readiness_timeout = Duration::ZERO),
            "readiness_timeout"
        );
        assert_eq!(field_of(|p| p.confirm_breaches = 0), "confirm_breaches");
        assert_eq!(field_of(|p| p.alpha = 0.0), "alpha");
    }

    #[test]
    fn latency_margins_are_checked() {
        assert_eq!(
            field_of(|p| p.gates.latency.median_ratio = 0.9),
            "gates.latency.median_ratio"
        );
        assert_eq!(
            field_of(|p| p.gates.latency.tail_quantile = 0.5),
            "gates.latency.tail_quantile"
        );
    }

    #[test]
    fn toml_plan_reads_durations_and_fills_defaults() {
        let p: Plan = toml::from_str(
            r#"
            steps = [10, 50]
            min_stage_duration = "30s"
            evidence_timeout = "5m"
            [gates.error_rate]
            margin = 0.02
            [gates.guard_rails]
            max_p95_ms = 500.0
            "#,
        )
        .expect("valid plan");
        assert_eq!(p.steps, vec![10, 50]);
        assert_eq!(p.min_stage_duration, Duration::from_secs(30));
        assert_eq!(p.evidence_timeout, Duration::from_secs(300));
        assert_eq!(p.gates.error_rate.margin, 0.02);
        assert_eq!(p.gates.error_rate.min_requests, 50);
        assert_eq!(p.gates.guard_rails.max_p95_ms, Some(500.0));
        assert!(p.shadow.enabled);
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn toml_plan_with_an_unknown_field_is_an_error_naming_it() {
        let e = toml::from_str::<Plan>("stepz = [5]").expect_err("unknown field");
        assert!(e.to_string().contains("stepz"), "{e}");
    }

    #[test]
    fn step_weights_are_basis_points() {
        let p = Plan::default();
        assert_eq!(p.step_weight_bp(0), 500);
        assert_eq!(p.step_weight_bp(2), 5000);
    }
}
