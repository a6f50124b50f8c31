//! Delayed labels: the predictions the gateways recorded, joined with the
//! ground truth sent later, tallied into what the quality gate judges.
//!
//! A label belongs to a request (its `x-request-id`), so in the SHADOW
//! stage one label judges both arms' answers to the same request: a
//! *pair*. Only discordant pairs (one arm right, the other wrong) say
//! which arm is better (McNemar), and which arm a discordant pair
//! favours does not depend on the mix of requests, the drift of the
//! label rate, or when labels come.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::plan::{QualityGate, QualityKind};
use crate::types::Epoch;
use crate::unit::{UnitTotals, Units};

/// One arm's recorded answer to one request, with the request's label if
/// one came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    pub request_id: String,
    pub revision: String,
    pub epoch: Epoch,
    /// The request's unit group (its key's, as the split saw it).
    pub unit: u16,
    /// The predicted class, for a classification.
    pub class: Option<String>,
    /// The predicted value, for a regression.
    pub value: Option<f64>,
    /// The label, as sent (a class, or a number's text).
    pub label: Option<String>,
    /// When the answer was recorded (ms since the Unix epoch, the
    /// gateway's clock).
    #[serde(default)]
    pub at_ms: u64,
    /// When its label was received (ms, the API's clock), if one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labelled_at_ms: Option<u64>,
}

/// Which answers the tests may read at one look, and with what label: an
/// answer is *matured* once `window` old, and judged by the label it had
/// received by then (`absent` when none had, if declared). A matured
/// answer's label never changes afterwards, so matured answers enter the
/// tests in the order they were answered, whatever decides when labels
/// come (delays ≤ `window`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Maturity<'a> {
    pub now_ms: u64,
    pub window_ms: u64,
    pub absent: Option<&'a str>,
}

impl<'a> Maturity<'a> {
    /// The gate's maturity at `now_ms` (no window declared: every answer
    /// is matured at once, and labels count whenever they came).
    pub fn of(gate: &'a QualityGate, now_ms: u64) -> Self {
        Maturity {
            now_ms,
            window_ms: gate.label_window_ms(),
            absent: gate.absent_label.as_deref(),
        }
    }

    /// Whether an answer recorded at `at_ms` is matured.
    pub fn matured(&self, at_ms: u64) -> bool {
        self.now_ms >= at_ms.saturating_add(self.window_ms)
    }

    /// The label a matured answer recorded at `at_ms` is judged by: the
    /// one received before its window ended, else the declared meaning of
    /// none (no window: any label received).
    pub fn label_of<'r>(&self, r: &'r Recorded, at_ms: u64) -> Option<&'r str>
    where
        'a: 'r,
    {
        let in_window = |t: u64| self.window_ms == 0 || t < at_ms.saturating_add(self.window_ms);
        match (&r.label, r.labelled_at_ms) {
            (Some(l), Some(t)) if in_window(t) => Some(l.as_str()),
            // A label of unknown arrival counts only without a window.
            (Some(l), None) if self.window_ms == 0 => Some(l.as_str()),
            _ => self.absent,
        }
    }
}

/// Whether `answer` is wrong by `label` under `gate`; `None` when they
/// cannot be compared (no answer of the gate's kind, or a label that is no
/// number for a regression): such a pair is not counted as labelled.
pub fn wrong(gate: &QualityGate, answer: &Recorded, label: &str) -> Option<bool> {
    match gate.kind {
        QualityKind::Classification => answer.class.as_deref().map(|c| c != label),
        QualityKind::Regression => {
            let predicted = answer
                .value
                .or_else(|| answer.class.as_deref()?.parse().ok())?;
            let truth: f64 = label.trim().parse().ok().filter(|x: &f64| x.is_finite())?;
            // A predicted NaN or infinity is wrong, whatever the label.
            Some(!(predicted.is_finite() && (predicted - truth).abs() <= gate.tolerance))
        }
    }
}

