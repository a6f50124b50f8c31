//! A plan's validation: every field checked, section by section, and the
//! first problem named by its dotted path from the plan's root
//! (`gates.latency.tail_quantile`).

use std::time::Duration;

use super::{
    ApprovalPoint, Assignment, ErrorRateGate, Gates, GuardRails, LatencyGate, Mode, Plan,
    PlanError, Policy, QualityGate, SequentialPlan, ShadowGate, ShadowPlan, ShiftGate,
};

/// The error naming `field`.
fn err(field: &str, message: impl Into<String>) -> PlanError {
    PlanError {
        field: field.to_string(),
        message: message.into(),
    }
}

// The shapes of value a field may need to have.

fn unit(field: &str, x: f64) -> Result<(), PlanError> {
    if (0.0..=1.0).contains(&x) {
        Ok(())
    } else {
        Err(err(field, format!("must be in [0, 1], got {x}")))
    }
}

fn positive_unit(field: &str, x: f64) -> Result<(), PlanError> {
    if x > 0.0 && x <= 1.0 {
        Ok(())
    } else {
        Err(err(field, format!("must be in (0, 1], got {x}")))
    }
}

fn at_least(field: &str, x: f64, min: f64) -> Result<(), PlanError> {
    if x.is_finite() && x >= min {
        Ok(())
    } else {
        Err(err(field, format!("must be a number >= {min}, got {x}")))
    }
}

fn count(field: &str, x: u64) -> Result<(), PlanError> {
    if x >= 1 {
        Ok(())
    } else {
        Err(err(field, "must be at least 1"))
    }
}

impl Plan {
    /// Checks every field, section by section (steps, shadow, clocks, the
    /// `windowed` settings, the `sequential` ones, gates, approvals); the
    /// first problem found is returned.
    pub fn validate(&self) -> Result<(), PlanError> {
        self.validate_steps()?;
        self.shadow.validate()?;
        self.validate_clocks()?;
        self.validate_windowed()?;
        self.sequential.validate()?;
        self.gates.validate()?;
        self.validate_quality()?;
        self.validate_approvals()
    }

