//! Admin commands: models, revisions, the champion, rollouts and the audit
//! log, over the admin API. Exit codes: 0 success (or promoted), 3 rolled
//! back or aborted (`rollout wait`), 4 rolled back by the watch after
//! promotion (`rollout wait`), 2 usage or input errors, 1 other failures.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use rollgate_core::{Phase, Plan, Protocol};
use rollgate_store::{AuditRecord, RolloutRecord};
use serde_json::{Value, json};

use crate::client::{Api, CallError};
use crate::status::{registry_lines, rfc3339, rollout_view};
use rollgate_core::words;

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// The admin API.
    #[arg(
        long,
        global = true,
        env = "ROLLGATE_API",
        default_value = "http://127.0.0.1:7070"
    )]
    api: String,
    /// A PEM file of CA certificates to trust for an `https://` API (beside
    /// the public roots): a team's own CA.
    #[arg(long, global = true, env = "ROLLGATE_CA_CERT", value_name = "FILE")]
    ca_cert: Option<std::path::PathBuf>,
    /// A PEM client certificate for an API that requires one (`[api.tls]
    /// client_ca_file`); needs --client-key.
    #[arg(
        long,
        global = true,
        env = "ROLLGATE_CLIENT_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    client_cert: Option<std::path::PathBuf>,
    /// The client certificate's PEM private key.
    #[arg(
        long,
        global = true,
        env = "ROLLGATE_CLIENT_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    client_key: Option<std::path::PathBuf>,
    /// Output of read commands.
    #[arg(long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Show times in the local time zone (from `TZ` or the system's), not
    /// UTC. Both are RFC 3339; JSON output keeps the API's epoch
    /// milliseconds.
    #[arg(long, global = true, env = "ROLLGATE_LOCAL_TIME")]
    local_time: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// An admin command group: the API it talks to and how it prints (only
/// here: the other commands have no API to reach).
#[derive(Args, Debug)]
pub struct Admin<C: Subcommand> {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub cmd: C,
}

