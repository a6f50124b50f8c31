//! The `rollgate` command.

mod demo;
mod gateway;
mod report;

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
    /// Run the gateway (data plane) from a TOML config with static routes.
    Gateway(gateway::GatewayArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Gateway(args) => gateway::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rollgate: {e:#}");
            ExitCode::from(1)
        }
    }
}
