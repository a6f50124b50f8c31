//! `rollgate sim`: the decision-quality simulator. Drives rollgate's real
//! state machine and gates (both policies) and two baselines rebuilt from
//! other systems' published rules over a scenario matrix of synthetic,
//! seeded traffic; no network.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Args;
use rollgate_sim::matrix::{CellReport, Matrix, PolicyKind, run_cell};

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Scenario matrix (TOML): `[plan]` and `[[scenarios]]`.
    #[arg(long, default_value = "bench/sim/scenarios.toml")]
    scenarios: PathBuf,
    /// Seeded runs per cell.
    #[arg(long, default_value_t = 200)]
    runs: u64,
    /// Policies to compare (default: all five).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Only scenarios whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also write the reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run the delayed-label cells of this file (TOML: `[plan]` and
    /// `[[cells]]`) instead of the scenario matrix.
    #[arg(long)]
    labels: Option<PathBuf>,
}

fn policy(name: &str) -> Option<PolicyKind> {
    PolicyKind::ALL.into_iter().find(|p| p.name() == name)
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.0}"))
}

pub fn run(args: &SimArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.labels {
        return label_cells(args, path);
    }
    let matrix: Matrix = match crate::config::read_toml(&args.scenarios) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rollgate: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(e) = matrix.plan.validate() {
        eprintln!("rollgate: {}: {e}", args.scenarios.display());
        return Ok(ExitCode::from(2));
    }
    let mut policies = Vec::new();
    for name in &args.policies {
        match policy(name) {
            Some(p) => policies.push(p),
            None => {
                eprintln!(
                    "rollgate: unknown policy {name:?}: sequential, sequential-evidence, windowed, absolute, point-estimate"
                );
                return Ok(ExitCode::from(2));
            }
        }
    }
    if policies.is_empty() {
        policies = PolicyKind::ALL.to_vec();
    }
    let scenarios: Vec<_> = matrix
        .scenarios
        .iter()
        .filter(|s| args.only.as_deref().is_none_or(|o| s.name.contains(o)))
        .collect();
    let total = scenarios.len() as u64 * policies.len() as u64 * args.runs;
    let bar = indicatif::ProgressBar::new(total);
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let done = AtomicU64::new(0);
    let tick = || {
        done.fetch_add(1, Ordering::Relaxed);
        bar.inc(1);
    };
    let started = std::time::Instant::now();
    let mut reports: Vec<CellReport> = Vec::new();
    for s in &scenarios {
        for &p in &policies {
            reports.push(run_cell(&matrix.plan, s, p, args.runs, args.threads, &tick));
        }
    }
    bar.finish_and_clear();
    println!(
        "{:<28} {:<20} {:>5} {:>8} {:>8} {:>8} {:>6} {:>20} {:>8} {:>9} {:>7}",
        "SCENARIO",
        "POLICY",
        "RUNS",
        "PROMOTED",
        "BREACH",
        "STARVED",
        "OPEN",
        "WRONG (95% CI)",
        "MED s",
        "MED REQS",
        "EXPOSED"
    );
    for r in &reports {
        println!(
            "{:<28} {:<20} {:>5} {:>8} {:>8} {:>8} {:>6} {:>6.1}% [{:>4.1}, {:>4.1}] {:>8} {:>9} {:>7}",
            r.scenario,
            r.policy,
            r.runs,
            r.promoted,
            r.rolled_back_breach,
            r.rolled_back_other,
            r.unfinished,
            r.wrong_rate * 100.0,
            r.wrong_rate_ci.0 * 100.0,
            r.wrong_rate_ci.1 * 100.0,
            opt(r.median_seconds),
            opt(r.median_candidate_requests),
            r.live_exposed
        );
    }
    println!(
        "({} runs in {:.1}s)",
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The delayed-label cells: each cell's runs through the real state
/// machine, what they came to, and (`--json`) the reports.
fn label_cells(args: &SimArgs, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    use rollgate_sim::labels::{LabelMatrix, label_cell};
    if !args.policies.is_empty() {
        eprintln!(
            "rollgate: --labels runs rollgate's own state machine; --policies does not apply"
        );
        return Ok(ExitCode::from(2));
    }
    let matrix: LabelMatrix = match crate::config::read_toml(path) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rollgate: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    for cell in &matrix.cells {
        if let Err(e) = cell.plan(&matrix.plan).validate() {
            eprintln!("rollgate: {}: cell {}: {e}", path.display(), cell.name);
            return Ok(ExitCode::from(2));
        }
    }
    let started = std::time::Instant::now();
    println!(
        "{:<36} {:<7} {:>5} {:>7} {:>19} {:>7} {:>5} {:>6} {:>7} {:>5} {:>9} {:>8} {:>7}",
        "CELL",
        "EXPECT",
        "RUNS",
        "REFUSED",
        "REFUSED (95% CI)",
        "TIMEOUT",
        "OTHER",
        "PASSED",
        "ON TIME",
        "UNDEC",
        "MED REFUS",
        "MED PASS",
        "PLANNED"
    );
    let mut reports = Vec::new();
    for cell in matrix
        .cells
        .iter()
        .filter(|c| args.only.as_deref().is_none_or(|o| c.name.contains(o)))
    {
        let r = label_cell(&matrix.plan, cell, args.runs, args.threads);
        let ci = rollgate_core::stats::wilson(
            r.refused,
            r.runs,
            rollgate_core::stats::z_two_sided(0.05),
        );
        let (lo, hi) = (ci.lower, ci.upper);
        let n = |x: Option<u64>| opt(x.map(|x| x as f64));
        println!(
            "{:<36} {:<7} {:>5} {:>7} {:>6.2}% [{:>4.2},{:>5.2}] {:>7} {:>5} {:>6} {:>7} {:>5} {:>9} {:>8} {:>7}",
            r.cell,
            format!("{:?}", r.expect).to_lowercase(),
            r.runs,
            r.refused,
            r.refused as f64 * 100.0 / r.runs.max(1) as f64,
            lo * 100.0,
            hi * 100.0,
            r.label_timeout,
            r.other_rollback,
            r.passed,
            r.passed_on_time,
            r.undecided,
            n(r.median_labelled_at_refusal),
            n(r.median_labelled_at_pass),
            n(r.planned),
        );
        reports.push(r);
    }
    println!("({:.1}s)", started.elapsed().as_secs_f64());
    if let Some(out) = &args.json {
        std::fs::write(out, serde_json::to_string_pretty(&reports)?)?;
    }
    Ok(ExitCode::SUCCESS)
}
