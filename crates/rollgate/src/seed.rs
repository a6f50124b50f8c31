//! `rollgate data-plane seed`: the files a data plane must hold before it
//! first starts. nginx and Envoy read rollgate's files at start-up, and
//! rollgate writes them only once the model has a champion; until then the
//! operator seeds them with exactly what the adapter would write for the
//! champion, from the same declaration the controller reads.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::config::read_toml;
use crate::serve::UpConfig;

#[derive(Args, Debug)]
pub struct SeedArgs {
    /// The controller's config file, which declares the data plane.
    #[arg(long)]
    config: PathBuf,
    /// The data plane's name (`[data_planes.NAME]`).
    plane: String,
    /// The model routed through it (fills `$model`).
    #[arg(long)]
    model: String,
    /// The champion's model server, e.g. `http://10.0.0.5:8080`.
    #[arg(long)]
    upstream: String,
    /// Write the files where the declaration puts them, instead of
    /// printing them.
    #[arg(long)]
    write: bool,
}

/// `rollgate data-plane ...`.
#[derive(clap::Subcommand, Debug)]
pub enum DataPlaneCmd {
    /// Print (or `--write`) the files a declared data plane must hold
    /// before it first starts: the adapter's own output for the champion.
    Seed(SeedArgs),
}

pub fn run(cmd: &DataPlaneCmd) -> anyhow::Result<ExitCode> {
    let DataPlaneCmd::Seed(args) = cmd;
    let input = |e: String| {
        eprintln!("rollgate: {e}");
        Ok(ExitCode::from(2))
    };
    let cfg: UpConfig = match read_toml(&args.config) {
        Ok(c) => c,
        Err(e) => return input(format!("{e:#}")),
    };
    let host = match cfg.host() {
        Ok(h) => h,
        Err(e) => return input(format!("{}: {e:#}", args.config.display())),
    };
    if let Err(e) = rollgate_core::spec::check_model_name(&args.model) {
        return input(format!("--model: {}", e.message));
    }
    let named = rollgate_store::DataPlaneRef::Named(args.plane.clone());
    let plane = match host.data_plane(&args.model, &named) {
        Ok(p) => p,
        Err(e) => return input(e.to_string()),
    };
    let files = match rollgate_adapters::seed(&plane, &args.model, &args.upstream) {
        Ok(f) => f,
        Err(e) => return input(format!("--upstream: {e}")),
    };
    if files.is_empty() {
        println!(
            "# a {} data plane needs no files before it starts",
            plane.kind()
        );
    }
    for (path, contents) in files {
        if args.write {
            std::fs::write(&path, &contents).with_context(|| format!("writing {path}"))?;
            println!("wrote {path}");
        } else {
            print!("# {path}\n{contents}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
