//! The `rollgate` command.

mod assemble;
mod cli;
mod client;
mod config;
mod demo;
mod demo_plane;
mod follow;
mod gateway;
mod kit;
mod labels;
mod logging;
#[cfg(feature = "kubernetes")]
mod operator;
mod plan_check;
mod seed;
mod serve;
mod sim;
mod sim_demo;
mod status;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "rollgate",
    version,
    about = "Progressive delivery for ML model services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Three rollouts end to end: a healthy retrain (promoted), a model with a
    /// dead feature (refused in SHADOW) and a candidate that is ready but
    /// answers 503 (rolled back at the first canary step).
    Demo(demo::DemoArgs),
    /// Store, gateway, controller and admin API in one process.
    Up(serve::UpArgs),
    /// The gateway (data plane): static routes from --config, or following
    /// the store with --data.
    Gateway(gateway::GatewayArgs),
    /// The controller and admin API as their own process.
    Controller(serve::ControllerArgs),
    /// Models: add, list, show.
    Model(cli::Admin<cli::ModelCmd>),
    /// Revisions: add, list.
    Revision(cli::Admin<cli::RevisionCmd>),
    /// The champion: set.
    Champion(cli::Admin<cli::ChampionCmd>),
    /// Rollouts: start, status, pause, resume, abort, promote, unblock, wait.
    Rollout(cli::Admin<cli::RolloutCmd>),
    /// The audit log: the evidence of every decision; `audit verify`.
    Audit(cli::AuditArgs),
    /// API tokens: create (with a role), list, revoke.
    Token(cli::Admin<cli::TokenCmd>),
    /// Labels (ground truth) for a model's answers: send.
    Labels(cli::Admin<labels::LabelsCmd>),
    /// Kubernetes custom resources (`Model`, `ModelRollout`): `run` follows
    /// them into rollgate, `crds` prints their definitions.
    #[cfg(feature = "kubernetes")]
    #[command(subcommand)]
    Operator(operator::OperatorCmd),
    /// Data planes the controller's config declares: `seed` prints the
    /// files one needs before it first starts.
    #[command(subcommand, name = "data-plane")]
    DataPlane(seed::DataPlaneCmd),
    /// Train the demo model zoo: champion, retrained, broken-feature.
    Train(kit::TrainArgs),
    /// Serve a trained model (KServe V1 and OIP V2), with fault injection.
    Serve(kit::ServeArgs),
    /// Send open-loop traffic at a fixed rate with sticky keys.
    Traffic(kit::TrafficArgs),
    /// The decision-quality simulator: policies side by side on a scenario matrix.
    Sim(sim::SimArgs),
    /// Plans: `check` validates a plan file and says what its quality
    /// gate's stages need at the model's traffic.
    #[command(subcommand)]
    Plan(plan_check::PlanCmd),
    /// Print a shell completion script (e.g. `rollgate completions bash >
    /// /etc/bash_completion.d/rollgate`).
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff; `rollgate man | man -l -`).
    Man,
}

/// A closed stdout (`rollgate audit | head -1`) ends the command quietly
/// and successfully, as it ends Unix tools. `print!` panics when stdout is
/// a closed pipe, and resetting SIGPIPE to its default would need `unsafe`
/// (forbidden here), so the panic hook recognises exactly that panic and
/// exits 0 before anything is printed; every other panic is reported as
/// before.
fn end_quietly_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout")
            && message.to_ascii_lowercase().contains("broken pipe")
        {
            std::process::exit(0);
        }
        report(info);
    }));
}

/// Writes `bytes` to stdout; a reader that closed early is not an error.
fn to_stdout(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn main() -> ExitCode {
    end_quietly_on_closed_stdout();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Up(args) => serve::up(args),
        Command::Gateway(args) => gateway::run(args),
        Command::Controller(args) => serve::controller(args),
        Command::Model(a) => cli::model(&a.global, &a.cmd),
        Command::Revision(a) => cli::revision(&a.global, &a.cmd),
        Command::Champion(a) => cli::champion(&a.global, &a.cmd),
        Command::Rollout(a) => cli::rollout(&a.global, &a.cmd),
        Command::Audit(a) => cli::audit(&a.global, a),
        Command::Token(a) => cli::token(&a.global, &a.cmd),
        Command::Labels(a) => labels::labels(&a.global, &a.cmd),
        Command::DataPlane(cmd) => seed::run(cmd),
        #[cfg(feature = "kubernetes")]
        Command::Operator(cmd) => operator::run(cmd),
        Command::Train(a) => kit::train(a),
        Command::Serve(a) => kit::serve_model(a),
        Command::Traffic(a) => kit::traffic(a),
        Command::Sim(a) => sim::run(a),
        Command::Plan(cmd) => plan_check::run(cmd),
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "rollgate", &mut script);
            to_stdout(&script)
        }
        Command::Man => {
            use clap::CommandFactory as _;
            let mut page = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut page) {
                Ok(()) => to_stdout(&page),
                Err(e) => Err(e.into()),
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rollgate: {e:#}");
            let input = e.downcast_ref::<client::InputError>().is_some();
            ExitCode::from(if input { 2 } else { 1 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand and every flag says what it is for.
    #[test]
    fn every_subcommand_and_flag_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(format!("{here}: no about"));
                }
                walk(sub, &here, missing);
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{id}: no help"));
                }
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "rollgate", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