/// The labelled mirrored pairs of one rollout: both arms' answers to one
/// request, judged by the request's label.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PairedLabels {
    /// Requests both arms answered (and the gateway recorded).
    pub recorded: u64,
    /// Of those, the ones at least `label_window` old: the tests read
    /// only these.
    #[serde(default)]
    pub matured: u64,
    /// Of the matured, the ones judged by a label (received within the
    /// window, or the declared meaning of none) that could be compared.
    pub labelled: u64,
    /// The candidate wrong, the champion right.
    pub candidate_only_wrong: u64,
    /// The champion wrong, the candidate right.
    pub champion_only_wrong: u64,
    pub both_wrong: u64,
    /// Per unit group: `requests` the matured pairs, `failures` those the
    /// candidate alone got wrong, `client_errors` those the champion alone
    /// got wrong, `latencies` those without a label (the tests' unit is
    /// the key). Not kept with a verdict: the design effects it gave are.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub units: Units,
}

impl PairedLabels {
    /// The labelled share of the matured pairs (0 with none matured).
    pub fn coverage(&self) -> f64 {
        if self.matured == 0 {
            0.0
        } else {
            self.labelled as f64 / self.matured as f64
        }
    }

    /// Matured pairs without a label.
    pub fn unlabelled(&self) -> u64 {
        self.matured.saturating_sub(self.labelled)
    }

    /// Recorded pairs not yet matured.
    pub fn pending(&self) -> u64 {
        self.recorded.saturating_sub(self.matured)
    }

    pub fn discordant(&self) -> u64 {
        self.candidate_only_wrong + self.champion_only_wrong
    }
}

/// The pairs in `rows`: requests answered by both `champion` and
/// `candidate`, each matured one judged by its label under `gate`.
pub fn paired(
    rows: &[Recorded],
    (champion, candidate): (&str, &str),
    gate: &QualityGate,
    maturity: Maturity<'_>,
) -> PairedLabels {
    let mut by_request: HashMap<&str, (Option<&Recorded>, Option<&Recorded>)> =
        HashMap::with_capacity(rows.len() / 2 + 1);
    for r in rows {
        let slot = by_request.entry(r.request_id.as_str()).or_default();
        if r.revision == champion {
            slot.0 = Some(r);
        } else if r.revision == candidate {
            slot.1 = Some(r);
        }
    }
    let mut out = PairedLabels::default();
    for (h, c) in by_request.values() {
        let (Some(h), Some(c)) = (h, c) else {
            continue;
        };
        out.recorded += 1;
        // The answer users saw: the champion's, answered first.
        let at = h.at_ms.min(c.at_ms);
        if !maturity.matured(at) {
            continue;
        }
        out.matured += 1;
        let unit = out.units.entry(c.unit).or_insert_with(UnitTotals::default);
        unit.requests += 1;
        // A label is the request's: either arm's row carries it.
        let label = maturity.label_of(if h.label.is_some() { h } else { c }, at);
        let judged = label.and_then(|l| Some((wrong(gate, h, l)?, wrong(gate, c, l)?)));
        let Some((hw, cw)) = judged else {
            unit.latencies += 1;
            continue;
        };
        out.labelled += 1;
        match (cw, hw) {
            (true, true) => out.both_wrong += 1,
            (true, false) => {
                out.candidate_only_wrong += 1;
                unit.failures += 1;
            }
            (false, true) => {
                out.champion_only_wrong += 1;
                unit.client_errors += 1;
            }
            (false, false) => {}
        }
    }
    out.units.retain(|_, u| u.requests > 0);
    out
}

/// Answered classes kept apart in [`ArmLabels::by_class`]; the rest are
/// counted under [`OTHER_CLASSES`].
pub const MAX_ANSWER_CLASSES: usize = 16;

/// Where answers of classes beyond [`MAX_ANSWER_CLASSES`] are counted.
pub const OTHER_CLASSES: &str = "(other)";

/// One answered class's matured answers and how many of them had labels:
/// whether a label comes often depends on what was answered (a flagged
/// transaction is reviewed at once, a passed one is known at its
/// chargeback).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClassCoverage {
    pub matured: u64,
    pub labelled: u64,
}

