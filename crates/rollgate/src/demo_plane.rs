//! `rollgate demo --data-plane nginx`: the demo's three rollouts with
//! another data plane serving the users. A real nginx splits the traffic
//! (its weights set by the nginx adapter) and mirrors a copy of every
//! request to rollgate's gateway, which only measures SHADOW; a real
//! Prometheus scrapes the model servers, and the canary stages are judged
//! on what it scraped. Both are started here on loopback ports under the
//! demo's directory and stopped (by their PIDs) when this is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rollgate_controller::http::HttpClient;
use rollgate_store::{DataPlane, PrometheusEvidence};

/// The programs the data-plane demo runs, found on `PATH` (or in
/// `/usr/sbin`, where Debian puts nginx).
pub struct Tools {
    nginx: PathBuf,
    prometheus: PathBuf,
}

/// Finds nginx and Prometheus, or says which are missing and how to get
/// them.
pub fn tools() -> Result<Tools, String> {
    let (nginx, prometheus) = (find("nginx"), find("prometheus"));
    match (nginx, prometheus) {
        (Some(nginx), Some(prometheus)) => Ok(Tools { nginx, prometheus }),
        (nginx, prometheus) => {
            let missing: Vec<&str> = [
                ("nginx", nginx.is_none()),
                ("prometheus", prometheus.is_none()),
            ]
            .into_iter()
            .filter_map(|(name, absent)| absent.then_some(name))
            .collect();
            Err(format!(
                "rollgate demo --data-plane nginx needs nginx and Prometheus, and {} not \
                 installed (Debian: apt-get install nginx prometheus). `rollgate demo` alone \
                 runs the same rollouts through rollgate's own gateway.",
                match missing.as_slice() {
                    [one] => format!("{one} is"),
                    _ => format!("{} are", missing.join(" and ")),
                }
            ))
        }
    }
}

fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// nginx and Prometheus, running; stopped when dropped.
pub struct ExternalPlane {
    nginx: Child,
    /// `nginx -c <conf> -s stop`: the master stops its workers (killing
    /// the master alone would leave them running).
    nginx_stop: Vec<String>,
    prometheus: Child,
    /// Where users send their requests: nginx.
    pub users: String,
    pub prometheus_url: String,
}

/// The demo's nginx as the controller's config declares it, chosen before
/// anything starts: the controller starts with its `[data_planes]`.
pub struct Layout {
    dir: String,
    users: String,
    include: String,
    conf: String,
    /// Declared as `[data_planes.nginx]`; the model names it.
    pub data_plane: DataPlane,
}

/// The name the demo's model gives its data plane.
pub const PLANE: &str = "nginx";

/// Where the demo's nginx keeps its files and serves the users.
pub fn layout(tools: &Tools, dir: &Path) -> anyhow::Result<Layout> {
    let d = dir.join("external");
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    let d = d.to_string_lossy().into_owned();
    let users = free_addr()?;
    let include = format!("{d}/rollgate-fraud.conf");
    let conf = format!("{d}/nginx.conf");
    let nginx_bin = tools.nginx.to_string_lossy().into_owned();
    Ok(Layout {
        data_plane: DataPlane::Nginx {
            include_file: include.clone(),
            reload_command: vec![
                nginx_bin,
                "-c".into(),
                conf.clone(),
                "-s".into(),
                "reload".into(),
            ],
            confirm_url: format!("http://{users}/rollgate/routing/fraud"),
            key: "$http_x_rollgate_key".into(),
        },
        dir: d,
        users,
        include,
        conf,
    })
}

