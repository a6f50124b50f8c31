//! Verdicts in plain words, for people: the CLI prints them, the admin
//! API serves them to the dashboard, so both say the same thing.

use crate::gate::{Evidence, QuantileComparison};
use crate::{GateVerdict, Outcome, Phase, RollbackReason, StageVerdict};

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn ms(us: Option<u64>) -> String {
    us.map_or("?".into(), |v| format!("{:.1}ms", v as f64 / 1000.0))
}

fn outcome(o: Outcome) -> &'static str {
    match o {
        Outcome::Pass => "PASS",
        Outcome::Wait => "WAIT",
        Outcome::Fail => "FAIL",
    }
}

fn quantile(name: &str, q: &QuantileComparison) -> String {
    format!(
        "{name} candidate {} [{}, {}] vs champion {} [{}, {}]",
        ms(Some(q.candidate.estimate_us)),
        ms(q.candidate.lower_us),
        ms(q.candidate.upper_us),
        ms(Some(q.champion.estimate_us)),
        ms(q.champion.lower_us),
        ms(q.champion.upper_us),
    )
}

/// One line per gate: its outcome, reason and the numbers behind it.
pub fn gate_line(g: &GateVerdict) -> String {
    let reason = serde_reason(g);
    let detail = match &g.evidence {
        Evidence::ErrorRate {
            candidate,
            champion,
            difference,
            margin,
            e_value,
            client_error_e_value,
            pass_e_value,
            design_effect,
            ..
        } => format!(
            "candidate {}/{} failed ({}), champion {}/{} ({}); difference in [{}, {}], margin {}{}{}{}{}",
            candidate.failures,
            candidate.requests,
            pct(candidate.rate),
            champion.failures,
            champion.requests,
            pct(champion.rate),
            pct(difference.lower),
            pct(difference.upper),
            pct(*margin),
            e_value.map_or(String::new(), |e| format!("; e-value {e:.3}")),
            client_error_e_value.map_or(String::new(), |e| format!(", client errors {e:.3}")),
            pass_e_value.map_or(String::new(), |e| format!(", not worse {e:.3}")),
            design_effect.map_or(String::new(), |d| format!("; design effect {d:.2}"))
        ),
        Evidence::Latency { median, tail, .. } => match (median, tail) {
            (Some(m), Some(t)) => format!("{}; {}", quantile("p50", m), quantile("p95", t)),
            _ => "no latency samples yet".into(),
        },
        Evidence::PredictionShift {
            classes,
            margin,
            e_value,
            max_class_ratio,
            ..
        } => {
            let worst = classes.iter().max_by(|a, b| {
                let wa = a.difference.lower.abs().max(a.difference.upper.abs());
                let wb = b.difference.lower.abs().max(b.difference.upper.abs());
                wa.total_cmp(&wb)
            });
            let budget = match (e_value, max_class_ratio) {
                (Some(e), Some(r)) => {
                    format!("class rates within {r}x of the champion's; e-value {e:.3}")
                }
                _ => format!("margin ±{}", pct(*margin)),
            };
            match worst {
                Some(c) => format!(
                    "class {:?}: candidate {} vs champion {}, difference in [{}, {}]; {budget}",
                    c.class,
                    pct(c.candidate_rate),
                    pct(c.champion_rate),
                    pct(c.difference.lower),
                    pct(c.difference.upper),
                ),
                None => "no predictions yet".into(),
            }
        }
        Evidence::ShadowAgreement {
            pairs,
            agreements,
            agreement,
            min_agreement,
            champion_confident,
            confident_flips,
            flip_rate,
            max_flip_rate,
            ..
        } => format!(
            "{agreements}/{pairs} pairs agreed, agreement in [{}, {}] (need >= {}); \
             {confident_flips}/{champion_confident} high-confidence decisions flipped, in [{}, {}] (allowed <= {})",
            pct(agreement.lower),
            pct(agreement.upper),
            pct(*min_agreement),
            pct(flip_rate.lower),
            pct(flip_rate.upper),
            pct(*max_flip_rate)
        ),
        Evidence::GuardRails {
            candidate,
            error_rate,
            p95,
            ..
        } => format!(
            "candidate {}/{} failed, rate in [{}, {}]; p95 {}",
            candidate.failures,
            candidate.requests,
            pct(error_rate.lower),
            pct(error_rate.upper),
            ms(p95.map(|b| b.estimate_us))
        ),
    };
    format!(
        "{:<17} {} ({reason}): {detail}",
        g.gate.as_str(),
        outcome(g.outcome)
    )
}

