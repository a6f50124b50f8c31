//! `rollgate operator`: the `Model` and `ModelRollout` custom resources
//! followed on a Kubernetes API server and mirrored into rollgate through
//! its admin API (`rollgate-operator`), and their CRDs printed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use rollgate_store::KubeAccess;

use crate::logging::{LogFormat, init_logging};

#[derive(Subcommand, Debug)]
pub enum OperatorCmd {
    /// Follow the custom resources until SIGTERM.
    Run(Box<RunArgs>),
    /// Print the CRDs (`rollgate operator crds | kubectl apply -f -`; the
    /// same as deploy/kubernetes/crds.yaml).
    Crds,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The admin API the objects are mirrored into (with an admin's
    /// token in `ROLLGATE_TOKEN`: the operator registers models).
    #[arg(long, env = "ROLLGATE_API", default_value = "http://127.0.0.1:7070")]
    api: String,
    /// A PEM file of CA certificates to trust for an `https://` API.
    #[arg(long, env = "ROLLGATE_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// The namespace whose objects to follow (one: whoever may write
    /// these objects there acts as a rollgate admin for them).
    #[arg(long, env = "ROLLGATE_NAMESPACE")]
    namespace: String,
    /// How often an active rollout's status is refreshed.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    resync: Duration,
    /// The Kubernetes API server's URL (else in-cluster, then the kubeconfig).
    #[arg(long, value_name = "URL")]
    kube_url: Option<String>,
    /// With --kube-url: the PEM CA that signed its certificate.
    #[arg(long, value_name = "FILE")]
    kube_ca_file: Option<String>,
    /// With --kube-url: a file holding a bearer token.
    #[arg(long, value_name = "FILE")]
    kube_token_file: Option<String>,
    /// A kubeconfig to read instead of the inferred one.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<String>,
    /// The kubeconfig context (its current one if absent).
    #[arg(long)]
    context: Option<String>,
    /// Where the probes are served (`/healthz`, `/readyz`).
    #[arg(long, default_value = "127.0.0.1:8081")]
    health_listen: std::net::SocketAddr,
    /// Log lines on stderr: `text` or `json`.
    #[arg(long, value_enum, default_value_t, env = "ROLLGATE_LOG_FORMAT")]
    log_format: LogFormat,
}

pub fn run(cmd: &OperatorCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        OperatorCmd::Crds => crate::to_stdout(rollgate_operator::resources::crds_yaml().as_bytes()),
        OperatorCmd::Run(args) => follow(args),
    }
}

fn follow(args: &RunArgs) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format);
    let access = KubeAccess {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        url: args.kube_url.clone(),
        ca_file: args.kube_ca_file.clone(),
        token_file: args.kube_token_file.clone(),
    };
    let token = std::env::var("ROLLGATE_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let tls = rollgate_net::ClientTls {
        ca_file: args.ca_cert.clone(),
        ..rollgate_net::ClientTls::default()
    };
    let admin = rollgate_operator::AdminApi::new(&args.api, token, &tls)
        .map_err(|e| crate::client::InputError(format!("--ca-cert: {e}")))?;
    let options = rollgate_operator::Options {
        namespace: args.namespace.clone(),
        resync: args.resync,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let mut config = rollgate_adapters::kubernetes::config(&access)
            .await
            .map_err(|e| crate::client::InputError(e.to_string()))?;
        config.connect_timeout = Some(Duration::from_secs(10));
        let client = kube::Client::try_from(config).context("a Kubernetes client")?;
        let listener = tokio::net::TcpListener::bind(args.health_listen)
            .await
            .map_err(|e| crate::client::InputError(format!("--health-listen {}: {e}", args.health_listen)))?;
        let probes = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let health = tokio::spawn(rollgate_operator::health::serve(
            listener,
            client.clone(),
            admin.clone(),
            async move {
                let mut stopped = stopped;
                let _ = stopped.wait_for(|s| *s).await;
            },
        ));
        // The first line names the probes and the API (scripts and tests
        // wait for it).
        println!(
            "rollgate operator: probes on http://{probes} and Model and ModelRollout objects mirrored into {}",
            args.api
        );
        tracing::info!(api = %args.api, namespace = %args.namespace, "following Model and ModelRollout");
        rollgate_operator::run(client, admin, options, crate::serve::shutdown_signal()).await;
        let _ = stop.send(true);
        let _ = health.await;
        Ok(ExitCode::SUCCESS)
    })
}