/// One arm's answers in CANARY epochs: matured, labelled (comparably),
/// and wrong by their labels, per unit group too (`latencies` matured,
/// `requests` labelled, `failures` wrong), and per answered class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArmLabels {
    /// Matured answers (at least `label_window` old): the tests read only
    /// these.
    pub recorded: u64,
    pub labelled: u64,
    pub wrong: u64,
    /// Answers recorded but not yet matured.
    #[serde(default)]
    pub pending: u64,
    /// Matured and labelled answers by the class answered.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_class: BTreeMap<String, ClassCoverage>,
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub units: Units,
}

impl ArmLabels {
    fn add(&mut self, unit: u16, class: Option<&str>, wrong: Option<bool>) {
        self.recorded += 1;
        self.units.entry(unit).or_default().latencies += 1;
        if let Some(class) = class {
            let key =
                if self.by_class.contains_key(class) || self.by_class.len() < MAX_ANSWER_CLASSES {
                    class
                } else {
                    OTHER_CLASSES
                };
            let c = self.by_class.entry(key.to_string()).or_default();
            c.matured += 1;
            c.labelled += u64::from(wrong.is_some());
        }
        if let Some(w) = wrong {
            self.labelled += 1;
            self.wrong += u64::from(w);
            let u = self.units.entry(unit).or_default();
            u.requests += 1;
            u.failures += u64::from(w);
        }
    }

    /// The sum of two tallies.
    pub fn plus(&self, o: &ArmLabels) -> ArmLabels {
        let mut units = self.units.clone();
        for (g, u) in &o.units {
            units.entry(*g).or_default().merge(u);
        }
        let mut by_class = self.by_class.clone();
        for (k, c) in &o.by_class {
            let e = by_class.entry(k.clone()).or_default();
            e.matured += c.matured;
            e.labelled += c.labelled;
        }
        ArmLabels {
            recorded: self.recorded + o.recorded,
            labelled: self.labelled + o.labelled,
            wrong: self.wrong + o.wrong,
            pending: self.pending + o.pending,
            by_class,
            units,
        }
    }

    /// The labelled share of the matured answers (0 with none).
    pub fn coverage(&self) -> f64 {
        if self.recorded == 0 {
            0.0
        } else {
            self.labelled as f64 / self.recorded as f64
        }
    }

    /// Matured answers without a label.
    pub fn unlabelled(&self) -> u64 {
        self.recorded.saturating_sub(self.labelled)
    }
}

/// Both arms' answers in one epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochLabels {
    pub candidate: ArmLabels,
    pub champion: ArmLabels,
}

/// The answers in `rows` that are no mirrored pair (a CANARY stage's: each
/// request answered by one arm), per epoch from `from` on, each matured
/// one judged by its label under `gate`.
pub fn unpaired(
    rows: &[Recorded],
    (champion, candidate): (&str, &str),
    (gate, maturity): (&QualityGate, Maturity<'_>),
    from: Epoch,
) -> BTreeMap<Epoch, EpochLabels> {
    let mut arms_of: HashMap<&str, u8> = HashMap::with_capacity(rows.len());
    for r in rows {
        *arms_of.entry(r.request_id.as_str()).or_default() += 1;
    }
    let mut out: BTreeMap<Epoch, EpochLabels> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.epoch >= from) {
        if arms_of.get(r.request_id.as_str()).copied().unwrap_or(0) != 1 {
            continue;
        }
        let e = out.entry(r.epoch).or_default();
        let arm = if r.revision == candidate {
            &mut e.candidate
        } else if r.revision == champion {
            &mut e.champion
        } else {
            continue;
        };
        if !maturity.matured(r.at_ms) {
            arm.pending += 1;
            continue;
        }
        let judged = maturity
            .label_of(r, r.at_ms)
            .and_then(|l| wrong(gate, r, l));
        arm.add(r.unit, r.class.as_deref(), judged);
    }
    out
}