fn serde_reason(g: &GateVerdict) -> String {
    use crate::Reason::*;
    match &g.reason {
        WithinBudget => "within budget".into(),
        InsufficientSamples { have, need } => format!("{have}/{need} samples"),
        ChampionNoVerdict { have, need } => format!("champion has {have}/{need} samples"),
        Inconclusive => "inconclusive".into(),
        Breach => "breach".into(),
        GrossBreach => "gross breach".into(),
        MetricsMissing { metric } => format!("{metric} missing"),
        NotEvaluated { what } => format!("not evaluated: {what}"),
    }
}

/// A phase as a stage label: `SHADOW`, `CANARY 25%`, `PROMOTED`, ….
pub fn stage_label(p: &Phase) -> String {
    match p {
        Phase::Canary { weight_percent, .. } => format!("CANARY {weight_percent}%"),
        other => other.name().to_string(),
    }
}

/// The final phase in words.
pub fn phase_line(p: &Phase) -> String {
    match p {
        Phase::Promoted { manual: false } => "PROMOTED: every stage passed".into(),
        Phase::Promoted { manual: true } => "PROMOTED by an operator".into(),
        Phase::RolledBack { reason } => format!("ROLLED BACK: {}", rollback_words(reason)),
        Phase::Aborted => "ABORTED by an operator".into(),
        other => format!("unfinished, still {}", other.name()),
    }
}

/// The phase of a rollout under `plan` in words: a dry run (`mode =
/// "observe"`) says so, and that its ending changed nothing.
pub fn rollout_phase_line(plan: &crate::Plan, p: &Phase) -> String {
    match (plan.mode, p.is_terminal()) {
        (crate::Mode::Enforce, _) => phase_line(p),
        (crate::Mode::Observe, false) => format!(
            "DRY RUN (routing and registry unchanged): {}",
            phase_line(p)
        ),
        (crate::Mode::Observe, true) => format!(
            "DRY RUN, nothing was changed; a real rollout would have ended {}",
            phase_line(p)
        ),
    }
}

/// What an automatic promotion under `plan` guarantees, in words.
pub fn promotion_line(plan: &crate::Plan) -> String {
    use crate::{Advance, Policy};
    if plan.mode == crate::Mode::Observe {
        return "dry run: the champion is unchanged; start a rollout (mode = \"enforce\") to promote".into();
    }
    match (plan.policy, plan.sequential.advance) {
        (Policy::Sequential, Advance::OnTime) => format!(
            "guarantee: no regression was shown (advance = on_time); a regression too small \
             for the stages' traffic to show may remain. The chance that a candidate no worse \
             was ever rolled back stays below alpha = {}",
            plan.sequential.alpha
        ),
        (Policy::Sequential, Advance::OnEvidence) => format!(
            "guarantee: every gate showed the candidate within its margin (advance = \
             on_evidence; failure rate below {}x the champion's), anytime-valid at alpha = {}",
            plan.sequential.non_inferiority_ratio, plan.sequential.alpha
        ),
        (Policy::Windowed, _) => format!(
            "guarantee: every gate passed its fixed-window bound in every stage (alpha = {} \
             per bound, not corrected for repeated looks)",
            plan.alpha
        ),
    }
}

