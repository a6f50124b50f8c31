//! What the end-to-end tests share: real `rollgate` processes, small
//! model servers, the admin API client, bounded waits.
#![allow(dead_code)] // each test crate uses its own part of these

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    pub child: Child,
    /// Every `http://` or `https://` address on the first line the process
    /// printed (without the scheme).
    pub addrs: Vec<String>,
}

impl Proc {
    pub fn addr(&self) -> &str {
        &self.addrs[0]
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `rollgate ARGS` and waits (bounded) for the `http(s)://ADDR` it prints.
pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Proc {
    spawn_in(None, args, env)
}

/// Like [`spawn`], inside network namespace `netns` if given (`ip netns
/// exec` execs the binary: the child's pid is rollgate's own).
pub fn spawn_in(netns: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Proc {
    spawn_full(netns, args, env, Stdio::null())
}

/// Like [`spawn`], its log lines (stderr) written to the file `log`.
pub fn spawn_logged(args: &[&str], env: &[(&str, &str)], log: &Path) -> Proc {
    let file = std::fs::File::create(log).expect("log file");
    spawn_full(None, args, env, Stdio::from(file))
}

fn spawn_full(netns: Option<&str>, args: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Proc {
    let bin = env!("CARGO_BIN_EXE_rollgate");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin]);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn rollgate");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {} // keep draining so the child never blocks on stdout
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("rollgate printed its address");
    let addrs: Vec<String> = line
        .split_whitespace()
        .filter_map(|w| {
            w.strip_prefix("http://")
                .or_else(|| w.strip_prefix("https://"))
        })
        .map(str::to_string)
        .collect();
    assert!(!addrs.is_empty(), "no address in {line:?}");
    Proc { child, addrs }
}

pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write file");
    p.to_string_lossy().into_owned()
}

pub const CONTROLLER_TOML: &str = r#"
[api]
listen = "127.0.0.1:0"
[controller]
tick = "200ms"
gateway_ttl = "3s"
# A restarted controller takes over from the one it replaces within ~3 s.
lease_ttl = "2s"
"#;

pub fn start_controller(dir: &Path, env: &[(&str, &str)]) -> Proc {
    let cfg = write(dir, "controller.toml", CONTROLLER_TOML);
    start_controller_with(dir, &cfg, env)
}

/// A controller whose config declares `data_plane` (the JSON a spec held
/// before data planes had names) as `[data_planes.NAME]`.
pub fn start_controller_declaring(dir: &Path, name: &str, data_plane: &serde_json::Value) -> Proc {
    let cfg = write(
        dir,
        "controller.toml",
        &format!(
            "{CONTROLLER_TOML}{}",
            toml_table(&format!("data_planes.{name}"), data_plane)
        ),
    );
    start_controller_with(dir, &cfg, &[])
}

/// A JSON object as the TOML table `name` (dotted: `data_planes.edge`),
/// nested objects and arrays of objects included.
pub fn toml_table(name: &str, object: &serde_json::Value) -> String {
    let mut root = object.clone();
    for key in name.rsplit('.') {
        root = serde_json::json!({ key: root });
    }
    toml::to_string(&root).expect("a TOML document")
}

/// A controller on `dir`'s data directory with the config file `cfg`.
pub fn start_controller_with(dir: &Path, cfg: &str, env: &[(&str, &str)]) -> Proc {
    let data = dir.join("data");
    spawn(
        &[
            "controller",
            "--data",
            &data.to_string_lossy(),
            "--config",
            cfg,
        ],
        env,
    )
}

pub fn start_gateway(dir: &Path) -> Proc {
    start_gateway_on(dir, "127.0.0.1:0")
}

/// (On one thread: the end-to-end tests run the gateway's current-thread
/// runtime; `rollgate up` and the demo run the multi-thread one.)
pub fn start_gateway_on(dir: &Path, listen: &str) -> Proc {
    let data = dir.join("data");
    spawn(
        &[
            "gateway",
            "--data",
            &data.to_string_lossy(),
            "--listen",
            listen,
            "--threads",
            "1",
        ],
        &[],
    )
}

/// A loopback address with a port free right now (for a gateway that must
/// come back on the same address after a kill).
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

/// Requests of `revision` in the rollout's ledger: every series, every
/// epoch, archived series too.
pub fn ledger_requests(r: &Value, revision: &str) -> u64 {
    let ledger = &r["state"]["evidence"];
    let of = |snap: &Value| {
        snap["revisions"][revision]["requests"]
            .as_u64()
            .unwrap_or(0)
    };
    let series: u64 = ledger["series"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .flat_map(|s| s["epochs"].as_object().into_iter().flat_map(|e| e.values()))
        .map(of)
        .sum();
    let archived: u64 = ledger["archived"]
        .as_object()
        .into_iter()
        .flat_map(|e| e.values())
        .map(of)
        .sum();
    series + archived
}

pub fn ledger_series(r: &Value) -> usize {
    r["state"]["evidence"]["series"]
        .as_object()
        .map_or(0, |m| m.len())
}

/// How a test model server behaves.
#[derive(Clone)]
pub struct Model {
    /// POSTs answer 503 while set.
    pub failing: Arc<AtomicBool>,
    pub predictions: Arc<AtomicU64>,
    /// Every this many POSTs (0: none) one hangs for 3 s: past the
    /// revision's 1 s timeout in the tests that use it.
    pub hang_every: u64,
    /// Every inference request received, whatever it was answered.
    pub posts: Arc<AtomicU64>,
    /// POSTs answer 404 (the model served under another name).
    pub not_found: bool,
    /// Every this many POSTs (0: none) one answers 503.
    pub fail_every: u64,
    /// Every this many POSTs (0: none) one predicts class 0 instead of 1.
    pub class_0_every: u64,
    /// Answers the request `{"instances": [[truth, u]]}`: predicts the
    /// class `truth` unless `lo <= u < hi`, then the other one; a test
    /// knows both arms' answers and the truth of every request it sends.
    pub wrong_on: Option<(f64, f64)>,
}

impl Model {
    pub fn new(failing: bool) -> Model {
        Model {
            failing: Arc::new(AtomicBool::new(failing)),
            predictions: Arc::new(AtomicU64::new(0)),
            hang_every: 0,
            posts: Arc::new(AtomicU64::new(0)),
            not_found: false,
            fail_every: 0,
            class_0_every: 0,
            wrong_on: None,
        }
    }

    /// A model wrong exactly when the request's `u` is in `[lo, hi)`.
    pub fn wrong_on(lo: f64, hi: f64) -> Model {
        Model {
            wrong_on: Some((lo, hi)),
            ..Model::new(false)
        }
    }

    /// One POST in `n` answers 503 (`n = 2`: half of them).
    pub fn failing_one_in(n: u64) -> Model {
        Model {
            fail_every: n,
            ..Model::new(false)
        }
    }

    pub fn hanging_one_in(n: u64) -> Model {
        Model {
            hang_every: n,
            ..Model::new(false)
        }
    }
}

/// A KServe-V1-speaking model server: readiness always passes.
pub async fn model_server(model: Model) -> String {
    model_server_on(model, "127.0.0.1").await
}

/// A model server on address `ip` (a test network's host side).
pub async fn model_server_on(model: Model, ip: &str) -> String {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let model = model.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let model = model.clone();
                    async move {
                        let post = req.method() == hyper::Method::POST;
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let class = model
                            .wrong_on
                            .and_then(|band| answer(band, body.as_ref().ok()?));
                        let n = if post {
                            model.posts.fetch_add(1, Ordering::SeqCst)
                        } else {
                            0
                        };
                        if post
                            && model.hang_every > 0
                            && n % model.hang_every == model.hang_every - 1
                        {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        let (status, body) = if !post {
                            (200, r#"{"name":"m","ready":true}"#)
                        } else if model.not_found {
                            (404, r#"{"error":"model not found"}"#)
                        } else if model.failing.load(Ordering::SeqCst)
                            || (model.fail_every > 0 && n % model.fail_every == 0)
                        {
                            (503, r#"{"error":"unavailable"}"#)
                        } else if let Some(class) = class {
                            model.predictions.fetch_add(1, Ordering::SeqCst);
                            (
                                200,
                                [
                                    r#"{"predictions":[[0.9,0.1]]}"#,
                                    r#"{"predictions":[[0.1,0.9]]}"#,
                                ][class],
                            )
                        } else if model.class_0_every > 0 && n % model.class_0_every == 0 {
                            model.predictions.fetch_add(1, Ordering::SeqCst);
                            (200, r#"{"predictions":[[0.9,0.1]]}"#)
                        } else {
                            model.predictions.fetch_add(1, Ordering::SeqCst);
                            (200, r#"{"predictions":[[0.1,0.9]]}"#)
                        };
                        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        *r.status_mut() = StatusCode::from_u16(status).expect("status");
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// The class a [`Model::wrong_on`] model predicts for `body`, if it reads
/// as `{"instances": [[truth, u]]}`.
fn answer((lo, hi): (f64, f64), body: &Bytes) -> Option<usize> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let row = v.get("instances")?.get(0)?;
    let truth = usize::from(row.get(0)?.as_f64()? >= 0.5);
    let u = row.get(1)?.as_f64()?;
    Some(if (lo..hi).contains(&u) {
        1 - truth
    } else {
        truth
    })
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn request(
    c: &HttpClient,
    method: &str,
    url: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (u16, Value, Option<String>) {
    let mut b = Request::builder().method(method).uri(url);
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = b
        .body(Full::new(Bytes::from(
            body.map(|v| v.to_string()).unwrap_or_default(),
        )))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("answered within 10 s")
        .expect("http");
    let status = resp.status().as_u16();
    let revision = resp
        .headers()
        .get("x-rollgate-revision")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        revision,
    )
}

pub async fn api(
    c: &HttpClient,
    ctl: &Proc,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let (s, v, _) = request(
        c,
        method,
        &format!("http://{}{path}", ctl.addr()),
        body,
        None,
    )
    .await;
    (s, v)
}

/// A short plan: stages of 1 s, a 10 s evidence deadline, small floors and
/// a 5% error margin, so that stages decide within seconds even when the
/// machine is busy with other tests.
pub fn plan() -> Value {
    json!({
        "steps": [20, 50],
        "min_stage_duration": "1s",
        "evidence_timeout": "10s",
        "readiness_timeout": "5s",
        "gates": {
            "error_rate": { "min_requests": 20, "margin": 0.05 },
            "latency": { "min_requests": 20 },
            "shadow": { "min_pairs": 30 }
        }
    })
}

/// Registers model `m` with a champion and a candidate; returns their ids.
pub async fn setup(
    c: &HttpClient,
    ctl: &Proc,
    champion_url: &str,
    candidate_url: &str,
) -> (String, String) {
    let (s, _) = api(
        c,
        ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "m" })),
    )
    .await;
    assert_eq!(s, 201);
    let (s, champ) = api(
        c,
        ctl,
        "POST",
        "/api/v1/models/m/revisions",
        Some(json!({ "upstream": champion_url })),
    )
    .await;
    assert_eq!(s, 201);
    let (_, cand) = api(
        c,
        ctl,
        "POST",
        "/api/v1/models/m/revisions",
        Some(json!({ "upstream": candidate_url })),
    )
    .await;
    let (champ, cand) = (
        champ["id"].as_str().expect("id").to_string(),
        cand["id"].as_str().expect("id").to_string(),
    );
    let (s, _) = api(
        c,
        ctl,
        "PUT",
        "/api/v1/models/m/champion",
        Some(json!({ "revision": champ, "reason": "first" })),
    )
    .await;
    assert_eq!(s, 200);
    (champ, cand)
}

pub async fn start_rollout(c: &HttpClient, ctl: &Proc, cand: &str) -> i64 {
    start_rollout_with(c, ctl, cand, plan()).await
}

/// Starts a rollout of `cand` on model `m` under `plan`; returns its id.
pub async fn start_rollout_with(c: &HttpClient, ctl: &Proc, cand: &str, plan: Value) -> i64 {
    start_rollout_with_on(c, ctl, "m", cand, plan).await
}

/// A rollout of `cand` on `model` with `plan`; its id.
pub async fn start_rollout_with_on(
    c: &HttpClient,
    ctl: &Proc,
    model: &str,
    cand: &str,
    plan: Value,
) -> i64 {
    let (s, r) = api(
        c,
        ctl,
        "POST",
        "/api/v1/rollouts",
        Some(json!({ "model": model, "revision": cand, "plan": plan })),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    r["id"].as_i64().expect("rollout id")
}

/// Sends traffic with sticky keys until `stop` is set (bounded by 120 s);
/// how many requests it sent.
pub fn traffic(gateway: &str, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let by = traffic_by_revision(gateway, stop);
    tokio::spawn(async move { by.await.map(|m| m.into_values().sum()).unwrap_or(0) })
}

/// Sends traffic with sticky keys until `stop` is set (bounded by 120 s),
/// counting requests by the revision that answered them (`none`: no
/// answer, or no revision header).
pub fn traffic_by_revision(
    gateway: &str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    traffic_of(gateway, br#"{"instances":[[1,2]]}"#, stop)
}

/// Sends `body` to model `m` with sticky keys until `stop` is set (bounded
/// by 120 s); how many requests each revision answered (`none`: no answer).
pub fn traffic_of(
    gateway: &str,
    body: &'static [u8],
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    traffic_by(gateway, body, "x-rollgate-revision", stop)
}

/// Sends `body` to model `m` through the proxy at `addr` with sticky keys
/// until `stop` is set (bounded by 120 s); how many requests got each value
/// of the answer's header `by` (`none`: no answer, or no such header).
pub fn traffic_by(
    addr: &str,
    body: &'static [u8],
    by_header: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    traffic_with(addr, move |_| Bytes::from_static(body), by_header, stop)
}

/// [`traffic_by`] with request `n`'s body `body(n)`.
pub fn traffic_with(
    addr: &str,
    body: impl Fn(u64) -> Bytes + Send + 'static,
    by_header: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    traffic_to(
        format!("http://{addr}/v1/models/m:predict"),
        body,
        by_header,
        stop,
    )
}

/// [`traffic_with`] to `url` (`by_header` `":status"`: by status code).
pub fn traffic_to(
    url: String,
    body: impl Fn(u64) -> Bytes + Send + 'static,
    by_header: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    traffic_over_keys(url, body, by_header, 5000, stop)
}

/// [`traffic_to`] from `keys` distinct sticky keys, in turn.
pub fn traffic_over_keys(
    url: String,
    body: impl Fn(u64) -> Bytes + Send + 'static,
    by_header: &'static str,
    keys: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    let keys = keys.max(1);
    tokio::spawn(async move {
        let c = client();
        let started = Instant::now();
        let mut by = std::collections::BTreeMap::new();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
            let req = Request::builder()
                .method("POST")
                .uri(&url)
                .header("content-type", "application/json")
                .header("x-rollgate-key", format!("user-{}", n % keys))
                .body(Full::new(body(n)))
                .expect("request");
            let answer = tokio::time::timeout(Duration::from_secs(5), c.request(req)).await;
            let rev = match answer {
                Ok(Ok(r)) if by_header == ":status" => {
                    let status = r.status().as_u16().to_string();
                    let _ = r.into_body().collect().await;
                    status
                }
                Ok(Ok(r)) => {
                    let rev = r
                        .headers()
                        .get(by_header)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("none")
                        .to_string();
                    let _ = r.into_body().collect().await;
                    rev
                }
                _ => "none".to_string(),
            };
            *by.entry(rev).or_insert(0) += 1;
            n += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        by
    })
}

/// One prediction of `body` through the gateway (under request id `id`,
/// if given): its status and the revision that answered.
pub async fn predict_answered_by(
    c: &HttpClient,
    gateway: &str,
    id: Option<&str>,
    body: String,
) -> (u16, String) {
    let mut req = Request::builder()
        .method("POST")
        .uri(format!("http://{gateway}/v1/models/m:predict"))
        .header("content-type", "application/json");
    if let Some(id) = id {
        req = req.header("x-request-id", id);
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("answered within 10 s")
        .expect("http");
    let who = resp
        .headers()
        .get("x-rollgate-revision")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    (status, who)
}

/// Registers a revision of model `m` served at `url`; its id.
pub async fn register(c: &HttpClient, ctl: &Proc, url: &str) -> String {
    let (s, r) = api(
        c,
        ctl,
        "POST",
        "/api/v1/models/m/revisions",
        Some(json!({ "upstream": url })),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    r["id"].as_str().expect("id").to_string()
}

/// Polls the rollout until `done` holds; panics after `limit`.
pub async fn wait_for(
    c: &HttpClient,
    ctl: &Proc,
    id: i64,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let (s, r) = api(c, ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
        if s == 200 && done(&r) {
            return r;
        }
        assert!(
            started.elapsed() < limit,
            "rollout {id} did not get there in {limit:?}: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn phase(r: &Value) -> &str {
    r["state"]["phase"]["phase"].as_str().unwrap_or("")
}

pub fn finished(r: &Value) -> bool {
    matches!(phase(r), "promoted" | "rolled_back" | "aborted")
}

pub async fn audit_kinds(c: &HttpClient, ctl: &Proc, id: i64) -> Vec<String> {
    let (_, a) = api(c, ctl, "GET", &format!("/api/v1/audit?rollout={id}"), None).await;
    a.as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["kind"].as_str().map(str::to_string))
        .collect()
}

/// How many audit records of `kind`.
pub fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

pub async fn chain_intact(c: &HttpClient, ctl: &Proc) -> bool {
    let (s, v) = api(c, ctl, "GET", "/api/v1/audit/verify", None).await;
    s == 200 && v["first_break"].is_null() && v["records"].as_u64().unwrap_or(0) > 0
}

/// Runs the CLI as a user would, against the admin API at `api`.
pub fn cli(api: &str, args: &[&str]) -> (i32, String, String) {
    cli_as(api, None, args)
}

/// The CLI with `token` in `ROLLGATE_TOKEN` (none: unset).
pub fn cli_as(api: &str, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"));
    cmd.args(args)
        .env("ROLLGATE_API", format!("http://{api}"))
        .env_remove("ROLLGATE_TOKEN");
    if let Some(t) = token {
        cmd.env("ROLLGATE_TOKEN", t);
    }
    let out = cmd.output().expect("run the CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
