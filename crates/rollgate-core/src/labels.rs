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
    /// Of those, the ones whose label came and could be compared.
    pub labelled: u64,
    /// The candidate wrong, the champion right.
    pub candidate_only_wrong: u64,
    /// The champion wrong, the candidate right.
    pub champion_only_wrong: u64,
    pub both_wrong: u64,
    /// Per unit group: `requests` the labelled pairs, `failures` those the
    /// candidate alone got wrong, `client_errors` those the champion alone
    /// got wrong (the tests' unit is the key). Not kept with a verdict: the
    /// design effects it gave are.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub units: Units,
}

impl PairedLabels {
    /// The labelled share of the recorded pairs (0 with none recorded).
    pub fn coverage(&self) -> f64 {
        if self.recorded == 0 {
            0.0
        } else {
            self.labelled as f64 / self.recorded as f64
        }
    }

    pub fn discordant(&self) -> u64 {
        self.candidate_only_wrong + self.champion_only_wrong
    }
}

/// The pairs in `rows`: requests answered by both `champion` and
/// `candidate`, each judged by its label under `gate`.
pub fn paired(
    rows: &[Recorded],
    champion: &str,
    candidate: &str,
    gate: &QualityGate,
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
        let Some(label) = h.label.as_deref().or(c.label.as_deref()) else {
            continue;
        };
        let (Some(hw), Some(cw)) = (wrong(gate, h, label), wrong(gate, c, label)) else {
            continue;
        };
        out.labelled += 1;
        let unit = out.units.entry(c.unit).or_insert_with(UnitTotals::default);
        unit.requests += 1;
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

/// One arm's answers in CANARY epochs: recorded, labelled (comparably),
/// and wrong by their labels, per unit group too (`latencies` recorded,
/// `requests` labelled, `failures` wrong).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArmLabels {
    pub recorded: u64,
    pub labelled: u64,
    pub wrong: u64,
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub units: Units,
}

impl ArmLabels {
    fn add(&mut self, unit: u16, wrong: Option<bool>) {
        self.recorded += 1;
        self.units.entry(unit).or_default().latencies += 1;
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
        ArmLabels {
            recorded: self.recorded + o.recorded,
            labelled: self.labelled + o.labelled,
            wrong: self.wrong + o.wrong,
            units,
        }
    }

    /// The labelled share of the recorded answers (0 with none).
    pub fn coverage(&self) -> f64 {
        if self.recorded == 0 {
            0.0
        } else {
            self.labelled as f64 / self.recorded as f64
        }
    }
}

/// Both arms' answers in one epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochLabels {
    pub candidate: ArmLabels,
    pub champion: ArmLabels,
}

/// The answers in `rows` that are no mirrored pair (a CANARY stage's: each
/// request answered by one arm), per epoch from `from` on, each judged by
/// its label under `gate`.
pub fn unpaired(
    rows: &[Recorded],
    (champion, candidate): (&str, &str),
    gate: &QualityGate,
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
        arm.add(r.unit, r.label.as_deref().and_then(|l| wrong(gate, r, l)));
    }
    out
}

/// What the CANARY stages' unpaired test saw: each arm's answers over
/// the canary epochs, and whether their label coverage was shown to
/// differ.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CanaryLabels {
    pub candidate: ArmLabels,
    pub champion: ArmLabels,
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
        }
    }

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
        let p = paired(&rows, "h", "c", &gate);
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
        let labelled: u64 = p.units.values().map(|u| u.requests).sum();
        assert_eq!(labelled, 4);
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
