//! Beyond one host, with real processes: gateways and two controllers that
//! share one PostgreSQL store (`tests/postgres/start.sh` starts it; CI
//! must have it, a local run without `ROLLGATE_TEST_POSTGRES` says it
//! skipped). One controller leads by a lease; the other takes over when it
//! dies, and a paused leader can never commit after it lost the lease.
//! Every wait is bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::json;

use crate::common::*;

/// A fresh database on the test PostgreSQL server, or `None` (locally,
/// with a note) when there is none.
async fn postgres_store(name: &str) -> Option<String> {
    let server = match std::env::var("ROLLGATE_TEST_POSTGRES") {
        Ok(url) => url,
        Err(_) if std::env::var_os("CI").is_some() => panic!(
            "ROLLGATE_TEST_POSTGRES is not set: CI starts PostgreSQL with tests/postgres/start.sh"
        ),
        Err(_) => {
            eprintln!(
                "skipped: ROLLGATE_TEST_POSTGRES is unset (start one with tests/postgres/start.sh)"
            );
            return None;
        }
    };
    let name = format!("rg_ha_{name}_{}", std::process::id());
    let url = tokio::task::spawn_blocking(move || rollgate_store::scratch_database(&server, &name))
        .await
        .expect("task")
        .expect("scratch database");
    Some(url)
}

/// The default lease (6 s): takeover within 10 s is the promise.
const HA_CONTROLLER_TOML: &str = r#"
[api]
listen = "127.0.0.1:0"
[controller]
tick = "200ms"
gateway_ttl = "3s"
"#;

/// Controllers of one store share one checkpoint key (a controller with
/// another refuses to start: see `a_controller_with_another_checkpoint_key_refuses_to_start`).
fn controller_on(dir: &std::path::Path, n: usize, store: &str) -> Proc {
    controller_with(dir, n, store, "")
}

/// [`controller_on`] with more `[controller]` settings.
fn controller_with(dir: &std::path::Path, n: usize, store: &str, more: &str) -> Proc {
    let key = dir.join("audit-shared.key");
    let cfg = write(
        dir,
        &format!("controller-{n}.toml"),
        &format!(
            "{HA_CONTROLLER_TOML}{more}[audit]\ncheckpoint_key_file = {:?}\n",
            key.to_string_lossy()
        ),
    );
    let data = dir.join(format!("controller-{n}"));
    spawn(
        &[
            "controller",
            "--store",
            store,
            "--data",
            &data.to_string_lossy(),
            "--config",
            &cfg,
        ],
        &[],
    )
}

fn gateway_on(store: &str, id: &str) -> Proc {
    spawn(
        &[
            "gateway",
            "--store",
            store,
            "--listen",
            "127.0.0.1:0",
            "--id",
            id,
        ],
        &[],
    )
}

/// Test hosts: network namespaces on one bridge (`ip netns` + veth), the
/// host at `.1`, namespace `k` at `.(k+1)`. Removed when dropped.
struct Hosts {
    bridge: String,
    namespaces: Vec<String>,
    subnet: String,
}

fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Hosts {
    /// `n` namespaces, or `None` (locally, with a note) where they cannot
    /// be made (not root); in CI that is the test's failure.
    fn new(n: usize) -> Option<Hosts> {
        let pid = std::process::id();
        let subnet = format!("10.213.{}", pid % 250);
        let mut hosts = Hosts {
            bridge: format!("rgb{pid}"),
            namespaces: Vec::new(),
            subnet,
        };
        let made = ip(&["link", "add", &hosts.bridge, "type", "bridge"])
            && ip(&[
                "addr",
                "add",
                &format!("{}.1/24", hosts.subnet),
                "dev",
                &hosts.bridge,
            ])
            && ip(&["link", "set", &hosts.bridge, "up"]);
        if !made {
            assert!(
                std::env::var_os("CI").is_none(),
                "this test makes network namespaces: run it as root (CAP_NET_ADMIN)"
            );
            eprintln!("skipped: cannot make network namespaces (not root); CI runs it");
            return None;
        }
        for k in 1..=n {
            let (ns, host_end, ns_end) = (
                format!("rg{pid}-{k}"),
                format!("rgv{pid}{k}"),
                format!("rgp{pid}{k}"),
            );
            let addr = format!("{}.{}/24", hosts.subnet, k + 1);
            let ok = ip(&["netns", "add", &ns])
                && {
                    hosts.namespaces.push(ns.clone());
                    true
                }
                && ip(&[
                    "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end,
                ])
                && ip(&["link", "set", &host_end, "master", &hosts.bridge])
                && ip(&["link", "set", &host_end, "up"])
                && ip(&["link", "set", &ns_end, "netns", &ns])
                && ip(&["-n", &ns, "addr", "add", &addr, "dev", &ns_end])
                && ip(&["-n", &ns, "link", "set", &ns_end, "up"])
                && ip(&["-n", &ns, "link", "set", "lo", "up"]);
            assert!(ok, "setting up namespace {ns}");
        }
        Some(hosts)
    }

    fn host_ip(&self) -> String {
        format!("{}.1", self.subnet)
    }

    fn ip_of(&self, k: usize) -> String {
        format!("{}.{}", self.subnet, k + 2)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            ip(&["netns", "del", ns]);
        }
        ip(&["link", "del", &self.bridge]);
    }
}

/// Forwards TCP from `listen_ip` to `to` (PostgreSQL stays on loopback;
/// the namespaces reach it through this); returns the listening address.
async fn forward(listen_ip: &str, to: String) -> String {
    let listener = tokio::net::TcpListener::bind((listen_ip, 0))
        .await
        .expect("bind forwarder");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    addr
}

/// Forwards TCP from loopback to `to` until `frozen` is set; then no byte
/// moves either way and no connection closes, as on a link that died
/// silently. Returns the listening address.
async fn forward_freezable(to: String, frozen: Arc<AtomicBool>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind forwarder");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(out) = tokio::net::TcpStream::connect(&to).await else {
                continue;
            };
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = out.into_split();
            for (mut from, mut to) in [(ri, wo), (ro, wi)] {
                let frozen = Arc::clone(&frozen);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        while frozen.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        let n = match from.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while frozen.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        if to.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    addr
}

/// `store` reached through a forwarder that `frozen` freezes.
async fn freezable(store: &str, frozen: &Arc<AtomicBool>) -> String {
    let host_port = store
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("host:port in the store URL")
        .to_string();
    let via = forward_freezable(host_port, Arc::clone(frozen)).await;
    with_host(store, &via)
}

/// `url` with its `host:port` replaced.
fn with_host(url: &str, host_port: &str) -> String {
    let at = url
        .find('@')
        .map_or(url.find("://").expect("a URL") + 3, |i| i + 1);
    let end = url[at..].find('/').map_or(url.len(), |i| at + i);
    format!("{}{host_port}{}", &url[..at], &url[end..])
}

/// Whether controller `ctl` says it leads.
async fn leads(c: &HttpClient, ctl: &Proc) -> bool {
    let (s, v) = api(c, ctl, "GET", "/api/v1/leader", None).await;
    s == 200 && v["this"]["leading"] == true
}

