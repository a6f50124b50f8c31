//! Verdicts in plain words, for people: the CLI prints them, the admin
//! API serves them to the dashboard, so both say the same thing.

use crate::gate::{ClassShift, Counts, Evidence, Negligible, QuantileComparison, ShadowShown};
use crate::histogram::QuantileBounds;
use crate::stats::Interval;
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

/// A number as people read it: three significant digits, powers of ten
/// for the very large and very small (an e-value of 1.4e15, not fifteen
/// digits).
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() { "?".into() } else { "∞".into() };
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e4).contains(&a) {
        format!("{x:.1e}").replace(".0e", "e")
    } else {
        let magnitude = a.log10().floor() as i32;
        let digits = (2 - magnitude).max(0) as usize;
        // Three significant figures, also above 999 (1234.6 is 1230).
        let step = 10f64.powi(magnitude - 2);
        let x = (x / step).round() * step;
        let s = format!("{x:.digits$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

/// `k/n failed (rate)`, and the client errors beside when `with_4xx`.
fn arm_counts(c: &Counts, with_4xx: bool) -> String {
    let mut s = format!("{}/{} failed ({})", c.failures, c.requests, pct(c.rate));
    if with_4xx {
        s.push_str(&format!(
            ", {}/{} answers 4xx ({})",
            c.client_errors,
            c.answers(),
            pct(crate::stats::rate(c.client_errors, c.answers()))
        ));
    }
    s
}

/// Both arms' counts, with client errors for both when either had any.
fn both_arms(candidate: &Counts, champion: &Counts) -> String {
    let with_4xx = candidate.client_errors + champion.client_errors > 0;
    format!(
        "candidate {}; champion {}",
        arm_counts(candidate, with_4xx),
        arm_counts(champion, with_4xx)
    )
}

/// An e-value against the value it is judged at.
fn e_against(name: &str, e: f64, at: Option<f64>, verb: &str) -> String {
    match at {
        Some(t) => format!("{name} e-value {} ({verb} at {})", number(e), number(t)),
        None => format!("{name} e-value {}", number(e)),
    }
}

/// Whether one-sided test's result, in words.
fn shown(yes: bool, what: &str) -> String {
    if yes {
        format!("shown {what}")
    } else {
        format!("not shown {what}")
    }
}

/// A gate's line: its outcome, reason and the numbers its test used; then (indented) the strata its test compared within:
/// the statistics printed are those that decided, and pooled totals are
/// labelled as such.
pub fn gate_lines(g: &GateVerdict) -> Vec<String> {
    let reason = serde_reason(g);
    let detail = evidence_words(&g.evidence);
    let mut lines = vec![format!(
        "{:<17} {} ({reason}): {detail}",
        g.gate.as_str(),
        outcome(g.outcome)
    )];
    lines.extend(lines_beneath(&g.evidence));
    lines
}

/// A gate in a few words, for a column (`kubectl get`): its outcome and
/// its reason, without the test's statistics (`error_rate WAIT
/// (inconclusive)`, `latency WAIT (120/200 samples)`).
pub fn gate_summary(g: &GateVerdict) -> String {
    format!(
        "{} {} ({})",
        g.gate.as_str(),
        outcome(g.outcome),
        serde_reason(g)
    )
}

/// The numbers a gate's test used, one kind of evidence at a time: what
/// the `sequential` tests showed where they decided, the bounds otherwise.
fn evidence_words(evidence: &Evidence) -> String {
    match evidence {
        Evidence::ErrorRate {
            e_value: Some(e),
            client_error_e_value,
            pass_e_value,
            design_effect,
            client_error_design_effect,
            negligible,
            fail_at,
            pass_at,
            epochs,
            ..
        } => {
            let mut tests =
                error_e_values(*e, *client_error_e_value, *pass_e_value, *fail_at, *pass_at);
            tests.extend(negligible.as_ref().map(negligible_test));
            tests.extend(design_effects(*design_effect, *client_error_design_effect));
            compared_within(&tests, epochs.len())
        }
        Evidence::ErrorRate {
            candidate,
            champion,
            difference,
            margin,
            ..
        } => format!(
            "{}; {}",
            both_arms(candidate, champion),
            difference_against_margin(difference, *margin)
        ),
        Evidence::Latency { median, tail, .. } => latency_words(median.as_ref(), tail.as_ref()),
        Evidence::PredictionShift {
            classes,
            margin,
            e_value,
            max_class_ratio,
            fail_at,
            ..
        } => prediction_shift_words(classes, *margin, *e_value, *max_class_ratio, *fail_at),
        Evidence::ShadowAgreement {
            pairs,
            agreements,
            min_agreement,
            champion_confident,
            confident_flips,
            max_flip_rate,
            shown: Some(t),
            ..
        } => format!(
            "{}; {}",
            agreement_shown(*agreements, *pairs, t, *min_agreement),
            flips_shown(*confident_flips, *champion_confident, t, *max_flip_rate)
        ),
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
            "{}; {}",
            agreement_bounds(*agreements, *pairs, agreement, *min_agreement),
            flips_bounds(
                *confident_flips,
                *champion_confident,
                flip_rate,
                *max_flip_rate
            )
        ),
        Evidence::GuardRails {
            candidate,
            error_rate,
            p95,
            ..
        } => guard_rail_words(candidate, error_rate, p95.as_ref()),
        Evidence::Quality { .. } => quality_words(evidence),
    }
}

/// The quality gate's test and the matured answers it read.
fn quality_words(evidence: &Evidence) -> String {
    let Evidence::Quality {
        pairs,
        difference,
        margin,
        e_value,
        fail_at,
        canary,
        label_window_ms,
        ..
    } = evidence
    else {
        return String::new();
    };
    let test = format!(
        "{}; {}",
        e_against("against the candidate", *e_value, Some(*fail_at), "fails"),
        difference_against_margin(difference, *margin)
    );
    match canary {
        Some(c) => canary_quality_words(c, *label_window_ms, &test),
        None => paired_quality_words(pairs, *label_window_ms, &test),
    }
}

/// How old an answer must be to be judged, in words (`None`: no window).
fn window_words(window_ms: u64) -> Option<String> {
    (window_ms > 0).then(|| {
        humantime::format_duration(std::time::Duration::from_millis(window_ms)).to_string()
    })
}

/// The SHADOW (and watch) test's matured labelled pairs.
fn paired_quality_words(p: &crate::labels::PairedLabels, window_ms: u64, test: &str) -> String {
    let pending = match window_words(window_ms) {
        Some(w) => format!("; {} younger than {w}", p.pending()),
        None => String::new(),
    };
    format!(
        "{} of {} matured pairs labelled ({}{pending}); discordant: candidate wrong {}, \
         champion wrong {}; {test}",
        p.labelled,
        p.matured,
        pct(p.coverage()),
        p.candidate_only_wrong,
        p.champion_only_wrong,
    )
}

/// The CANARY test's matured answers of each arm.
fn canary_quality_words(c: &crate::labels::CanaryLabels, window_ms: u64, test: &str) -> String {
    let arm = |name: &str, a: &crate::labels::ArmLabels| {
        format!(
            "{name} {} of {} matured answers labelled, {} wrong",
            a.labelled, a.recorded, a.wrong
        )
    };
    let pending = match window_words(window_ms) {
        Some(w) => format!(
            " ({} younger than {w})",
            c.candidate.pending + c.champion.pending
        ),
        None => String::new(),
    };
    format!(
        "{}; {}{pending}; {test}",
        arm("candidate", &c.candidate),
        arm("champion", &c.champion)
    )
}

/// Each arm's matured answers labelled, by the class it answered.
fn coverage_by_class(c: &crate::labels::CanaryLabels) -> String {
    let arm = |a: &crate::labels::ArmLabels| {
        a.by_class
            .iter()
            .map(|(k, v)| {
                let share = if v.matured == 0 {
                    0.0
                } else {
                    v.labelled as f64 / v.matured as f64
                };
                format!("{k:?} {} of {}", pct(share), v.matured)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "  labelled by the class answered: candidate {}; champion {}",
        arm(&c.candidate),
        arm(&c.champion)
    )
}

/// The indented lines beneath a gate's line, for the `sequential` tests:
/// the epochs the error tests compared within and the pooled totals, or
/// the shadow's anytime bounds; none for the rest.
fn lines_beneath(evidence: &Evidence) -> Vec<String> {
    match evidence {
        Evidence::ErrorRate {
            candidate,
            champion,
            difference,
            margin,
            e_value: Some(_),
            epochs,
            ..
        } => {
            let mut lines: Vec<String> = epochs
                .iter()
                .map(|ep| {
                    format!(
                        "  epoch {}: {}",
                        ep.epoch,
                        both_arms(&ep.candidate, &ep.champion)
                    )
                })
                .collect();
            lines.push(format!(
                "  pooled over the rollout (read, not tested): {}; {}",
                both_arms(candidate, champion),
                difference_against_margin(difference, *margin),
            ));
            lines
        }
        Evidence::ShadowAgreement {
            agreement,
            flip_rate,
            shown: Some(_),
            ..
        } => vec![format!(
            "  anytime bounds (read, not tested): agreement in [{}, {}], flips in [{}, {}]",
            pct(agreement.lower),
            pct(agreement.upper),
            pct(flip_rate.lower),
            pct(flip_rate.upper),
        )],
        Evidence::Quality {
            canary: Some(c), ..
        } if !(c.candidate.by_class.is_empty() && c.champion.by_class.is_empty()) => {
            vec![coverage_by_class(c)]
        }
        _ => Vec::new(),
    }
}

/// `difference in [lower, upper], margin m`.
fn difference_against_margin(difference: &Interval, margin: f64) -> String {
    format!(
        "difference in [{}, {}], margin {}",
        pct(difference.lower),
        pct(difference.upper),
        pct(margin),
    )
}

/// The error gate's e-values, each against the value it is judged at:
/// failures, client errors (4xx) when tested, and not-worse when tested.
fn error_e_values(
    failures: f64,
    client_errors: Option<f64>,
    not_worse: Option<f64>,
    fail_at: Option<f64>,
    pass_at: Option<f64>,
) -> Vec<String> {
    let mut tests = vec![e_against("failures", failures, fail_at, "fails")];
    if let Some(ce) = client_errors {
        tests.push(e_against("client errors (4xx)", ce, fail_at, "fails"));
    }
    if let Some(p) = not_worse {
        tests.push(e_against("not worse", p, pass_at, "passes"));
    }
    tests
}

/// The candidate's own failure rate against the negligible rate.
fn negligible_test(n: &Negligible) -> String {
    let below = n.upper < n.limit;
    format!(
        "own failure rate below {} ({} the negligible {})",
        pct(n.upper),
        if below { "under" } else { "not under" },
        pct(n.limit)
    )
}

/// The design effects the error tests were tempered by, if any.
fn design_effects(failures: Option<f64>, client_errors: Option<f64>) -> Option<String> {
    match (failures, client_errors) {
        (Some(d), Some(dc)) => Some(format!("design effect {} (4xx {})", number(d), number(dc))),
        (Some(d), None) => Some(format!("design effect {}", number(d))),
        _ => None,
    }
}

/// The tests, and how many epochs they compared within (when any).
fn compared_within(tests: &[String], epochs: usize) -> String {
    match epochs {
        0 => tests.join(", "),
        n => format!(
            "{}; compared within {n} epoch{}",
            tests.join(", "),
            if n == 1 { "" } else { "s" }
        ),
    }
}

/// Both arms' median and tail, once both have samples.
fn latency_words(median: Option<&QuantileComparison>, tail: Option<&QuantileComparison>) -> String {
    match (median, tail) {
        (Some(m), Some(t)) => format!("{}; {}", quantile("p50", m), quantile("p95", t)),
        _ => "no latency samples yet".into(),
    }
}

/// The class whose rates differ most (either way), with the class-mix
/// test before it when `sequential` tested one (the class's bounds are
/// then read, not tested), else against the windowed margin.
fn prediction_shift_words(
    classes: &[ClassShift],
    margin: f64,
    e_value: Option<f64>,
    max_class_ratio: Option<f64>,
    fail_at: Option<f64>,
) -> String {
    let worst = classes.iter().max_by(|a, b| {
        let wa = a.difference.lower.abs().max(a.difference.upper.abs());
        let wb = b.difference.lower.abs().max(b.difference.upper.abs());
        wa.total_cmp(&wb)
    });
    let (test, read) = match (e_value, max_class_ratio) {
        (Some(e), Some(r)) => (
            format!(
                "class rates within {}x of the champion's: {}; ",
                number(r),
                e_against("class mix", e, fail_at, "fails")
            ),
            " (read, not tested)",
        ),
        _ => (String::new(), ""),
    };
    match worst {
        Some(c) => format!(
            "{test}class {:?}: candidate {} vs champion {}, difference in [{}, {}]{read}{}",
            c.class,
            pct(c.candidate_rate),
            pct(c.champion_rate),
            pct(c.difference.lower),
            pct(c.difference.upper),
            if read.is_empty() {
                format!("; margin ±{}", pct(margin))
            } else {
                String::new()
            }
        ),
        None => "no predictions yet".into(),
    }
}

/// The shadow's agreement as its `sequential` test showed it against
/// `min_agreement`.
fn agreement_shown(agreements: u64, pairs: u64, t: &ShadowShown, min_agreement: f64) -> String {
    let test = if t.agreement_below {
        shown(true, &format!("below the required {}", pct(min_agreement)))
    } else if t.agreement_above || t.within {
        shown(true, &format!("at or above {}", pct(min_agreement)))
    } else {
        shown(false, &format!("either side of {}", pct(min_agreement)))
    };
    format!(
        "{agreements}/{pairs} pairs agreed ({}), {test}",
        pct(crate::stats::rate(agreements, pairs))
    )
}

/// The shadow's confident flips as their `sequential` test showed them
/// against `max_flip_rate` (not tested at 100%).
fn flips_shown(flips: u64, confident: u64, t: &ShadowShown, max_flip_rate: f64) -> String {
    let test = if max_flip_rate >= 1.0 {
        "not tested (max_flip_rate = 100%)".to_string()
    } else if t.flips_above {
        shown(true, &format!("above the allowed {}", pct(max_flip_rate)))
    } else if t.flips_below || t.within {
        shown(true, &format!("at or below {}", pct(max_flip_rate)))
    } else {
        shown(false, &format!("either side of {}", pct(max_flip_rate)))
    };
    format!(
        "{flips}/{confident} high-confidence decisions flipped ({}), {test}",
        pct(crate::stats::rate(flips, confident))
    )
}

/// The shadow's agreement bound against `min_agreement` (`windowed`).
fn agreement_bounds(
    agreements: u64,
    pairs: u64,
    agreement: &Interval,
    min_agreement: f64,
) -> String {
    format!(
        "{agreements}/{pairs} pairs agreed, agreement in [{}, {}] (need >= {})",
        pct(agreement.lower),
        pct(agreement.upper),
        pct(min_agreement),
    )
}

/// The shadow's confident-flip bound against `max_flip_rate` (`windowed`).
fn flips_bounds(flips: u64, confident: u64, flip_rate: &Interval, max_flip_rate: f64) -> String {
    format!(
        "{flips}/{confident} high-confidence decisions flipped, in [{}, {}] (allowed <= {})",
        pct(flip_rate.lower),
        pct(flip_rate.upper),
        pct(max_flip_rate)
    )
}

/// The candidate's own failures and p95 against the guard rails.
fn guard_rail_words(
    candidate: &Counts,
    error_rate: &Interval,
    p95: Option<&QuantileBounds>,
) -> String {
    format!(
        "candidate {}, rate in [{}, {}]; p95 {}",
        arm_counts(candidate, candidate.client_errors > 0),
        pct(error_rate.lower),
        pct(error_rate.upper),
        ms(p95.map(|b| b.estimate_us))
    )
}

fn serde_reason(g: &GateVerdict) -> String {
    use crate::Reason::*;
    match &g.reason {
        WithinBudget => "within budget".into(),
        InsufficientSamples { have, need } => format!("{have}/{need} samples"),
        TooFewKeys { groups, need, keys } => {
            let about = keys.map_or(String::new(), |k| {
                format!(
                    "; the model's traffic carries about {k} keys: {}",
                    crate::keys::advice(k)
                )
            });
            format!(
                "the candidate's requests come from {groups} of the {need} key groups needed \
                 to judge per key{about}"
            )
        }
        ChampionNoVerdict { have, need } => format!("champion has {have}/{need} samples"),
        Inconclusive => "inconclusive".into(),
        Breach => "breach".into(),
        GrossBreach => "gross breach".into(),
        MetricsMissing { metric } => format!("{metric} missing"),
        NotEvaluated { what } => format!("not evaluated: {what}"),
        LabelCoverageDiffers {
            candidate_labelled,
            candidate_recorded,
            champion_labelled,
            champion_recorded,
        } => format!(
            "label coverage differs between the arms (candidate {candidate_labelled}/\
             {candidate_recorded}, champion {champion_labelled}/{champion_recorded}): held"
        ),
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
        Phase::Watching { .. } => "PROMOTED and WATCHING: labels judge it against the previous \
                                   champion, mirrored, until the watch's window ends"
            .into(),
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
        RollbackReason::TooFewKeys {
            keys,
            weight_percent,
        } => format!(
            "a {weight_percent}% stage of about {keys} keys holds too few of them to be \
             judged per key: {}",
            crate::keys::advice(*keys)
        ),
        RollbackReason::AnytimeBreach { gates } => {
            format!(
                "{} shown worse than the champion (anytime-valid test)",
                names(gates)
            )
        }
        RollbackReason::ApprovalTimeout { before } => {
            format!("nobody approved {before} by the plan's deadline")
        }
        RollbackReason::LabelTimeout { labelled, recorded } => format!(
            "the quality gate had no verdict by its label deadline (too few labels, or the \
             arms' label coverage differed; {labelled} of the candidate's {recorded} recorded \
             answers labelled)"
        ),
        RollbackReason::WatchRegression { gates } => format!(
            "after promotion, {} shown worse than the previous champion in the watch \
             (anytime-valid test on labels); the previous champion is champion again",
            names(gates)
        ),
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
        .flat_map(gate_lines)
        .map(|l| clean(&l).into_owned())
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

    /// Few keys are said with the keys and what works, while a gate waits
    /// and when the stage fails; the candidate is not rejected.
    #[test]
    fn too_few_keys_say_how_many_and_what_works() {
        use crate::gate::{Evidence, GateVerdict, Reason};
        let evidence = Evidence::Latency {
            candidate_successes: 40,
            champion_successes: 900,
            median: None,
            tail: None,
        };
        let reason = Reason::TooFewKeys {
            groups: 1,
            need: 8,
            keys: Some(12),
        };
        let g = GateVerdict::new(GateKind::Latency, crate::Outcome::Wait, reason, evidence);
        let line = gate_lines(&g).join("\n");
        assert!(
            line.contains("about 12 keys") && line.contains("67%"),
            "{line}"
        );
        let failed = RollbackReason::TooFewKeys {
            keys: 12,
            weight_percent: 5,
        };
        let said = rollback_words(&failed);
        assert!(
            said.contains("5% stage of about 12 keys") && said.contains("per_request"),
            "{said}"
        );
        assert!(rejection_line(&failed, &Plan::default()).starts_with("candidate not rejected"));
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

    /// Each SHADOW test is worded by what it showed, on its own: agreement
    /// shown above its minimum while the flip test is undecided says both.
    #[test]
    fn each_shadow_test_says_what_it_showed() {
        use crate::gate::{Evidence, ShadowShown};
        use crate::stats::Interval;
        let i = Interval {
            lower: 0.0,
            upper: 1.0,
        };
        let verdict = |shown| GateVerdict {
            gate: GateKind::ShadowAgreement,
            outcome: crate::Outcome::Wait,
            reason: crate::Reason::Inconclusive,
            evidence: Evidence::ShadowAgreement {
                pairs: 500,
                agreements: 499,
                agreement: i,
                min_agreement: 0.9,
                champion_confident: 4,
                confident_flips: 0,
                flip_rate: i,
                max_flip_rate: 0.02,
                mirror_dropped: 0,
                shown: Some(shown),
            },
        };
        let line = gate_lines(&verdict(ShadowShown {
            agreement_below: false,
            flips_above: false,
            agreement_above: true,
            flips_below: false,
            within: false,
        }))
        .join("\n");
        assert!(
            line.contains("(99.80%), shown at or above 90.00%"),
            "{line}"
        );
        assert!(line.contains("not shown either side of 2.00%"), "{line}");
        let line = gate_lines(&verdict(ShadowShown {
            agreement_below: true,
            flips_above: false,
            agreement_above: false,
            flips_below: false,
            within: false,
        }))
        .join("\n");
        assert!(line.contains("shown below the required 90.00%"), "{line}");
    }

    #[test]
    fn numbers_are_rounded_for_reading() {
        for (x, shown) in [
            (0.0, "0"),
            (0.17234, "0.172"),
            (1.0, "1"),
            (25.14, "25.1"),
            (40.0, "40"),
            (1234.6, "1230"),
            (1.4e15, "1.4e15"),
            (1e6, "1e6"),
            (0.00012, "1.2e-4"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "∞"),
        ] {
            assert_eq!(number(x), shown, "{x}");
        }
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