/// Whether a rollback rejected (blocked) the candidate, in words.
pub fn rejection_line(r: &RollbackReason, plan: &crate::Plan) -> String {
    if plan.mode == crate::Mode::Observe {
        let would = if r.rejects(plan) {
            "would have"
        } else {
            "would not have"
        };
        return format!(
            "dry run: candidate not rejected (a real rollout's rollback {would} rejected it)"
        );
    }
    if r.rejects(plan) {
        "candidate REJECTED: blocked from new rollouts until an operator unblocks it".into()
    } else {
        "candidate not rejected: no regression was shown, it may be rolled out again".into()
    }
}

fn rollback_words(r: &RollbackReason) -> String {
    let names = |g: &[crate::GateKind]| g.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
    match r {
        RollbackReason::ReadinessTimeout => "the candidate never became ready".into(),
        RollbackReason::RoutingNotApplied { epoch } => {
            format!("the data plane never confirmed the routing of epoch {epoch}")
        }
        RollbackReason::Breach {
            gates,
            confirmations,
        } => format!(
            "{} breached in {confirmations} consecutive windows",
            names(gates)
        ),
        RollbackReason::GrossBreach { gates } => format!("gross breach of {}", names(gates)),
        RollbackReason::EvidenceTimeout { gates } => {
            format!("not enough evidence by the deadline ({})", names(gates))
        }
        RollbackReason::MetricsMissing { gates } => {
            format!("traffic seen but metrics missing ({})", names(gates))
        }
        RollbackReason::AnytimeBreach { gates } => {
            format!(
                "{} shown worse than the champion (anytime-valid test)",
                names(gates)
            )
        }
        RollbackReason::ApprovalTimeout { before } => {
            format!("nobody approved {before} by the plan's deadline")
        }
    }
}

/// A string from a user or the network, made safe for a terminal: every
/// control character (escape sequences, line breaks, carriage returns) is
/// shown escaped, so a reason cannot redraw the screen or fake a row.
pub fn clean(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// The stage verdict's gates, one line each (class names come from model
/// outputs: cleaned).
pub fn verdict_lines(v: &StageVerdict) -> Vec<String> {
    let mut lines: Vec<String> = v
        .gates
        .iter()
        .map(|g| clean(&gate_line(g)).into_owned())
        .collect();
    if let Some(c) = &v.confirmation
        && c.breached
    {
        lines.push(format!(
            "confirmation window breached ({} of {} needed)",
            c.consecutive_breaches, c.needed
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GateKind, Plan, plan::RejectOn};

    #[test]
    fn a_rollback_says_whether_it_rejected_the_candidate() {
        let plan = Plan::default();
        let breach = RollbackReason::AnytimeBreach {
            gates: vec![GateKind::ErrorRate],
        };
        let starved = RollbackReason::EvidenceTimeout { gates: vec![] };
        assert!(rejection_line(&breach, &plan).starts_with("candidate REJECTED"));
        assert!(rejection_line(&RollbackReason::ReadinessTimeout, &plan).contains("REJECTED"));
        assert!(rejection_line(&starved, &plan).starts_with("candidate not rejected"));
        let strict = Plan {
            reject_on: RejectOn::AnyRollback,
            ..Plan::default()
        };
        assert!(rejection_line(&starved, &strict).starts_with("candidate REJECTED"));
    }

    #[test]
    fn control_characters_from_users_are_shown_escaped() {
        let fake = "ok\u{1b}[2K\r#9 controller promoted\nall gates PASS";
        let shown = clean(fake);
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert!(
            shown.contains("\\u{1b}") && shown.contains("\\n"),
            "{shown}"
        );
        assert!(matches!(
            clean("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
    }

    #[test]
    fn a_promotion_says_what_it_guarantees_under_each_advance_mode() {
        let mut plan = Plan::default();
        assert!(promotion_line(&plan).contains("no regression was shown"));
        plan.sequential.advance = crate::Advance::OnEvidence;
        assert!(promotion_line(&plan).contains("within its margin"));
        plan.policy = crate::Policy::Windowed;
        assert!(promotion_line(&plan).contains("fixed-window"));
    }
}