/// Waits (bounded) until exactly one of `ctls` leads; returns its index.
async fn leader_of(c: &HttpClient, ctls: &[&Proc], limit: Duration) -> usize {
    let started = Instant::now();
    loop {
        let mut leading = Vec::new();
        for (i, ctl) in ctls.iter().enumerate() {
            if leads(c, ctl).await {
                leading.push(i);
            }
        }
        if let [one] = leading[..] {
            return one;
        }
        assert!(
            started.elapsed() < limit,
            "no single leader within {limit:?}: {leading:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Traffic over several gateways that counts what was answered 200.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    ok: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn load(gateways: &[&Proc]) -> Load {
    let (stop, sent, ok) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let tasks = gateways
        .iter()
        .enumerate()
        .map(|(g, gw)| {
            let url = format!("http://{}/v1/models/m:predict", gw.addr());
            let (stop, sent, ok) = (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&ok));
            tokio::spawn(async move {
                let c = client();
                let started = Instant::now();
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(150) {
                    let req = Request::builder()
                        .method("POST")
                        .uri(&url)
                        .header("content-type", "application/json")
                        .header("x-rollgate-key", format!("user-{g}-{}", n % 3000))
                        .body(Full::new(Bytes::from_static(br#"{"instances":[[1,2]]}"#)))
                        .expect("request");
                    sent.fetch_add(1, Ordering::SeqCst);
                    if let Ok(Ok(r)) =
                        tokio::time::timeout(Duration::from_secs(5), c.request(req)).await
                    {
                        if r.status() == 200 {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        let _ = r.into_body().collect().await;
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            })
        })
        .collect();
    Load {
        stop,
        sent,
        ok,
        tasks,
    }
}

impl Load {
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        (
            self.sent.load(Ordering::SeqCst),
            self.ok.load(Ordering::SeqCst),
        )
    }
}

/// Every transition of rollout `id` recorded exactly once.
async fn recorded_once(c: &HttpClient, ctl: &Proc, id: i64, outcome: &str) {
    let kinds = audit_kinds(c, ctl, id).await;
    assert_eq!(count(&kinds, "started"), 1, "{kinds:?}");
    assert_eq!(count(&kinds, outcome), 1, "{kinds:?}");
    if outcome == "promoted" {
        assert_eq!(count(&kinds, "advanced"), 2, "{kinds:?}");
        assert_eq!(count(&kinds, "champion_set"), 1, "{kinds:?}");
    }
    assert!(chain_intact(c, ctl).await);
}

/// Which revision gateway `gw` routes a request of key `key` to.
async fn routed_to(c: &HttpClient, gw: &Proc, key: &str) -> Option<String> {
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{}/v1/models/m:predict", gw.addr()))
        .header("content-type", "application/json")
        .header("x-rollgate-key", key)
        .body(Full::new(Bytes::from_static(br#"{"instances":[[1,2]]}"#)))
        .expect("request");
    let r = tokio::time::timeout(Duration::from_secs(5), c.request(req))
        .await
        .ok()?
        .ok()?;
    r.headers()
        .get("x-rollgate-revision")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_three_hosts_two_controllers_one_postgres_promote_and_roll_back() {
    let Some(store) = postgres_store("hosts").await else {
        return;
    };
    let Some(hosts) = Hosts::new(3) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let a = controller_on(dir.path(), 1, &store);
    let b = controller_on(dir.path(), 2, &store);
    let c = client();
    // Model servers and the database are reached at the host's address on
    // the hosts' network.
    let champion = model_server_on(Model::new(false), &hosts.host_ip()).await;
    let candidate = model_server_on(Model::new(false), &hosts.host_ip()).await;
    let (champ, cand) = setup(&c, &a, &champion, &candidate).await;
    let pg_addr = store
        .split_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .expect("host:port in the store URL")
        .to_string();
    let remote_store = with_host(&store, &forward(&hosts.host_ip(), pg_addr).await);
    let gws: Vec<Proc> = (0..3)
        .map(|k| {
            let listen = format!("{}:0", hosts.ip_of(k));
            spawn_in(
                Some(&hosts.namespaces[k]),
                &[
                    "gateway",
                    "--store",
                    &remote_store,
                    "--listen",
                    &listen,
                    "--id",
                    &format!("gw-{k}"),
                ],
                &[],
            )
        })
        .collect();
    for (k, gw) in gws.iter().enumerate() {
        assert!(gw.addr().starts_with(&hosts.ip_of(k)), "{}", gw.addr());
    }
    let lead = leader_of(&c, &[&a, &b], Duration::from_secs(15)).await;
    let ctl = [&a, &b][lead];
    let traffic = load(&gws.iter().collect::<Vec<_>>());

    // An identical candidate is promoted, every transition recorded once,
    // whichever controller is asked.
    let id = start_rollout(&c, &b, &cand).await;
    let r = wait_for(&c, ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    // The controller merged every host's stats: a series per gateway.
    let series: Vec<&String> = r["state"]["evidence"]["series"]
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    for k in 0..3 {
        assert!(
            series.iter().any(|s| s.contains(&format!("gw-{k}"))),
            "gw-{k} in {series:?}"
        );
    }
    recorded_once(&c, [&a, &b][1 - lead], id, "promoted").await;

    // A next candidate dies in canary: rolled back, and every gateway
    // sends everyone to the champion.
    let dying_model = Model::new(false);
    let dying_url = model_server_on(dying_model.clone(), &hosts.host_ip()).await;
    let (s, _) = api(
        &c,
        &a,
        "POST",
        "/api/v1/models/m/revisions",
        Some(json!({ "upstream": dying_url })),
    )
    .await;
    assert_eq!(s, 201);
    let (_, revs) = api(&c, &a, "GET", "/api/v1/models/m/revisions", None).await;
    let dying = revs
        .as_array()
        .expect("revisions")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .find(|id| *id != champ && *id != cand)
        .expect("the new revision")
        .to_string();
    let id = start_rollout(&c, &a, &dying).await;
    wait_for(&c, ctl, id, Duration::from_secs(60), |r| {
        phase(r) == "canary"
    })
    .await;
    dying_model.failing.store(true, Ordering::SeqCst);
    let r = wait_for(&c, ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    recorded_once(&c, ctl, id, "rolled_back").await;
    // Within a follow interval (plus slack) every gateway routes every key
    // to the champion (the previous candidate, promoted above).
    tokio::time::sleep(Duration::from_secs(2)).await;
    for gw in &gws {
        for k in 0..40 {
            assert_eq!(
                routed_to(&c, gw, &format!("probe-{k}")).await.as_deref(),
                Some(cand.as_str()),
                "gateway {} key {k}",
                gw.addr()
            );
        }
    }
    let (sent, ok) = traffic.stop().await;
    assert!(sent > 0 && ok > 0, "{ok}/{sent}");
}

/// Two controllers, one gateway and live traffic on a fresh database, a
/// rollout (stages of `min_stage`) in its canary: what the leader tests
/// start from.
struct MidCanary {
    _dir: tempfile::TempDir,
    ctls: [Proc; 2],
    /// Which of `ctls` leads.
    lead: usize,
    c: HttpClient,
    _gw: Proc,
    traffic: Load,
    id: i64,
}

async fn mid_canary(store: &str, min_stage: &str) -> MidCanary {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctls = [
        controller_on(dir.path(), 1, store),
        controller_on(dir.path(), 2, store),
    ];
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctls[0], &champion, &candidate).await;
    let gw = gateway_on(store, "gw");
    let traffic = load(&[&gw]);
    let lead = leader_of(&c, &[&ctls[0], &ctls[1]], Duration::from_secs(15)).await;
    let mut p = plan();
    p["min_stage_duration"] = json!(min_stage);
    // A stage spans the take-over (a lease of 6 s, and the leader's
    // session ended by the server if it was paused inside a transaction):
    // its evidence deadline must not be the plan's 10 s on a loaded machine.
    p["evidence_timeout"] = json!("30s");
    let id = start_rollout_with(&c, &ctls[0], &cand, p).await;
    wait_for(&c, &ctls[lead], id, Duration::from_secs(60), |r| {
        phase(r) == "canary"
    })
    .await;
    MidCanary {
        _dir: dir,
        ctls,
        lead,
        c,
        _gw: gw,
        traffic,
        id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_mid_canary_is_replaced_within_ten_seconds() {
    let Some(store) = postgres_store("kill").await else {
        return;
    };
    let MidCanary {
        _dir,
        mut ctls,
        lead,
        c,
        _gw,
        traffic,
        id,
    } = mid_canary(&store, "4s").await;
    ctls[lead].kill(); // SIGKILL, mid-canary: no lease handed over
    let killed = Instant::now();
    let other = &ctls[1 - lead];
    let started = Instant::now();
    while !leads(&c, other).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no takeover within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "takeover {:?} after the leader was killed",
        killed.elapsed()
    );
    let r = wait_for(&c, other, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    recorded_once(&c, other, id, "promoted").await;
    let (_, lease) = api(&c, other, "GET", "/api/v1/leader", None).await;
    assert!(
        lease["lease"]["fence"]["token"].as_u64() >= Some(2),
        "a new holder, a new token: {lease}"
    );
    let (sent, ok) = traffic.stop().await;
    assert!(ok > 0, "{ok}/{sent}");
}

/// SIGSTOP / SIGCONT by pid (the test's own children only).
fn signal(p: &Proc, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_never_commits_again_and_stands_by() {
    let Some(store) = postgres_store("pause").await else {
        return;
    };
    let MidCanary {
        _dir,
        ctls,
        lead,
        c,
        _gw,
        traffic,
        id,
    } = mid_canary(&store, "3s").await;
    signal(&ctls[lead], "-STOP");
    let other = &ctls[1 - lead];
    let started = Instant::now();
    while !leads(&c, other).await {
        assert!(started.elapsed() < Duration::from_secs(10), "no takeover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past its lease and taken over: wake the old leader mid-rollout.
    signal(&ctls[lead], "-CONT");
    let r = wait_for(&c, other, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    recorded_once(&c, other, id, "promoted").await;
    // It stood by: it says so, and the lease is the other's.
    let old = &ctls[lead];
    let started = Instant::now();
    while leads(&c, old).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the paused leader still claims the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, l) = api(&c, old, "GET", "/api/v1/leader", None).await;
    let (_, o) = api(&c, other, "GET", "/api/v1/leader", None).await;
    assert_eq!(l["lease"]["holder"], o["this"]["holder"], "{l} {o}");
    let (sent, ok) = traffic.stop().await;
    assert!(ok > 0, "{ok}/{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_rollout_keeps_gateways_serving_and_loses_nothing() {
    let Some(store) = postgres_store("restart").await else {
        return;
    };
    let Ok(pg_dir) = std::env::var("ROLLGATE_POSTGRES_DIR") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI sets ROLLGATE_POSTGRES_DIR (tests/postgres/start.sh) so this test can restart it"
        );
        eprintln!("skipped: ROLLGATE_POSTGRES_DIR is unset: no PostgreSQL of ours to restart");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = controller_on(dir.path(), 1, &store);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let gws = [gateway_on(&store, "gw-1"), gateway_on(&store, "gw-2")];
    leader_of(&c, &[&ctl], Duration::from_secs(15)).await;
    let traffic = load(&[&gws[0], &gws[1]]);
    let mut p = plan();
    p["min_stage_duration"] = json!("3s");
    let id = start_rollout_with(&c, &ctl, &cand, p).await;
    wait_for(&c, &ctl, id, Duration::from_secs(60), |r| {
        phase(r) == "canary"
    })
    .await;
    let sent_before = traffic.sent.load(Ordering::SeqCst);
    let ctl_script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/postgres/ctl.sh");
    // A crash: immediate stop (clients cut, recovery from the WAL), start.
    let crashed = std::process::Command::new(ctl_script)
        .args(["crash", &pg_dir])
        .status()
        .expect("ctl.sh");
    assert!(crashed.success(), "PostgreSQL crashed and came back");
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    recorded_once(&c, &ctl, id, "promoted").await;
    let (_, v) = api(&c, &ctl, "GET", "/api/v1/audit/verify", None).await;
    assert!(v["chain"]["first_break"].is_null(), "{v}");
    assert_eq!(v["anchors"]["problems"], json!([]), "{v}");
    let (sent, ok) = traffic.stop().await;
    // Every request, those sent while the store restarted included, was
    // answered (the load waits for its last requests before it counts).
    assert!(sent > sent_before, "traffic ran across the restart");
    assert_eq!(ok, sent, "requests failed across the restart");
}

/// The leader's link to PostgreSQL dies silently (a frozen forwarder: no
/// reset, no FIN). The standby leads within the lease and a renewal (plus
/// the database noticing, about a third of the lease), and the cut-off
/// controller answers `GET /api/v1/leader` at once throughout: not
/// leading, the store unreachable since when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_store_is_replaced_and_says_so_at_once() {
    let Some(store) = postgres_store("cut").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client();
    let frozen = Arc::new(AtomicBool::new(false));
    let cut_off = controller_on(dir.path(), 0, &freezable(&store, &frozen).await);
    assert_eq!(leader_of(&c, &[&cut_off], Duration::from_secs(15)).await, 0);
    let standby = controller_on(dir.path(), 1, &store);
    assert_eq!(
        leader_of(&c, &[&cut_off, &standby], Duration::from_secs(15)).await,
        0
    );
    frozen.store(true, Ordering::SeqCst);
    let cut = Instant::now();
    // lease_ttl 6 s + a renewal 2 s + detection 2 s.
    let bound = Duration::from_secs(10);
    let mut said_unreachable = false;
    loop {
        let asked = Instant::now();
        let (s, v) = api(&c, &cut_off, "GET", "/api/v1/leader", None).await;
        let took = asked.elapsed();
        assert!(
            s == 200 && took < Duration::from_millis(1_500),
            "the cut-off controller answered {s} after {took:?}: {v}"
        );
        if v["this"]["standing"] == "store unreachable" {
            assert_eq!(v["store_answered"], false, "{v}");
            assert!(v["store_unreachable_since"].as_u64().is_some(), "{v}");
            said_unreachable = true;
        }
        if leads(&c, &standby).await {
            break;
        }
        assert!(
            cut.elapsed() < bound,
            "no take-over within {bound:?} of the cut"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "take-over {:?} after the leader's link froze",
        cut.elapsed()
    );
    assert!(
        said_unreachable,
        "the cut-off controller never said the store was unreachable"
    );
    assert!(!leads(&c, &cut_off).await, "both lead");
    // The link heals: the old leader stands by, and says so.
    frozen.store(false, Ordering::SeqCst);
    let healed = Instant::now();
    loop {
        let (_, v) = api(&c, &cut_off, "GET", "/api/v1/leader", None).await;
        if v["this"]["standing"] == "standing by" {
            break;
        }
        assert!(healed.elapsed() < Duration::from_secs(30), "{v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(leads(&c, &standby).await);
}

/// One audit log, one signer: controllers sharing a store share the
/// checkpoint key, and `audit verify` through each says the log is intact;
/// a controller set up with another key refuses to start, naming the
/// setting, rather than signing checkpoints the others would call forged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_checkpoint_key_per_store_and_verify_passes_through_every_controller() {
    let Some(store) = postgres_store("keys").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client();
    let first = controller_on(dir.path(), 0, &store);
    let (s, _) = api(
        &c,
        &first,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "m" })),
    )
    .await;
    assert_eq!(s, 201);
    // Wait (bounded) for the first checkpoint.
    let started = Instant::now();
    loop {
        let (_, v) = api(&c, &first, "GET", "/api/v1/audit/verify", None).await;
        if v["anchors"]["checkpoints"].as_u64() >= Some(1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no checkpoint: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A controller with its own key (the per-directory default).
    let cfg = write(dir.path(), "other.toml", HA_CONTROLLER_TOML);
    let data = dir.path().join("other");
    let mut other = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args([
            "controller",
            "--store",
            &store,
            "--data",
            &data.to_string_lossy(),
            "--config",
            &cfg,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = other.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = other.kill();
            let _ = other.wait();
            panic!("a controller with another checkpoint key kept running");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut other.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert!(!status.success(), "{err}");
    assert!(err.contains("checkpoint_key_file"), "{err}");
    // A second controller with the shared key: both verify the whole log.
    let second = controller_on(dir.path(), 1, &store);
    let (s, _) = api(
        &c,
        &second,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "n" })),
    )
    .await;
    assert_eq!(s, 201);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for ctl in [&first, &second] {
        let (s, v) = api(&c, ctl, "GET", "/api/v1/audit/verify", None).await;
        assert_eq!(s, 200, "{v}");
        assert!(v["chain"]["first_break"].is_null(), "{v}");
        assert_eq!(v["anchors"]["problems"], json!([]), "{v}");
        assert!(v["anchors"]["checkpoints"].as_u64() >= Some(1), "{v}");
    }
}

/// Twenty cuts of the leading controller's link to PostgreSQL (frozen, at
/// random points of its work: a rollout is being evaluated every 200 ms),
/// alternating between two controllers: each time the other leads within
/// lease_ttl + lease_ttl/3 + 2 s, the cut-off one says at once that it is
/// not leading, and when the link heals it stands by. The rollout keeps
/// its state (its long SHADOW takes no decision during the cuts: decisions
/// across a take-over are the other tests'), nothing is recorded twice,
/// and the audit log verifies through both controllers. (Users' requests
/// through cuts and a crash: the other tests here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_cuts_of_the_leaders_link_each_replaced_in_time_and_recorded_once() {
    let Some(store) = postgres_store("cuts").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let c = client();
    let links = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    let mut ctls = Vec::new();
    for (n, frozen) in links.iter().enumerate() {
        ctls.push(controller_with(
            dir.path(),
            n,
            &freezable(&store, frozen).await,
            "lease_ttl = \"2s\"\n",
        ));
    }
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctls[0], &champion, &candidate).await;
    // No traffic: the rollout is evaluated, and its transitions written,
    // every 200 ms anyway (and the test shares two cores with others).
    let mut p = plan();
    p["min_stage_duration"] = json!("10m");
    p["evidence_timeout"] = json!("20m");
    let id = start_rollout_with(&c, &ctls[0], &cand, p).await;
    let both = [&ctls[0], &ctls[1]];
    let lead = leader_of(&c, &both, Duration::from_secs(15)).await;
    // A long SHADOW: evaluated (and written) every 200 ms throughout.
    wait_for(&c, both[lead], id, Duration::from_secs(60), |r| {
        phase(r) == "shadow"
    })
    .await;
    let bound = Duration::from_millis(2_000 + 667 + 2_000);
    let mut seed = 0x2545_f491_4f6c_dd1du64 ^ u64::from(std::process::id());
    let mut takeovers = Vec::new();
    for cut in 0..20 {
        let lead = leader_of(&c, &both, Duration::from_secs(15)).await;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(seed % 1_500)).await;
        links[lead].store(true, Ordering::SeqCst);
        let at = Instant::now();
        let other = both[1 - lead];
        while !leads(&c, other).await {
            assert!(
                at.elapsed() < bound,
                "cut {cut}: no take-over within {bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        takeovers.push(at.elapsed());
        let asked = Instant::now();
        let (s, v) = api(&c, both[lead], "GET", "/api/v1/leader", None).await;
        assert!(
            s == 200 && asked.elapsed() < Duration::from_millis(1_500),
            "cut {cut}: the cut-off controller answered {s} after {:?}",
            asked.elapsed()
        );
        assert_eq!(v["this"]["leading"], false, "cut {cut}: both lead: {v}");
        links[lead].store(false, Ordering::SeqCst);
        let healed = Instant::now();
        loop {
            let (_, v) = api(&c, both[lead], "GET", "/api/v1/leader", None).await;
            if v["this"]["standing"] == "standing by" {
                break;
            }
            assert!(healed.elapsed() < Duration::from_secs(30), "cut {cut}: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    takeovers.sort();
    eprintln!(
        "take-over after a frozen link (20 cuts of real controllers, lease_ttl 2 s): min {:?}, median {:?}, max {:?}",
        takeovers[0], takeovers[10], takeovers[19]
    );
    // The rollout went on: still in its long SHADOW, each decision once.
    let lead = leader_of(&c, &both, Duration::from_secs(15)).await;
    let (_, r) = api(
        &c,
        both[lead],
        "GET",
        &format!("/api/v1/rollouts/{id}"),
        None,
    )
    .await;
    assert_eq!(phase(&r), "shadow", "{}", r["state"]["phase"]);
    let (_, records) = api(
        &c,
        both[lead],
        "GET",
        &format!("/api/v1/audit?rollout={id}"),
        None,
    )
    .await;
    let decisions: Vec<String> = records
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["kind"] != "evaluated")
        .map(|r| format!("{} {}", r["kind"], r["body"]["to"]))
        .collect();
    let mut once = decisions.clone();
    once.sort();
    once.dedup();
    assert_eq!(
        once.len(),
        decisions.len(),
        "a decision recorded twice: {decisions:?}"
    );
    for ctl in both {
        let (s, v) = api(&c, ctl, "GET", "/api/v1/audit/verify", None).await;
        assert_eq!(s, 200, "{v}");
        assert!(v["chain"]["first_break"].is_null(), "{v}");
        assert_eq!(v["anchors"]["problems"], json!([]), "{v}");
    }
}