impl Drop for ExternalPlane {
    fn drop(&mut self) {
        if let Some((program, args)) = self.nginx_stop.split_first() {
            let _ = Command::new(program)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        stop_within(&mut self.nginx, Duration::from_secs(5));
        let _ = self.prometheus.kill();
        let _ = self.prometheus.wait();
    }
}

/// Waits for `child` to exit, killing it after `grace`.
fn stop_within(child: &mut Child, grace: Duration) {
    let started = Instant::now();
    while started.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A loopback address with a port free right now.
fn free_addr() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

/// Starts Prometheus scraping `servers` (host:port, every second) and
/// nginx serving model `fraud` from `champion` (host:port) until the
/// adapter writes its routing, mirroring every request to `gateway`.
pub fn start(
    tools: &Tools,
    layout: &Layout,
    champion: &str,
    servers: &[String],
    gateway: &str,
) -> anyhow::Result<ExternalPlane> {
    let d = layout.dir.clone();

    let prometheus_addr = free_addr()?;
    let targets: Vec<String> = servers.iter().map(|s| format!("'{s}'")).collect();
    std::fs::write(
        format!("{d}/prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: models\n    \
             static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )?;
    let prometheus = Command::new(&tools.prometheus)
        .arg(format!("--config.file={d}/prometheus.yml"))
        .arg(format!("--storage.tsdb.path={d}/prometheus-data"))
        .arg(format!("--web.listen-address={prometheus_addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(format!("{d}/prometheus.log"))?)
        .spawn()
        .with_context(|| format!("starting {}", tools.prometheus.display()))?;

    let (users, include, conf) = (
        layout.users.clone(),
        layout.include.clone(),
        layout.conf.clone(),
    );
    // nginx needs the variables the include defines before the adapter
    // first writes it: seeded with the champion.
    std::fs::write(
        &include,
        format!(
            "# Written by rollgate (a seed)\n\
             upstream seed {{ server {champion}; }}\n\
             split_clients \"$http_x_rollgate_key\" $rollgate_fraud_upstream {{ * seed; }}\n\
             map $host $rollgate_fraud_version {{ default \"seed\"; }}\n"
        ),
    )?;
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             include {include};\n  \
             server {{\n    listen {users};\n    \
             location /v1/models/ {{\n      mirror /rollgate-mirror;\n      \
             proxy_pass http://$rollgate_fraud_upstream;\n      proxy_http_version 1.1;\n      \
             proxy_set_header Connection \"\";\n    }}\n    \
             location = /rollgate-mirror {{ internal; proxy_pass http://{gateway}$request_uri;\n      \
             proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n    \
             location = /rollgate/routing/fraud {{ return 200 $rollgate_fraud_version; }}\n  }}\n}}\n"
        ),
    )?;
    let nginx = Command::new(&tools.nginx)
        .args(["-c", &conf, "-e", &format!("{d}/nginx-error.log")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let nginx = match nginx {
        Ok(nginx) => nginx,
        Err(e) => {
            let mut prometheus = prometheus;
            let _ = prometheus.kill();
            let _ = prometheus.wait();
            return Err(e).with_context(|| format!("starting {}", tools.nginx.display()));
        }
    };
    let nginx_bin = tools.nginx.to_string_lossy().into_owned();
    let plane = ExternalPlane {
        nginx,
        nginx_stop: vec![nginx_bin, "-c".into(), conf, "-s".into(), "stop".into()],
        prometheus,
        prometheus_url: format!("http://{prometheus_addr}"),
        users,
    };
    let started = Instant::now();
    while std::net::TcpStream::connect(&plane.users).is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            anyhow::bail!(
                "nginx did not listen on {} within 10 s: see {d}/nginx-error.log",
                plane.users
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(plane)
}

impl ExternalPlane {
    /// The model's evidence: `rollgate serve`'s MLServer-shaped counters
    /// and latency buckets, told apart by instance, scraped every second,
    /// with a 1.5 s horizon (the demo's requests take milliseconds).
    pub fn evidence(&self) -> PrometheusEvidence {
        PrometheusEvidence {
            url: self.prometheus_url.clone(),
            latency_buckets: Some(
                r#"model_infer_request_duration_bucket{model="$served_name",instance="$instance"}"#
                    .into(),
            ),
            scrape_interval_ms: 1_000,
            horizon_ms: 1_500,
            ..PrometheusEvidence::default()
        }
    }

    /// Waits until Prometheus has scraped `targets` model servers
    /// (bounded: 60 s).
    pub async fn scraped(&self, targets: usize) -> anyhow::Result<()> {
        let http = HttpClient::new(Duration::from_secs(2));
        let url = format!(
            "{}/api/v1/query?query=count(up%3D%3D1)",
            self.prometheus_url
        );
        let started = Instant::now();
        loop {
            let up = match http.get(&url).await {
                Some((200, body)) => serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| {
                        v["data"]["result"][0]["value"][1]
                            .as_str()?
                            .parse::<f64>()
                            .ok()
                    }),
                _ => None,
            };
            if up == Some(targets as f64) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("Prometheus did not scrape the {targets} model servers within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
