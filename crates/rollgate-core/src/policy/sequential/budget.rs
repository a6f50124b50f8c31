//! How the sequential policy spends its error budget: split evenly over
//! the gates (Bonferroni), and a two-sample gate's share again over the
//! stages it is judged in.

use crate::plan::Plan;

/// `α` per metric: the plan's `α` split evenly (Bonferroni) over every
/// metric that can fail anywhere in the rollout — fixed for the whole
/// rollout, so the chance of any false failure stays at most `α` however
/// the stages run.
pub fn metric_alpha(plan: &Plan) -> f64 {
    let g = &plan.gates;
    let shadow = usize::from(plan.shadow.enabled);
    let rails =
        usize::from(g.guard_rails.max_error_rate.is_some() || g.guard_rails.max_p95_ms.is_some());
    let metrics = usize::from(g.error_rate.enabled)
        + usize::from(g.latency.enabled)
        + shadow * (1 + usize::from(g.shadow.max_flip_rate < 1.0))
        + usize::from(g.prediction_shift.enabled)
        // Quality: the paired test (SHADOW, continued in the watch after
        // promotion), the unpaired one in CANARY.
        + usize::from(g.quality.enabled) * quality_tests(plan)
        + rails;
    plan.sequential.alpha / metrics.max(1) as f64
}

/// The quality gate's tests: the paired one if a SHADOW stage or a watch
/// judges labels (one test either way: the watch continues the SHADOW
/// stage's e-process), and the unpaired one if the stages judge labels.
fn quality_tests(plan: &Plan) -> usize {
    let q = &plan.gates.quality;
    let paired = (plan.shadow.enabled && q.in_stages) || !plan.watch.is_off();
    usize::from(paired) + usize::from(q.in_stages)
}

/// The plan's stages: one routing epoch each.
pub fn stage_count(plan: &Plan) -> usize {
    usize::from(plan.shadow.enabled) + plan.steps.len()
}

/// `α` of one stage's two-sample comparison: a metric compared within
/// stages fails when any stage's comparison fails, so its `α` is split over
/// the plan's stages.
pub fn stage_alpha(plan: &Plan, stage: usize) -> f64 {
    metric_alpha(plan) / stage_count(plan).max(stage).max(1) as f64
}