/// What the CANARY stages' unpaired test saw: each arm's answers over
/// the canary epochs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CanaryLabels {
    pub candidate: ArmLabels,
    pub champion: ArmLabels,
    /// Earlier versions held a stage while the arms' label coverage
    /// differed; kept to read their records. Never set now: unlabelled
    /// answers are judged by `gates.quality.unlabelled`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coverage_differs: bool,
}

/// One arm's answer to one request, as a gateway records it for labels
/// (its store follower keeps it in the store).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRecord {
    /// Its place in the log, from 1.
    pub seq: u64,
    pub request_id: String,
    pub model: String,
    /// The routing epoch it arrived in (`"<rollout>.<epoch>"`).
    pub epoch: String,
    pub revision: String,
    pub unit: u16,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, rev: &str, class: &str, label: Option<&str>) -> Recorded {
        Recorded {
            request_id: id.into(),
            revision: rev.into(),
            epoch: 1,
            unit: (id.len() % 64) as u16,
            class: Some(class.into()),
            value: None,
            label: label.map(Into::into),
            at_ms: 0,
            labelled_at_ms: None,
        }
    }

    const AT_ONCE: Maturity<'static> = Maturity {
        now_ms: 0,
        window_ms: 0,
        absent: None,
    };

    #[test]
    fn a_pair_is_judged_by_its_one_label_and_unpaired_answers_are_not_pairs() {
        let gate = QualityGate::default();
        let rows = vec![
            row("a", "h", "1", Some("1")),
            row("a", "c", "0", Some("1")),
            row("b", "h", "0", Some("1")),
            row("b", "c", "1", Some("1")),
            row("cc", "h", "0", Some("1")),
            row("cc", "c", "0", Some("1")),
            row("d", "h", "1", Some("1")),
            row("d", "c", "1", Some("1")),
            // Unlabelled, and answered by one arm only.
            row("e", "h", "1", None),
            row("e", "c", "1", None),
            row("f", "h", "1", Some("1")),
        ];
        let p = paired(&rows, ("h", "c"), &gate, AT_ONCE);
        assert_eq!(
            (
                p.recorded,
                p.labelled,
                p.candidate_only_wrong,
                p.champion_only_wrong,
                p.both_wrong
            ),
            (5, 4, 1, 1, 1)
        );
        assert_eq!(p.discordant(), 2);
        assert!((p.coverage() - 0.8).abs() < 1e-12);
        let units: u64 = p.units.values().map(|u| u.failures + u.client_errors).sum();
        assert_eq!(units, 2, "the discordant pairs, by unit group");
        let matured: u64 = p.units.values().map(|u| u.requests).sum();
        let unlabelled: u64 = p.units.values().map(|u| u.latencies).sum();
        assert_eq!((matured, unlabelled), (5, 1));
    }

    /// A pair answered at `at_ms` whose label (`1`) came at `label_ms`.
    fn timed(id: &str, at_ms: u64, label_ms: Option<u64>, classes: (&str, &str)) -> [Recorded; 2] {
        let mut h = row(id, "h", classes.0, label_ms.map(|_| "1"));
        let mut c = row(id, "c", classes.1, label_ms.map(|_| "1"));
        for r in [&mut h, &mut c] {
            r.at_ms = at_ms;
            r.labelled_at_ms = label_ms;
        }
        [h, c]
    }

    #[test]
    fn only_matured_pairs_count_each_with_the_label_it_had_at_its_window_end() {
        let gate = QualityGate::default();
        let rows: Vec<Recorded> = [
            // Matured, labelled in time: the candidate wrong.
            timed("a", 0, Some(5_000), ("1", "0")),
            // Matured, labelled after its window: not counted.
            timed("b", 0, Some(15_000), ("1", "0")),
            // Matured, never labelled.
            timed("cc", 1_000, None, ("0", "1")),
            // Not yet matured, though labelled.
            timed("d", 9_000, Some(9_500), ("0", "1")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let at = |absent| Maturity {
            now_ms: 11_000,
            window_ms: 10_000,
            absent,
        };
        let p = paired(&rows, ("h", "c"), &gate, at(None));
        assert_eq!((p.recorded, p.matured, p.labelled), (4, 3, 1));
        assert_eq!((p.candidate_only_wrong, p.champion_only_wrong), (1, 0));
        assert_eq!((p.unlabelled(), p.pending()), (2, 1));
        // With a declared meaning of no label ("0"), every matured pair is
        // judged: "b" (its label too late) and "cc" by "0".
        let p = paired(&rows, ("h", "c"), &gate, at(Some("0")));
        assert_eq!((p.matured, p.labelled, p.unlabelled()), (3, 3, 0));
        assert_eq!((p.candidate_only_wrong, p.champion_only_wrong), (2, 1));
        // CANARY: each arm's answers, matured or pending, by class.
        let single: Vec<Recorded> = rows
            .iter()
            .filter(|r| r.request_id != "a" || r.revision == "c")
            .cloned()
            .collect();
        let one_arm: Vec<Recorded> = single
            .into_iter()
            .filter(|r| r.request_id == "a" || r.revision == "h")
            .collect();
        let e = unpaired(&one_arm, ("h", "c"), (&gate, at(None)), 0);
        let l = &e[&1];
        assert_eq!(
            (
                l.candidate.recorded,
                l.candidate.labelled,
                l.candidate.wrong
            ),
            (1, 1, 1)
        );
        assert_eq!(
            (l.champion.recorded, l.champion.labelled, l.champion.pending),
            (2, 0, 1)
        );
        assert_eq!(
            l.champion.by_class["1"],
            ClassCoverage {
                matured: 1,
                labelled: 0
            }
        );
        assert_eq!(
            l.candidate.by_class["0"],
            ClassCoverage {
                matured: 1,
                labelled: 1
            }
        );
    }

    #[test]
    fn a_regression_answer_is_wrong_beyond_its_tolerance_and_an_unreadable_label_is_no_label() {
        let gate = QualityGate {
            kind: QualityKind::Regression,
            tolerance: 0.5,
            ..QualityGate::default()
        };
        let mut r = row("a", "h", "x", None);
        r.class = None;
        r.value = Some(10.0);
        assert_eq!(wrong(&gate, &r, "10.4"), Some(false));
        assert_eq!(wrong(&gate, &r, "9.4"), Some(true));
        assert_eq!(wrong(&gate, &r, "ten"), None);
        assert_eq!(wrong(&gate, &r, "NaN"), None);
        r.value = Some(f64::NAN);
        assert_eq!(wrong(&gate, &r, "10"), Some(true), "a NaN answer is wrong");
        r.value = Some(10.0);
        let classification = QualityGate::default();
        assert_eq!(
            wrong(&classification, &r, "10"),
            None,
            "no class to compare"
        );
    }
}

#[cfg(test)]
mod roundtrip {
    #[test]
    fn a_quality_verdict_reads_back_as_written() {
        use crate::gate::{Evidence, GateKind, GateVerdict, Outcome, Reason};
        let mut pairs = super::PairedLabels::default();
        pairs.units.insert(
            3,
            crate::unit::UnitTotals {
                requests: 2,
                failures: 1,
                ..Default::default()
            },
        );
        let v = GateVerdict::new(
            GateKind::Quality,
            Outcome::Wait,
            Reason::Inconclusive,
            Evidence::Quality {
                pairs,
                difference: crate::stats::Interval {
                    lower: -0.5,
                    upper: 0.5,
                },
                margin: 0.05,
                e_value: 1.0,
                fail_at: 80.0,
                design_effect: 1.0,
                max_error_ratio: 1.0,
                coverage: 0.5,
                min_coverage: 0.0,
                canary: None,
                label_window_ms: 60_000,
                unlabelled: crate::plan::Unlabelled::AtRandom,
            },
        );
        let text = serde_json::to_string(&v).expect("serialises");
        let back: GateVerdict =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        // The unit groups are not kept: the design effect they gave is.
        let mut v = v;
        if let Evidence::Quality { pairs, .. } = &mut v.evidence {
            pairs.units.clear();
        }
        assert_eq!(back, v);
    }
}
