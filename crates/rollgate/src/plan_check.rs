//! `rollgate plan check`: a plan file read and validated as the API would,
//! and, for a quality gate, how many labels its stages need at the
//! model's traffic and how long they will likely wait. Offline: it reads
//! no store and calls no API.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use rollgate_core::Plan;
use rollgate_core::plan::Unlabelled;
use rollgate_core::sequential::{answers_to_pass, pairs_to_pass};

#[derive(Subcommand, Debug)]
pub enum PlanCmd {
    /// Validate a plan file; with a quality gate, estimate the labels a
    /// pass needs and the wait.
    Check(CheckArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The plan file (TOML), as `rollout start --plan` takes it.
    pub plan: PathBuf,
    /// The model's requests a second (mirrored in SHADOW at the shadow's
    /// sample rate, split by the step in CANARY).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The share of matured answers that get a label within the window
    /// (1 with `absent_label`).
    #[arg(long, default_value_t = 1.0)]
    pub coverage: f64,
    /// The share of labelled pairs on which exactly one arm is wrong: a
    /// retrained model about 5%, independent models at 85% accuracy 25%.
    #[arg(long, default_value_t = 0.05)]
    pub discordant: f64,
    /// The champion's error rate on labelled answers.
    #[arg(long, default_value_t = 0.15)]
    pub error_rate: f64,
}

pub fn run(cmd: &PlanCmd) -> anyhow::Result<ExitCode> {
    let PlanCmd::Check(args) = cmd;
    let plan: Plan = match crate::config::read_toml(&args.plan) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rollgate: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(e) = plan.validate() {
        eprintln!("rollgate: {}: {e}", args.plan.display());
        return Ok(ExitCode::from(2));
    }
    println!("{}: valid", args.plan.display());
    for line in quality_lines(&plan, args) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// What the quality gate's stages need, in words (none without one).
pub fn quality_lines(plan: &Plan, args: &CheckArgs) -> Vec<String> {
    let q = &plan.gates.quality;
    if !q.enabled || !q.in_stages {
        return Vec::new();
    }
    let coverage = if q.absent_label.is_some() {
        1.0
    } else {
        args.coverage.clamp(0.0, 1.0)
    };
    let window = q.label_window.unwrap_or_default();
    let mut out = vec![format!(
        "quality: answers judged once {} old; pass at a margin of {:.1} points{}",
        humantime::format_duration(window),
        q.margin * 100.0,
        match (q.unlabelled, q.absent_label.as_deref()) {
            (_, Some(a)) => format!(", no label meaning {a:?}"),
            (Unlabelled::WorstCase, None) => {
                format!(
                    ", unlabelled answers counted against each verdict (coverage {:.0}%)",
                    coverage * 100.0
                )
            }
            (Unlabelled::AtRandom, None) =>
                ", unlabelled answers left out (declared at random)".into(),
        }
    )];
    if q.unlabelled == Unlabelled::WorstCase && coverage < 1.0 - q.margin {
        out.push(format!(
            "  coverage {:.0}% is below 1 - margin: an equal candidate can never pass on \
             labels; every stage will wait for its label deadline ({}) and fail safe. Declare \
             absent_label, or unlabelled = \"at_random\" if labels are sampled at random",
            coverage * 100.0,
            humantime::format_duration(q.label_deadline)
        ));
        return out;
    }
    let wait = |labels: u64, per_second: Option<f64>| match per_second {
        Some(r) if r > 0.0 => {
            let secs = (labels as f64 / r + window.as_secs_f64()) as u64;
            let late = if Duration::from_secs(secs) > q.label_deadline {
                " — past the label deadline, where the stage is decided without a pass on \
                 evidence (on_time: no regression shown; on_evidence: evidence_timeout): raise \
                 the deadline or the margin"
            } else {
                ""
            };
            format!(
                "; at {r:.2} labelled a second about {} (window included){late}",
                humantime::format_duration(Duration::from_secs(secs))
            )
        }
        _ => String::new(),
    };
    let deadline = humantime::format_duration(q.label_deadline);
    if plan.shadow.enabled {
        let labelled_rate = args
            .rate
            .map(|r| r * f64::from(plan.shadow.mirror_percent) / 100.0 * coverage);
        out.push(match pairs_to_pass(plan, args.discordant, coverage) {
            Some(n) => format!(
                "  SHADOW: an equal candidate passes after about {n} matured labelled pairs \
                 ({:.0}% discordant){}; label deadline {deadline}",
                args.discordant * 100.0,
                wait(n, labelled_rate)
            ),
            None => "  SHADOW: no number of pairs shows this margin".into(),
        });
    }
    if let Some(step) = plan.steps.first() {
        let arm_rate = args
            .rate
            .map(|r| r * f64::from((*step).min(100 - *step)) / 100.0 * coverage);
        out.push(match answers_to_pass(plan, args.error_rate, coverage) {
            Some(n) => format!(
                "  CANARY {step}%: about {n} labelled answers an arm at a {:.0}% error rate{}; \
                 label deadline {deadline}",
                args.error_rate * 100.0,
                wait(n, arm_rate)
            ),
            None => "  CANARY: no number of answers shows this margin".into(),
        });
    }
    out
}