    /// At least one canary step, each a percentage in 1..=99, strictly
    /// increasing.
    fn validate_steps(&self) -> Result<(), PlanError> {
        if self.steps.is_empty() {
            return Err(err("steps", "needs at least one canary step"));
        }
        if let Some(keys) = self.keys {
            count("keys", keys)?;
        }
        for (i, &s) in self.steps.iter().enumerate() {
            if !(1..=99).contains(&s) {
                return Err(err(
                    &format!("steps[{i}]"),
                    format!("must be a percentage in 1..=99, got {s}"),
                ));
            }
            if let Some(problem) = self.too_few_keys_for(s) {
                return Err(err(&format!("steps[{i}]"), problem));
            }
            if i > 0 && s <= self.steps[i - 1] {
                return Err(err(
                    &format!("steps[{i}]"),
                    format!(
                        "steps must be strictly increasing, got {} after {}",
                        s,
                        self.steps[i - 1]
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A sticky `sequential` step that cannot hold the keys a stage needs
    /// to be judged per key, with the declared `keys`, in words.
    fn too_few_keys_for(&self, step: u32) -> Option<String> {
        let keys = self.keys?;
        let judged_per_key =
            self.assignment == Assignment::Sticky && self.policy == Policy::Sequential;
        (judged_per_key && crate::keys::too_few(keys, step)).then(|| {
            format!(
                "a {step}% stage of {keys} keys (plan.keys) holds {:.1} keys on average, fewer \
                 than the {} a stage needs to be judged per key: {}",
                crate::keys::in_stage(keys, step),
                crate::unit::MIN_UNITS,
                crate::keys::advice(keys)
            )
        })
    }

    /// The evidence deadline (positive, at least the minimum stage
    /// duration), the readiness deadline and the outage window.
    fn validate_clocks(&self) -> Result<(), PlanError> {
        if self.evidence_timeout.is_zero() {
            return Err(err("evidence_timeout", "must be positive"));
        }
        if self.evidence_timeout < self.min_stage_duration {
            return Err(err(
                "evidence_timeout",
                "must be at least min_stage_duration",
            ));
        }
        if self.readiness_timeout.is_zero() {
            return Err(err("readiness_timeout", "must be positive"));
        }
        if self.outage_window < Duration::from_secs(1) {
            return Err(err("outage_window", "must be at least 1s"));
        }
        Ok(())
    }

    /// The `windowed` policy's settings: breach confirmations and the
    /// bounds' error level.
    fn validate_windowed(&self) -> Result<(), PlanError> {
        if self.confirm_breaches == 0 {
            return Err(err("confirm_breaches", "must be at least 1"));
        }
        if !(self.alpha > 0.0 && self.alpha <= 0.5) {
            return Err(err(
                "alpha",
                format!("must be in (0, 0.5], got {}", self.alpha),
            ));
        }
        Ok(())
    }

    /// The quality gate's tests are anytime-valid: it needs the
    /// `sequential` policy.
    fn validate_quality(&self) -> Result<(), PlanError> {
        let q = &self.gates.quality;
        if q.enabled && self.policy != Policy::Sequential {
            return Err(err(
                "gates.quality.enabled",
                "the quality gate needs policy = \"sequential\"",
            ));
        }
        if q.enabled {
            self.validate_label_window()?;
        }
        if q.enabled && q.label_deadline < self.min_stage_duration {
            return Err(err(
                "gates.quality.label_deadline",
                "must be at least min_stage_duration",
            ));
        }
        if !self.watch.is_off() && !q.enabled {
            return Err(err(
                "watch.window",
                "a watch judges labels: it needs gates.quality.enabled = true",
            ));
        }
        if !self.watch.is_off() && self.mode == Mode::Observe {
            return Err(err(
                "watch.window",
                "a dry run (mode = \"observe\") promotes nothing to watch",
            ));
        }
        if !(1..=100).contains(&self.watch.mirror_percent) {
            return Err(err("watch.mirror_percent", "must be in 1..=100"));
        }
        if q.enabled && !q.in_stages && self.watch.is_off() {
            return Err(err(
                "gates.quality.in_stages",
                "a quality gate that judges no stage needs a watch after promotion ([watch] window)",
            ));
        }
        Ok(())
    }

    /// A quality gate declares how late its labels come: without it, which
    /// labels came first can say which answers were wrong, and no test on
    /// them is sound. The stages (and a watch) must outlast the window.
    fn validate_label_window(&self) -> Result<(), PlanError> {
        let q = &self.gates.quality;
        let Some(window) = q.label_window else {
            return Err(err(
                "gates.quality.label_window",
                "declare how long after its answer a label can still come (e.g. \"10m\", \"90d\"): \
                 answers are judged once that old, since when a label comes can say whether the \
                 answer was right (docs/statistics.md, \"Quality from labels\")",
            ));
        };
        let w = humantime::format_duration(window);
        if q.in_stages && q.label_deadline <= window {
            return Err(err(
                "gates.quality.label_deadline",
                format!(
                    "must be longer than label_window ({w}): a stage judges only answers at \
                     least label_window old; for labels slower than a stage, set in_stages = \
                     false and judge them in a [watch] longer than label_window"
                ),
            ));
        }
        if !self.watch.is_off() && self.watch.window <= window {
            return Err(err(
                "watch.window",
                format!("must be longer than gates.quality.label_window ({w})"),
            ));
        }
        if let Some(absent) = &q.absent_label {
            if absent.trim().is_empty() || absent.len() > 128 {
                return Err(err(
                    "gates.quality.absent_label",
                    "must be a label of 1 to 128 characters (the class or value no label means)",
                ));
            }
            if q.kind == super::QualityKind::Regression
                && !absent.trim().parse::<f64>().is_ok_and(f64::is_finite)
            {
                return Err(err(
                    "gates.quality.absent_label",
                    format!("a regression's label is a number, got {absent:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Each approval step stands before one of the plan's steps (or
    /// promotion), no point has two, and a deadline is at least 1s.
    fn validate_approvals(&self) -> Result<(), PlanError> {
        for (i, a) in self.approvals.iter().enumerate() {
            if let ApprovalPoint::Weight(w) = a.before
                && !self.steps.contains(&w)
            {
                return Err(err(
                    &format!("approvals[{i}].before"),
                    format!("{w} is not one of the plan's steps {:?}", self.steps),
                ));
            }
            if self.approvals[..i].iter().any(|b| b.before == a.before) {
                return Err(err(
                    &format!("approvals[{i}].before"),
                    format!("{} has an approval step already", a.before),
                ));
            }
            if a.deadline.is_some_and(|d| d < Duration::from_secs(1)) {
                return Err(err(
                    &format!("approvals[{i}].deadline"),
                    "must be at least 1s",
                ));
            }
        }
        Ok(())
    }
}

// The sections' own checks. Each names its fields by their dotted path
// from the plan's root, as `PlanError::field` says.

impl ShadowPlan {
    fn validate(&self) -> Result<(), PlanError> {
        if !(1..=100).contains(&self.mirror_percent) {
            return Err(err(
                "shadow.mirror_percent",
                format!("must be in 1..=100, got {}", self.mirror_percent),
            ));
        }
        Ok(())
    }
}

impl SequentialPlan {
    fn validate(&self) -> Result<(), PlanError> {
        if !(self.alpha > 0.0 && self.alpha <= 0.5) {
            return Err(err(
                "sequential.alpha",
                format!("must be in (0, 0.5], got {}", self.alpha),
            ));
        }
        at_least("sequential.max_error_ratio", self.max_error_ratio, 1.0)?;
        if self.non_inferiority_ratio.is_nan() || self.non_inferiority_ratio <= 1.0 {
            return Err(err(
                "sequential.non_inferiority_ratio",
                format!("must be greater than 1, got {}", self.non_inferiority_ratio),
            ));
        }
        if !(0.0..1.0).contains(&self.negligible_error_rate) {
            return Err(err(
                "sequential.negligible_error_rate",
                format!("must be in [0, 1), got {}", self.negligible_error_rate),
            ));
        }
        Ok(())
    }
}

impl Gates {
    fn validate(&self) -> Result<(), PlanError> {
        self.error_rate.validate()?;
        self.latency.validate()?;
        self.prediction_shift.validate()?;
        self.shadow.validate()?;
        self.quality.validate()?;
        self.guard_rails.validate()
    }
}

impl ErrorRateGate {
    fn validate(&self) -> Result<(), PlanError> {
        unit("gates.error_rate.margin", self.margin)?;
        count("gates.error_rate.min_requests", self.min_requests)?;
        positive_unit("gates.error_rate.gross_error_rate", self.gross_error_rate)
    }
}

impl LatencyGate {
    fn validate(&self) -> Result<(), PlanError> {
        count("gates.latency.min_requests", self.min_requests)?;
        if !(self.tail_quantile > 0.5 && self.tail_quantile < 1.0) {
            return Err(err(
                "gates.latency.tail_quantile",
                format!("must be in (0.5, 1), got {}", self.tail_quantile),
            ));
        }
        at_least("gates.latency.median_ratio", self.median_ratio, 1.0)?;
        at_least("gates.latency.median_ms", self.median_ms, 0.0)?;
        at_least("gates.latency.tail_ratio", self.tail_ratio, 1.0)?;
        at_least("gates.latency.tail_ms", self.tail_ms, 0.0)
    }
}

impl ShiftGate {
    fn validate(&self) -> Result<(), PlanError> {
        unit("gates.prediction_shift.margin", self.margin)?;
        let ratio = self.max_class_ratio;
        if !(ratio.is_finite() && ratio > 1.0) {
            return Err(err(
                "gates.prediction_shift.max_class_ratio",
                format!("must be greater than 1, got {ratio}"),
            ));
        }
        let share = self.min_class_share;
        if !(0.0..1.0).contains(&share) {
            return Err(err(
                "gates.prediction_shift.min_class_share",
                format!("must be in [0, 1), got {share}"),
            ));
        }
        count(
            "gates.prediction_shift.min_predictions",
            self.min_predictions,
        )
    }
}

impl ShadowGate {
    fn validate(&self) -> Result<(), PlanError> {
        unit("gates.shadow.min_agreement", self.min_agreement)?;
        unit("gates.shadow.max_flip_rate", self.max_flip_rate)?;
        count("gates.shadow.min_pairs", self.min_pairs)
    }
}

impl QualityGate {
    fn validate(&self) -> Result<(), PlanError> {
        if !(self.tolerance.is_finite() && self.tolerance >= 0.0) {
            return Err(err(
                "gates.quality.tolerance",
                format!("must be a number at least 0, got {}", self.tolerance),
            ));
        }
        at_least("gates.quality.max_error_ratio", self.max_error_ratio, 1.0)?;
        unit("gates.quality.margin", self.margin)?;
        count("gates.quality.min_labels", self.min_labels)?;
        unit("gates.quality.min_coverage", self.min_coverage)?;
        if self.label_deadline.is_zero() {
            return Err(err("gates.quality.label_deadline", "must be positive"));
        }
        // Answers are timed in milliseconds: a shorter window would be none.
        if self
            .label_window
            .is_some_and(|w| w < std::time::Duration::from_millis(1))
        {
            return Err(err("gates.quality.label_window", "must be at least 1ms"));
        }
        Ok(())
    }
}

impl GuardRails {
    fn validate(&self) -> Result<(), PlanError> {
        if let Some(x) = self.max_error_rate {
            unit("gates.guard_rails.max_error_rate", x)?;
        }
        if let Some(x) = self.max_p95_ms
            && !(x.is_finite() && x > 0.0)
        {
            return Err(err(
                "gates.guard_rails.max_p95_ms",
                format!("must be positive, got {x}"),
            ));
        }
        positive_unit(
            "gates.guard_rails.champion_outage_error_rate",
            self.champion_outage_error_rate,
        )
    }
}