#[derive(Subcommand, Debug)]
pub enum ModelCmd {
    /// Register a model.
    Add {
        /// The model's name (lowercase letters, digits, `-`, `_`).
        name: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// Replace a model's spec (refused while a rollout is active on it).
    Update {
        /// The model.
        name: String,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// Delete a model with no active rollout (its revisions and audit
    /// history are kept).
    Delete {
        /// The model.
        name: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Every model, with its protocol and champion.
    List,
    /// One model, with its revisions.
    Show {
        /// The model.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a named API token; its secret is printed once (keep it: the
    /// store holds only its hash).
    Create {
        /// The token's name: who or what uses it (kept in the audit log).
        name: String,
        /// viewer (reads), operator (also starts, pauses, resumes, aborts
        /// rollouts), admin (everything) or labeler (sends labels, nothing
        /// else).
        #[arg(long)]
        role: String,
    },
    /// The tokens, revoked ones included (never their secrets).
    List,
    /// Revoke a token: it is refused from the next request on.
    Revoke {
        /// The token's name.
        name: String,
    },
}

/// A model's spec on the command line.
#[derive(clap::Args, Debug)]
pub struct SpecArgs {
    /// What the model's clients and servers speak.
    #[arg(long, value_enum, default_value_t = ProtocolArg::KserveV1)]
    protocol: ProtocolArg,
    /// JSON pointer to predictions in responses.
    #[arg(long)]
    output_pointer: Option<String>,
    /// For JSON models: the gateway path.
    #[arg(long)]
    json_path: Option<String>,
    /// JSON pointer to a sticky key in request bodies (when no key header).
    #[arg(long)]
    key_field: Option<String>,
    /// High-confidence threshold for shadow flips.
    #[arg(long)]
    confidence_threshold: Option<f64>,
    /// Read the model's evidence from Prometheus: a JSON file holding the
    /// spec's `prometheus` object (docs/config.md).
    #[arg(long, value_name = "FILE")]
    prometheus: Option<PathBuf>,
    /// Route the model through another data plane: the name the
    /// controller's config declares it under (`[data_planes.NAME]`;
    /// docs/config.md, "Another data plane").
    #[arg(long, value_name = "NAME")]
    data_plane: Option<String>,
    /// Follow a model registry (MLflow's): a JSON file holding the spec's
    /// `registry` object (docs/config.md, "MLflow").
    #[arg(long, value_name = "FILE")]
    registry: Option<PathBuf>,
}

/// A JSON file given on the command line (a user's mistake is exit 2).
fn json_file(path: &Option<PathBuf>) -> Result<Value, CallError> {
    let Some(path) = path else {
        return Ok(Value::Null);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| CallError::Input(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| CallError::Input(format!("{}: not JSON: {e}", path.display())))
}

impl SpecArgs {
    /// The spec as the API takes it (unset fields left out).
    fn json(&self) -> Result<Value, CallError> {
        let spec = json!({
            "protocol": Protocol::from(self.protocol),
            "output_pointer": self.output_pointer, "json_path": self.json_path,
            "key_field": self.key_field,
            "confidence_threshold": self.confidence_threshold,
            "prometheus": json_file(&self.prometheus)?,
            "data_plane": self.data_plane,
            "registry": json_file(&self.registry)?,
        });
        Ok(Value::Object(
            spec.as_object()
                .into_iter()
                .flatten()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ))
    }
}

/// Spelled as the API and the config spell it; the hyphenated forms are
/// accepted too.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProtocolArg {
    #[value(name = "kserve_v1", alias = "kserve-v1")]
    KserveV1,
    #[value(name = "oip_v2", alias = "oip-v2")]
    OipV2,
    Json,
}

impl From<ProtocolArg> for Protocol {
    fn from(p: ProtocolArg) -> Protocol {
        match p {
            ProtocolArg::KserveV1 => Protocol::KserveV1,
            ProtocolArg::OipV2 => Protocol::OipV2,
            ProtocolArg::Json => Protocol::Json,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum RevisionCmd {
    /// Register an immutable revision (same spec again: same id).
    Add {
        /// The model it is a revision of.
        model: String,
        /// The model server's base URL (`http://host:port`).
        #[arg(long)]
        upstream: String,
        /// The model server's gRPC endpoint (Open Inference Protocol), if
        /// it has one: `http://host:port` (HTTP/2 without TLS) or `https://`.
        #[arg(long)]
        grpc_upstream: Option<String>,
        /// What it serves (a model URI or a label), for the record.
        #[arg(long)]
        artifact: Option<String>,
        /// Readiness path (default: the protocol's model-ready endpoint).
        #[arg(long)]
        readiness_path: Option<String>,
        /// Upstream timeout for its requests, in milliseconds.
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// A JSON file holding the KServe predictor this revision deploys
        /// (an InferenceService's `spec.predictor`), for a `kserve` data
        /// plane.
        #[arg(long, value_name = "FILE")]
        predictor: Option<std::path::PathBuf>,
    },
    /// A model's revisions with their state, rejections and whether blocked.
    List {
        /// The model.
        model: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ChampionCmd {
    /// Make a revision the champion (the first one, or a manual switch).
    Set {
        /// The model.
        model: String,
        /// The revision to make champion.
        revision: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum RolloutCmd {
    /// Start a rollout of REVISION against MODEL's champion.
    Start {
        /// The model.
        model: String,
        /// The candidate revision.
        revision: String,
        /// Plan file (TOML); the default plan if absent.
        #[arg(long)]
        plan: Option<PathBuf>,
    },
    /// One rollout, or every rollout.
    Status {
        /// The rollout (none: every rollout).
        id: Option<i64>,
        /// Redraw a live view until the rollout ends.
        #[arg(long)]
        watch: bool,
    },
    /// Hold a rollout where it is (a breach still rolls it back).
    Pause {
        /// The rollout.
        id: i64,
    },
    /// Let a paused rollout advance again.
    Resume {
        /// The rollout.
        id: i64,
    },
    /// Send all traffic back to the champion (the candidate is not rejected).
    Abort {
        /// The rollout.
        id: i64,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Promote now, skipping remaining stages (a reason is required).
    Promote {
        /// The rollout.
        id: i64,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Approve the step the rollout waits for (the plan's `approvals`).
    Approve {
        /// The rollout.
        id: i64,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Allow a rejected revision to start a rollout again.
    Unblock {
        /// The rejected revision.
        revision: String,
        /// Why (kept in the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Wait until the rollout ends (a watch after promotion included): exit
    /// 0 promoted, 3 rolled back or aborted, 4 rolled back by the watch
    /// after promotion.
    Wait {
        /// The rollout.
        id: i64,
        /// Return once the candidate is promoted, not waiting for the end
        /// of a watch after promotion (exit 0 then, WATCHING or PROMOTED).
        #[arg(long)]
        until_promoted: bool,
        /// Give up after this long (e.g. 10m): exit 1.
        #[arg(long, value_parser = humantime_duration)]
        timeout: Option<Duration>,
    },
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    #[derive(serde::Deserialize)]
    struct D(#[serde(with = "humantime_serde")] Duration);
    serde_json::from_value::<D>(Value::String(s.into()))
        .map(|d| d.0)
        .map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    cmd: Option<AuditCmd>,
    /// Only this rollout's records.
    #[arg(long)]
    rollout: Option<i64>,
    /// Only this model's records.
    #[arg(long)]
    model: Option<String>,
    /// Show every evaluation too, not only the decisions and operator and
    /// registry changes (the table; `json` always has everything).
    #[arg(long)]
    all: bool,
    /// The old spelling of `--output` (kept so scripts keep working; one
    /// flag in the help: `--output json` is JSON Lines here).
    #[arg(long, value_enum, default_value_t = Output::Table, hide = true)]
    format: Output,
}

#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// Walk the hash chain; exit 1 at the first broken link.
    Verify,
}

pub(crate) fn api(g: &Global) -> anyhow::Result<Api> {
    Api::new(
        &g.api,
        std::env::var("ROLLGATE_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
        &rollgate_net::ClientTls {
            ca_file: g.ca_cert.clone(),
            cert_file: g.client_cert.clone(),
            key_file: g.client_key.clone(),
        },
    )
}

/// Maps a call's result to an exit code, printing errors.
pub(crate) fn finish(r: Result<ExitCode, CallError>) -> ExitCode {
    match r {
        Ok(c) => c,
        Err(CallError::Input(m)) => {
            eprintln!("rollgate: {m}");
            ExitCode::from(2)
        }
        Err(CallError::Other(m)) => {
            eprintln!("rollgate: {m}");
            ExitCode::from(1)
        }
    }
}

pub(crate) fn print(g: &Global, v: &Value, table: impl FnOnce(&Value)) {
    match g.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
        Output::Table => table(v),
    }
}

fn s(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(x)) => x.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

pub fn token(g: &Global, cmd: &TokenCmd) -> anyhow::Result<ExitCode> {
    let a = api(g)?;
    Ok(finish((|| match cmd {
        TokenCmd::Create { name, role } => {
            let t = a.call(
                "POST",
                "/api/v1/tokens",
                Some(&json!({ "name": name, "role": role })),
            )?;
            print(g, &t, |t| {
                println!(
                    "token {} ({}); its secret, shown once:\n{}",
                    s(&t["token"], "name"),
                    s(&t["token"], "role"),
                    s(t, "secret")
                )
            });
            Ok(ExitCode::SUCCESS)
        }
        TokenCmd::List => {
            let ts = a.call("GET", "/api/v1/tokens", None)?;
            print(g, &ts, |ts| {
                table(
                    &["TOKEN", "ROLE", "CREATED BY", "REVOKED"],
                    ts.as_array().into_iter().flatten().map(|t| {
                        vec![
                            s(t, "name"),
                            s(t, "role"),
                            words::clean(&s(t, "created_by")).into_owned(),
                            if t["revoked_at"].is_null() {
                                "no"
                            } else {
                                "yes"
                            }
                            .into(),
                        ]
                    }),
                );
            });
            Ok(ExitCode::SUCCESS)
        }
        TokenCmd::Revoke { name } => {
            let t = a.call("DELETE", &format!("/api/v1/tokens/{name}"), None)?;
            print(g, &t, |t| println!("token {} revoked", s(t, "name")));
            Ok(ExitCode::SUCCESS)
        }
    })()))
}

pub fn model(g: &Global, cmd: &ModelCmd) -> anyhow::Result<ExitCode> {
    let a = api(g)?;
    Ok(finish((|| match cmd {
        ModelCmd::Add { name, spec } => {
            let m = a.call(
                "POST",
                "/api/v1/models",
                Some(&json!({ "name": name, "spec": spec.json()? })),
            )?;
            print(g, &m, |m| {
                println!("model {} ({})", s(m, "name"), m["spec"]["protocol"])
            });
            Ok(ExitCode::SUCCESS)
        }
        ModelCmd::Update { name, spec } => {
            let m = a.call(
                "PUT",
                &format!("/api/v1/models/{name}"),
                Some(&spec.json()?),
            )?;
            print(g, &m, |m| {
                println!("model {} updated: {}", s(m, "name"), m["spec"])
            });
            Ok(ExitCode::SUCCESS)
        }
        ModelCmd::Delete { name, reason } => {
            let reason: String = form_urlencoded::byte_serialize(reason.as_bytes()).collect();
            a.call(
                "DELETE",
                &format!("/api/v1/models/{name}?reason={reason}"),
                None,
            )?;
            print(g, &json!({ "deleted": name }), |_| {
                println!("model {name} deleted")
            });
            Ok(ExitCode::SUCCESS)
        }
        ModelCmd::List => {
            let ms = a.call("GET", "/api/v1/models", None)?;
            print(g, &ms, |ms| {
                table(
                    &["MODEL", "PROTOCOL", "CHAMPION"],
                    ms.as_array()
                        .into_iter()
                        .flatten()
                        .map(|m| vec![s(m, "name"), s(&m["spec"], "protocol"), s(m, "champion")]),
                );
            });
            Ok(ExitCode::SUCCESS)
        }
        ModelCmd::Show { name } => {
            let m = a.call("GET", &format!("/api/v1/models/{name}"), None)?;
            let revs = a.call("GET", &format!("/api/v1/models/{name}/revisions"), None)?;
            let both = json!({ "model": m, "revisions": revs });
            print(g, &both, |b| {
                println!(
                    "model {}  protocol {}  champion {}",
                    s(&b["model"], "name"),
                    s(&b["model"]["spec"], "protocol"),
                    s(&b["model"], "champion")
                );
                if let Some(plane) = b["model"]["spec"]["data_plane"].as_str() {
                    if b["model"]["champion"].is_null() {
                        println!(
                            "data plane {plane}: nothing written to it until a champion is set \
                             (seed it first: rollgate data-plane seed --config CONFIG {plane} \
                             --model {} --upstream URL)",
                            s(&b["model"], "name")
                        );
                    } else {
                        println!("data plane {plane}");
                    }
                }
                revision_table(&b["revisions"]);
            });
            Ok(ExitCode::SUCCESS)
        }
    })()))
}

/// Prints a table: columns sized to their contents and, on a terminal,
/// wrapped to its width; no borders (easy to read, easy to `grep`).
fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) {
    println!("{}", table_text(header, rows));
}

fn table_text(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    t.trim_fmt()
}

fn revision_table(revs: &Value) {
    table(
        &["REVISION", "STATE", "REJECTIONS", "BLOCKED", "UPSTREAM"],
        revs.as_array().into_iter().flatten().map(|r| {
            vec![
                s(r, "id"),
                s(r, "state"),
                s(r, "rejections"),
                s(r, "blocked"),
                s(&r["spec"], "upstream"),
            ]
        }),
    );
}

pub fn revision(g: &Global, cmd: &RevisionCmd) -> anyhow::Result<ExitCode> {
    let a = api(g)?;
    // The user's file, read before anything is sent.
    let predictor: Option<Value> =
        match cmd {
            RevisionCmd::Add {
                predictor: Some(path),
                ..
            } => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("--predictor {}: {e}", path.display()))?;
                Some(serde_json::from_str(&text).map_err(|e| {
                    anyhow::anyhow!("--predictor {}: not JSON: {e}", path.display())
                })?)
            }
            _ => None,
        };
    Ok(finish((|| match cmd {
        RevisionCmd::Add {
            model,
            upstream,
            grpc_upstream,
            artifact,
            readiness_path,
            timeout_ms,
            ..
        } => {
            let mut spec = json!({ "upstream": upstream });
            if let Some(p) = &predictor {
                spec["predictor"] = p.clone();
            }
            for (k, v) in [
                ("grpc_upstream", json!(grpc_upstream)),
                ("artifact", json!(artifact)),
                ("readiness_path", json!(readiness_path)),
                ("timeout_ms", json!(timeout_ms)),
            ] {
                if !v.is_null() {
                    spec[k] = v;
                }
            }
            let r = a.call(
                "POST",
                &format!("/api/v1/models/{model}/revisions"),
                Some(&spec),
            )?;
            print(g, &r, |r| println!("{}", s(r, "id")));
            Ok(ExitCode::SUCCESS)
        }
        RevisionCmd::List { model } => {
            let r = a.call("GET", &format!("/api/v1/models/{model}/revisions"), None)?;
            print(g, &r, revision_table);
            Ok(ExitCode::SUCCESS)
        }
    })()))
}

pub fn champion(g: &Global, cmd: &ChampionCmd) -> anyhow::Result<ExitCode> {
    let a = api(g)?;
    let ChampionCmd::Set {
        model,
        revision,
        reason,
    } = cmd;
    Ok(finish((|| {
        let r = a.call(
            "PUT",
            &format!("/api/v1/models/{model}/champion"),
            Some(&json!({ "revision": revision, "reason": reason })),
        )?;
        print(g, &r, |r| println!("champion of {model}: {}", s(r, "id")));
        Ok(ExitCode::SUCCESS)
    })()))
}

fn rollout_record(v: Value) -> Result<RolloutRecord, CallError> {
    serde_json::from_value(v)
        .map_err(|e| CallError::Other(format!("unexpected rollout from the API: {e}")))
}

pub fn rollout(g: &Global, cmd: &RolloutCmd) -> anyhow::Result<ExitCode> {
    let a = api(g)?;
    let action = |id: i64, verb: &str, body: Option<Value>| -> Result<ExitCode, CallError> {
        let r = a.call(
            "POST",
            &format!("/api/v1/rollouts/{id}/{verb}"),
            body.as_ref(),
        )?;
        let rec = rollout_record(r.clone())?;
        print(g, &r, |_| print!("{}", rollout_view(&rec)));
        Ok(ExitCode::SUCCESS)
    };
    Ok(finish((|| match cmd {
        RolloutCmd::Start {
            model,
            revision,
            plan,
        } => start_rollout(g, &a, model, revision, plan.as_deref()),
        RolloutCmd::Status {
            id: Some(id),
            watch,
        } => show_rollout(g, &a, *id, *watch),
        RolloutCmd::Status { id: None, .. } => list_rollouts(g, &a),
        RolloutCmd::Pause { id } => action(*id, "pause", None),
        RolloutCmd::Resume { id } => action(*id, "resume", None),
        RolloutCmd::Abort { id, reason } => action(*id, "abort", Some(json!({ "reason": reason }))),
        RolloutCmd::Promote { id, reason } => {
            action(*id, "promote", Some(json!({ "reason": reason })))
        }
        RolloutCmd::Approve { id, reason } => {
            action(*id, "approve", Some(json!({ "reason": reason })))
        }
        RolloutCmd::Unblock { revision, reason } => {
            let r = a.call(
                "POST",
                &format!("/api/v1/revisions/{revision}/unblock"),
                Some(&json!({ "reason": reason })),
            )?;
            print(g, &r, |r| println!("revision {} unblocked", s(r, "id")));
            Ok(ExitCode::SUCCESS)
        }
        RolloutCmd::Wait {
            id,
            timeout,
            until_promoted,
        } => wait_rollout(&a, *id, *timeout, *until_promoted),
    })()))
}

/// `rollout start`: the plan file read and checked here, so a mistake in
/// it is the user's input, said before anything is sent.
fn start_rollout(
    g: &Global,
    a: &Api,
    model: &str,
    revision: &str,
    plan: Option<&std::path::Path>,
) -> Result<ExitCode, CallError> {
    let plan: Option<Plan> = match plan {
        Some(p) => {
            Some(crate::config::read_toml(p).map_err(|e| CallError::Input(format!("{e:#}")))?)
        }
        None => None,
    };
    if let Some(p) = &plan {
        p.validate().map_err(|e| CallError::Input(e.to_string()))?;
    }
    let r = a.call(
        "POST",
        "/api/v1/rollouts",
        Some(&json!({ "model": model, "revision": revision, "plan": plan })),
    )?;
    print(g, &r, |r| println!("rollout {} started", s(r, "id")));
    Ok(ExitCode::SUCCESS)
}

/// `rollout status ID`: the rollout's view once, or with `--watch` until
/// it ends.
fn show_rollout(g: &Global, a: &Api, id: i64, watch: bool) -> Result<ExitCode, CallError> {
    let mut last_version = None;
    loop {
        let r = a.call("GET", &format!("/api/v1/rollouts/{id}"), None)?;
        let rec = rollout_record(r.clone())?;
        if watch {
            // A screen redrawn on a terminal; elsewhere (a file, a
            // pipe) one view, or one JSON line, per change.
            use std::io::IsTerminal as _;
            let changed = last_version != Some(rec.version);
            last_version = Some(rec.version);
            match g.output {
                Output::Json if changed => println!("{r}"),
                Output::Table if std::io::stdout().is_terminal() => {
                    print!("\x1b[2J\x1b[H{}", rollout_view(&rec));
                }
                Output::Table if changed => println!("{}", rollout_view(&rec)),
                _ => {}
            }
            if rec.state.phase.is_terminal() {
                return Ok(ExitCode::SUCCESS);
            }
            std::thread::sleep(Duration::from_secs(1));
        } else {
            // What a registry said of it (a conflict, a verdict written
            // back), from its timeline.
            let timeline = a
                .call(
                    "GET",
                    &format!("/api/v1/rollouts/{id}/timeline?points=10"),
                    None,
                )
                .unwrap_or_default();
            print(g, &r, |_| {
                print!("{}{}", rollout_view(&rec), registry_lines(&timeline))
            });
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// `rollout status`: the rollouts, newest first, a line each.
fn list_rollouts(g: &Global, a: &Api) -> Result<ExitCode, CallError> {
    let rs = a.call("GET", "/api/v1/rollouts", None)?;
    print(g, &rs, |rs| {
        table(
            &["ID", "MODEL", "CANDIDATE", "PHASE", "EVALUATIONS"],
            rs.as_array().into_iter().flatten().filter_map(|r| {
                let phase = serde_json::from_value::<Phase>(r["phase"].clone()).ok()?;
                Some(vec![
                    r["id"].to_string(),
                    words::clean(&s(r, "model")).into_owned(),
                    s(r, "candidate"),
                    if r["dry_run"] == true {
                        format!("{} (dry run)", words::stage_label(&phase))
                    } else {
                        words::stage_label(&phase)
                    },
                    r["evaluations"].to_string(),
                ])
            }),
        );
    });
    Ok(ExitCode::SUCCESS)
}

/// `rollout wait`: polls until the rollout ends (or, `until_promoted`, is
/// promoted); exit 0 when promoted, 3 when rolled back or aborted, 4 when
/// the watch after promotion rolled it back, an error after `timeout`.
fn wait_rollout(
    a: &Api,
    id: i64,
    timeout: Option<Duration>,
    until_promoted: bool,
) -> Result<ExitCode, CallError> {
    let started = Instant::now();
    loop {
        let rec = rollout_record(a.call("GET", &format!("/api/v1/rollouts/{id}"), None)?)?;
        match &rec.state.phase {
            p @ Phase::RolledBack {
                reason: rollgate_core::RollbackReason::WatchRegression { .. },
            } => {
                println!("{}", words::rollout_phase_line(&rec.spec.plan, p));
                return Ok(ExitCode::from(4));
            }
            Phase::Watching { .. } if until_promoted => {
                println!(
                    "{}",
                    words::rollout_phase_line(&rec.spec.plan, &rec.state.phase)
                );
                return Ok(ExitCode::SUCCESS);
            }
            Phase::Promoted { .. } => {
                println!(
                    "{}",
                    words::rollout_phase_line(&rec.spec.plan, &rec.state.phase)
                );
                return Ok(ExitCode::SUCCESS);
            }
            p @ (Phase::RolledBack { .. } | Phase::Aborted) => {
                println!("{}", words::rollout_phase_line(&rec.spec.plan, p));
                return Ok(ExitCode::from(3));
            }
            _ => {}
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(CallError::Other(format!(
                "rollout {id} still {} after the timeout",
                words::stage_label(&rec.state.phase)
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn audit_line(r: &AuditRecord, local: bool) -> String {
    let mut line = format!(
        "#{:<5} {} {:<12} {:<20} {}",
        r.seq,
        rfc3339(r.at, local),
        words::clean(&r.actor),
        words::clean(&r.kind),
        r.rollout
            .map_or(String::from("-"), |id| format!("rollout {id}"))
    );
    if let Ok(event) = serde_json::from_value::<rollgate_core::AuditEvent>(r.body.clone()) {
        line.push_str(&format!(
            "  {} -> {}",
            words::stage_label(&event.from),
            words::stage_label(&event.to)
        ));
        if let Some(note) = &event.note {
            line.push_str(&format!("  ({})", words::clean(note)));
        }
        if let Some(v) = &event.verdict {
            line.push_str(&format!(
                "\n        verdict {:?}: {}",
                v.outcome,
                v.reason.code()
            ));
            for l in words::verdict_lines(v) {
                line.push_str(&format!("\n          {l}"));
            }
        }
    } else if let Some(reason) = r.body.get("reason").and_then(Value::as_str) {
        line.push_str(&format!("  reason: {}", words::clean(reason)));
    }
    line
}

pub fn audit(g: &Global, args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let a = api(g)?;
    Ok(finish((|| {
        if let Some(AuditCmd::Verify) = args.cmd {
            let report = a.call("GET", "/api/v1/audit/verify", None)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
            let broken = report.get("first_break").is_some_and(|b| !b.is_null());
            let unanchored = report["anchors"]["problems"]
                .as_array()
                .is_some_and(|p| !p.is_empty());
            return Ok(if broken || unanchored {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            });
        }
        let mut q = Vec::new();
        if let Some(r) = args.rollout {
            q.push(format!("rollout={r}"));
        }
        if let Some(m) = &args.model {
            q.push(format!("model={m}"));
        }
        let query = if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        };
        if args.format == Output::Json || g.output == Output::Json {
            let raw = a.call_raw("GET", &format!("/api/v1/audit/export{query}"), None)?;
            print!("{}", String::from_utf8_lossy(&raw));
            return Ok(ExitCode::SUCCESS);
        }
        let records: Vec<AuditRecord> =
            serde_json::from_value(a.call("GET", &format!("/api/v1/audit{query}"), None)?)
                .map_err(|e| CallError::Other(e.to_string()))?;
        let mut hidden = 0;
        for r in &records {
            if !args.all && r.kind == "evaluated" {
                hidden += 1;
                continue;
            }
            println!("{}", audit_line(r, g.local_time));
        }
        if hidden > 0 {
            println!("({hidden} evaluations not shown; --all shows them)");
        }
        Ok(ExitCode::SUCCESS)
    })()))
}

#[cfg(test)]
mod table_tests {
    use super::*;

    /// A long name widens its column instead of pushing the rest of its row
    /// out of line.
    #[test]
    fn columns_stay_aligned_with_long_names() {
        let text = table_text(
            &["MODEL", "PROTOCOL", "CHAMPION"],
            [
                vec!["m".into(), "json".into(), "r1".into()],
                vec![
                    "a-model-with-a-very-long-name-indeed".into(),
                    "kserve_v1".into(),
                    "r2".into(),
                ],
            ],
        );
        let starts: Vec<usize> = text
            .lines()
            .map(|l| l.find(['P', 'j', 'k']).unwrap_or(0))
            .collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{text}");
    }
}
