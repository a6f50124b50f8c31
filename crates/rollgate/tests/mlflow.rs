//! MLflow's model registry in and out, against a real MLflow tracking
//! server (`tests/mlflow/start.sh`: pinned, on loopback, SQLite): a new
//! `@challenger` starts a rollout by itself, the verdict moves `@champion`
//! and tags the version, a registry outage and a controller restart lose
//! and repeat no write-back, an alias moved by hand mid-rollout is reported.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;
use crate::prometheus::{ROW, serve, trained_model};

/// A running MLflow server, stopped (its whole process group) on drop.
struct Mlflow {
    url: String,
    pid: String,
    port: String,
    dir: String,
}

impl Mlflow {
    /// Starts one (on `again`'s port and store, if given); `None` locally
    /// (with a note) where it cannot start; in CI that is a failure.
    fn start(again: Option<&Mlflow>) -> Option<Mlflow> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mlflow/start.sh");
        let mut cmd = Command::new("bash");
        cmd.arg(script);
        if let Some(m) = again {
            cmd.env("ROLLGATE_MLFLOW_PORT", &m.port)
                .env("ROLLGATE_MLFLOW_DIR", &m.dir);
        }
        let out = cmd.output().expect("run tests/mlflow/start.sh");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).into_owned();
            if std::env::var_os("CI").is_none() {
                eprintln!("skipped: MLflow did not start (tests/mlflow/start.sh): {why}");
                return None;
            }
            panic!("CI needs MLflow (tests/mlflow/start.sh, run by .ci/run): {why}");
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let var = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .unwrap_or_else(|| panic!("{name} in {text}"))
                .to_string()
        };
        let url = var("ROLLGATE_MLFLOW_URL");
        let port = url.rsplit(':').next().expect("port").to_string();
        Some(Mlflow {
            pid: var("ROLLGATE_MLFLOW_PID"),
            dir: var("ROLLGATE_MLFLOW_DIR"),
            url,
            port,
        })
    }

    fn stop(&self) {
        let _ = Command::new("kill")
            .args(["--", &format!("-{}", self.pid)])
            .status();
        // Bounded: its port refuses within a few seconds.
        let started = Instant::now();
        while std::net::TcpStream::connect(format!("127.0.0.1:{}", self.port)).is_ok() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "MLflow did not stop"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    async fn call(&self, c: &HttpClient, method: &str, path: &str, body: Value) -> Value {
        let (s, v, _) = request(
            c,
            method,
            &format!("{}/api/2.0/mlflow/{path}", self.url),
            Some(body),
            None,
        )
        .await;
        assert_eq!(s, 200, "{method} {path}: {v}");
        v
    }

    async fn get(&self, c: &HttpClient, path: &str) -> Value {
        let (s, v, _) = request(
            c,
            "GET",
            &format!("{}/api/2.0/mlflow/{path}", self.url),
            None,
            None,
        )
        .await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    /// Registers a version of `fraud` served at `upstream` (its tag).
    async fn version(&self, c: &HttpClient, upstream: &str) -> String {
        let v = self
            .call(
                c,
                "POST",
                "model-versions/create",
                json!({ "name": "fraud", "source": "s3://models/fraud",
                        "tags": [{ "key": "rollgate.upstream", "value": upstream }] }),
            )
            .await;
        v["model_version"]["version"]
            .as_str()
            .expect("version")
            .to_string()
    }

    async fn set_alias(&self, c: &HttpClient, alias: &str, version: &str) {
        self.call(
            c,
            "POST",
            "registered-models/alias",
            json!({ "name": "fraud", "alias": alias, "version": version }),
        )
        .await;
    }

    /// `fraud`'s aliases: alias -> version.
    async fn aliases(&self, c: &HttpClient) -> std::collections::BTreeMap<String, String> {
        let m = self.get(c, "registered-models/get?name=fraud").await;
        pairs(&m["registered_model"]["aliases"], "alias", "version")
    }

    /// Version `v`'s tags.
    async fn tags(&self, c: &HttpClient, v: &str) -> std::collections::BTreeMap<String, String> {
        let m = self
            .get(c, &format!("model-versions/get?name=fraud&version={v}"))
            .await;
        pairs(&m["model_version"]["tags"], "key", "value")
    }
}

/// A JSON list of objects as `k -> v` (MLflow's aliases and tags).
fn pairs(list: &Value, k: &str, v: &str) -> std::collections::BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| Some((o[k].as_str()?.to_string(), o[v].as_str()?.to_string())))
        .collect()
}

impl Drop for Mlflow {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["--", &format!("-{}", self.pid)])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn controller_config(dir: &std::path::Path, mlflow: &str) -> String {
    write(
        dir,
        "controller.toml",
        &format!(
            "{CONTROLLER_TOML}\n[registries.mlflow]\nurl = \"{mlflow}\"\npoll = \"1s\"\ntimeout = \"10s\"\ntag_upstream_hosts = [\"127.0.0.1\"]\n"
        ),
    )
}

/// The short plan, its promotion held for an operator's approval: the
/// test says when a verdict may come (after MLflow is stopped, after a
/// version is deleted), whatever the machine's speed.
fn held_plan() -> Value {
    let mut p = plan();
    p["approvals"] = json!([{ "before": "promotion" }]);
    p
}

/// Whether the rollout waits for an approval (or has ended).
fn awaiting(r: &Value) -> bool {
    !r["state"]["awaiting"].is_null() || finished(r)
}

/// Approves the promotion rollout `id` waits for (once it waits).
async fn approve(c: &HttpClient, ctl: &Proc, id: i64) {
    let r = wait_for(c, ctl, id, Duration::from_secs(60), awaiting).await;
    assert!(!finished(&r), "{r}");
    let (s, r) = api(
        c,
        ctl,
        "POST",
        &format!("/api/v1/rollouts/{id}/approve"),
        Some(json!({ "reason": "the test's MLflow is where it should be" })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
}

/// The rollout the follower starts next (newer than `after`): its id.
async fn started_after(c: &HttpClient, ctl: &Proc, after: Option<i64>) -> i64 {
    until(
        Duration::from_secs(30),
        "a rollout started by the follower",
        || async {
            rollouts(c, ctl)
                .await
                .first()
                .and_then(|r| r["id"].as_i64())
                .filter(|&n| after.is_none_or(|a| n > a))
        },
    )
    .await
}

/// Model `m`'s rollouts, newest first.
async fn rollouts(c: &HttpClient, ctl: &Proc) -> Vec<Value> {
    let (s, v) = api(c, ctl, "GET", "/api/v1/rollouts?model=m", None).await;
    assert_eq!(s, 200, "{v}");
    v.as_array().cloned().unwrap_or_default()
}

/// Audit records of `kind` (all of them), oldest first.
async fn audit_of(c: &HttpClient, ctl: &Proc, kind: &str) -> Vec<Value> {
    let (s, v) = api(c, ctl, "GET", "/api/v1/audit?model=m&limit=1000", None).await;
    assert_eq!(s, 200, "{v}");
    v.as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == kind)
        .cloned()
        .collect()
}

/// Waits (bounded by `limit`) until `f` returns `Some`.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// v1 `@champion` seeds the model; v2 `@challenger` is rolled out by
/// itself and promoted, `@champion` moved by hand meanwhile is reported
/// and not followed; MLflow stopped and the controller restarted before
/// the verdict is written back: written once MLflow returns, once; a
/// ready-then-503 v3 is rolled back, tagged, `@challenger` removed, and
/// never rolled out again when set again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenger_alias_is_rolled_out_and_the_verdict_moves_the_champion_alias() {
    let Some(mut mlflow) = Mlflow::start(None) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let model = trained_model(d);
    let v1_server = serve(&model, &[]);
    let v2_server = serve(&model, &[]);
    let v3_server = serve(&model, &["--ready-then-503"]);
    let url = |p: &Proc| format!("http://{}", p.addr());
    let cfg = controller_config(d, &mlflow.url);
    let mut ctl = start_controller_with(d, &cfg, &[]);
    let gw = start_gateway(d);
    let c = client();

    // Only the follower marks a revision as a registry version (a verdict
    // is written back to it with the registry's token).
    let (s, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models/other/revisions",
        Some(json!({ "upstream": url(&v1_server), "registry_version": {
            "registry": "mlflow", "model": "fraud", "version": "1" } })),
    )
    .await;
    assert_eq!(s, 422, "{r}");
    assert!(r.to_string().contains("registry_version"), "{r}");
    // A registry the controller's config does not declare is refused.
    let (s, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "other", "spec": { "registry": { "name": "elsewhere" } } })),
    )
    .await;
    assert_eq!(s, 422, "{r}");
    assert!(r.to_string().contains("[registries.elsewhere]"), "{r}");

    mlflow
        .call(
            &c,
            "POST",
            "registered-models/create",
            json!({ "name": "fraud" }),
        )
        .await;
    let v1 = mlflow.version(&c, &url(&v1_server)).await;
    mlflow.set_alias(&c, "champion", &v1).await;
    // The model, as a user adds it: `rollgate model add m --registry FILE`.
    let source = write(
        d,
        "registry.json",
        &json!({ "name": "mlflow", "registered_model": "fraud", "plan": held_plan() }).to_string(),
    );
    let added = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["model", "add", "m", "--registry", &source])
        .env("ROLLGATE_API", format!("http://{}", ctl.addr()))
        .env_remove("ROLLGATE_TOKEN")
        .output()
        .expect("model add");
    assert!(added.status.success(), "{added:?}");

    // Seeded: v1 is rollgate's champion, said so in the audit log.
    let seeded = until(Duration::from_secs(30), "the champion seeded", || async {
        audit_of(&c, &ctl, "champion_set").await.into_iter().next()
    })
    .await;
    assert_eq!(seeded["actor"], "registry:mlflow", "{seeded}");
    assert!(
        seeded.to_string().contains("@champion is version 1"),
        "{seeded}"
    );
    let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    let champion_rev = m["champion"].as_str().expect("a champion").to_string();
    let (_, rev) = api(
        &c,
        &ctl,
        "GET",
        &format!("/api/v1/revisions/{champion_rev}"),
        None,
    )
    .await;
    assert_eq!(rev["spec"]["registry_version"]["version"], "1", "{rev}");
    assert_eq!(rev["spec"]["artifact"], "s3://models/fraud", "{rev}");

    let stop = Arc::new(AtomicBool::new(false));
    let load = crate::common::traffic_of(gw.addr(), ROW, Arc::clone(&stop));

    // v2 as @challenger: a rollout starts by itself.
    let v2 = mlflow.version(&c, &url(&v2_server)).await;
    let set_at = Instant::now();
    mlflow.set_alias(&c, "challenger", &v2).await;
    let id = started_after(&c, &ctl, None).await;
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        phase(r) != "pending"
    })
    .await;
    eprintln!(
        "@challenger set -> the rollout's first stage: {} ms (poll 1 s)",
        set_at.elapsed().as_millis()
    );

    // @champion moved by hand mid-rollout: reported, not followed.
    mlflow.set_alias(&c, "champion", &v2).await;
    let conflict = until(Duration::from_secs(20), "a registry conflict", || async {
        audit_of(&c, &ctl, "registry_conflict")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(conflict["rollout"], id, "{conflict}");
    assert_eq!(conflict["body"]["expected"], "1", "{conflict}");
    assert_eq!(conflict["body"]["found"], "2", "{conflict}");
    mlflow.set_alias(&c, "champion", &v1).await;

    // MLflow stops before the verdict: the rollout goes on without it.
    mlflow.stop();
    approve(&c, &ctl, id).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    // The controller restarts while MLflow is away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ctl.kill();
    ctl = start_controller_with(d, &cfg, &[]);
    assert!(
        audit_of(&c, &ctl, "registry_written").await.is_empty(),
        "nothing written while MLflow was away"
    );
    mlflow = Mlflow::start(Some(&mlflow)).expect("MLflow again");
    let written = until(
        Duration::from_secs(60),
        "the promotion written back",
        || async {
            let w = audit_of(&c, &ctl, "registry_written").await;
            (!w.is_empty()).then_some(w)
        },
    )
    .await;
    assert_eq!(written[0]["rollout"], id, "{written:?}");
    let aliases = mlflow.aliases(&c).await;
    assert_eq!(aliases.get("champion"), Some(&v2), "{aliases:?}");
    assert_eq!(aliases.get("challenger"), None, "{aliases:?}");
    // The conflict and the write-back, where operators read a rollout:
    // its timeline (the dashboard's list) and `rollout status`.
    let (_, tl) = api(
        &c,
        &ctl,
        "GET",
        &format!("/api/v1/rollouts/{id}/timeline"),
        None,
    )
    .await;
    let said: Vec<&str> = tl["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "registry_conflict")
        .filter_map(|e| e["summary"].as_str())
        .collect();
    assert!(
        said.iter().any(|s| s.contains("@champion was moved")),
        "{tl}"
    );
    let status = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["rollout", "status", &id.to_string()])
        .env("ROLLGATE_API", format!("http://{}", ctl.addr()))
        .env_remove("ROLLGATE_TOKEN")
        .output()
        .expect("rollout status");
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(out.contains("REGISTRY CONFLICT: "), "{out}");
    assert!(
        out.contains("REGISTRY: ")
            && out.contains("version 2 of fraud: ")
            && out.contains("tagged promoted"),
        "{out}"
    );
    let tags = mlflow.tags(&c, &v2).await;
    assert_eq!(tags["rollgate.verdict"], "promoted", "{tags:?}");
    assert_eq!(tags["rollgate.rollout"], id.to_string(), "{tags:?}");
    assert!(tags["rollgate.audit"].contains(':'), "{tags:?}");

    // v3, ready then 503 to every prediction: rolled back, @champion
    // stays on v2, v3 tagged with the verdict and its reason.
    let v3 = mlflow.version(&c, &url(&v3_server)).await;
    mlflow.set_alias(&c, "challenger", &v3).await;
    let id3 = started_after(&c, &ctl, Some(id)).await;
    let r = wait_for(&c, &ctl, id3, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    until(
        Duration::from_secs(30),
        "the rollback written back",
        || async {
            let tags = mlflow.tags(&c, &v3).await;
            tags.contains_key("rollgate.verdict").then_some(())
        },
    )
    .await;
    let tags = mlflow.tags(&c, &v3).await;
    assert_eq!(tags["rollgate.verdict"], "rolled_back", "{tags:?}");
    assert!(
        tags["rollgate.reason"].starts_with("ROLLED BACK: "),
        "{tags:?}"
    );
    let aliases = mlflow.aliases(&c).await;
    assert_eq!(aliases.get("champion"), Some(&v2), "{aliases:?}");
    assert_eq!(aliases.get("challenger"), None, "{aliases:?}");

    // v3 set as @challenger again: rollgate judged it, and does not roll
    // it out a second time.
    mlflow.set_alias(&c, "challenger", &v3).await;
    let seen = passes(&c, &ctl).await;
    until(Duration::from_secs(30), "two more passes", || async {
        (passes(&c, &ctl).await >= seen + 2).then_some(())
    })
    .await;
    assert_eq!(rollouts(&c, &ctl).await.len(), 2);

    // v4 deleted from MLflow while its rollout runs: its promotion cannot
    // be written back, which is recorded, and holds up nothing after it.
    let v4 = mlflow.version(&c, &url(&v2_server)).await;
    mlflow.set_alias(&c, "challenger", &v4).await;
    let id4 = started_after(&c, &ctl, Some(id3)).await;
    wait_for(&c, &ctl, id4, Duration::from_secs(60), awaiting).await;
    mlflow
        .call(
            &c,
            "DELETE",
            "model-versions/delete",
            json!({ "name": "fraud", "version": v4 }),
        )
        .await;
    approve(&c, &ctl, id4).await;
    let r = wait_for(&c, &ctl, id4, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    let refused = until(
        Duration::from_secs(30),
        "the refused write-back said",
        || async {
            audit_of(&c, &ctl, "registry_conflict")
                .await
                .into_iter()
                .find(|n| n["rollout"] == id4)
        },
    )
    .await;
    assert!(
        refused["body"]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("was not written back")),
        "{refused}"
    );
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;

    // Each end written back once, across the outage and the restart.
    let written = audit_of(&c, &ctl, "registry_written").await;
    let ids: Vec<i64> = written
        .iter()
        .filter_map(|w| w["rollout"].as_i64())
        .collect();
    assert_eq!(ids, vec![id, id3], "{written:?}");

    // An operator sets v1 back as rollgate's champion by hand: @champion
    // follows it (one answer to "which version is serving?"), the refused
    // write-back before it notwithstanding.
    let (s, r) = api(
        &c,
        &ctl,
        "PUT",
        "/api/v1/models/m/champion",
        Some(json!({ "revision": champion_rev, "reason": "v2 misbehaves at night" })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    until(Duration::from_secs(30), "@champion back on v1", || async {
        (mlflow.aliases(&c).await.get("champion") == Some(&v1)).then_some(())
    })
    .await;
    assert!(chain_intact(&c, &ctl).await);
}

/// Passes over registry `mlflow` so far: ended and cut short (the
/// controller's metrics).
async fn passes(c: &HttpClient, ctl: &Proc) -> u64 {
    let url = format!("http://{}/metrics", ctl.addr());
    let req = hyper::Request::get(&url)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = c.request(req).await.expect("metrics");
    let text = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| {
            (l.starts_with("rollgate_registry_passes_total")
                || l.starts_with("rollgate_registry_failures_total"))
                && l.contains(r#"registry="mlflow""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A webhook delivery of `body` with `headers`: its status and answer.
async fn deliver(
    c: &HttpClient,
    hook: &str,
    body: &'static [u8],
    headers: Vec<(&'static str, String)>,
) -> (u16, Value) {
    let mut b = hyper::Request::post(hook).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(k, v);
    }
    let req = b
        .body(http_body_util::Full::new(bytes::Bytes::from_static(body)))
        .expect("request");
    let resp = c.request(req).await.expect("answered");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// With MLflow's webhook configured and a poll of a minute, an alias set
/// is acted on at once; deliveries that do not verify (a bad signature, a
/// signed but old timestamp, none) wake nothing and change nothing; a
/// delivery id taken twice wakes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlflows_webhook_makes_the_follower_fast_and_a_forged_one_changes_nothing() {
    let Some(mlflow) = Mlflow::start(None) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let secret = write(d, "webhook-secret", "s3cret\n");
    let cfg = write(
        d,
        "controller.toml",
        &format!(
            "{CONTROLLER_TOML}\n[registries.mlflow]\nurl = \"{}\"\npoll = \"60s\"\nwebhook_secret_file = \"{secret}\"\ntag_upstream_hosts = [\"127.0.0.1\"]\n",
            mlflow.url
        ),
    );
    let ctl = start_controller_with(d, &cfg, &[]);
    let c = client();
    let hook = format!("http://{}/api/v1/registries/mlflow/webhook", ctl.addr());
    // The first pass (as soon as the controller leads) finds nothing to
    // follow; the next is a minute away.
    until(Duration::from_secs(30), "the first pass", || async {
        (passes(&c, &ctl).await >= 1).then_some(())
    })
    .await;
    let (s, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "m", "spec": { "registry": {
            "name": "mlflow", "registered_model": "fraud", "plan": plan()
        }}})),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    mlflow
        .call(
            &c,
            "POST",
            "registered-models/create",
            json!({ "name": "fraud" }),
        )
        .await;
    let v1 = mlflow.version(&c, &champion).await;
    mlflow.set_alias(&c, "champion", &v1).await;
    let before = passes(&c, &ctl).await;

    // Forged: a bad signature, an old timestamp (signed), no signature.
    const BODY: &[u8] = br#"{"entity": "model_version_alias", "action": "created", "data": {"name": "fraud", "alias": "champion", "version": "1"}}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let signed = |id: &str, ts: u64| {
        let sig =
            rollgate_controller::registry::webhook::sign(b"s3cret", id, &ts.to_string(), BODY);
        vec![
            ("x-mlflow-delivery-id", id.to_string()),
            ("x-mlflow-timestamp", ts.to_string()),
            ("x-mlflow-signature", sig),
        ]
    };
    let mut bad = signed("forged-1", now);
    bad[2].1 = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into();
    let (s, r) = deliver(&c, &hook, BODY, bad).await;
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{r}"
    );
    let (s, r) = deliver(&c, &hook, BODY, signed("old-1", now - 3600)).await;
    assert_eq!(s, 401, "{r}");
    assert!(r.to_string().contains("X-MLflow-Timestamp"), "{r}");
    let (s, r) = deliver(&c, &hook, BODY, signed("bare", now)[..2].to_vec()).await;
    assert_eq!(s, 401, "{r}");
    // Another registry, or one that takes no webhook: 404.
    let other = format!("http://{}/api/v1/registries/other/webhook", ctl.addr());
    let (s, r) = deliver(&c, &other, BODY, signed("o-1", now)).await;
    assert_eq!(s, 404, "{r}");
    // Nothing woke: no pass ran, no champion was seeded.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(passes(&c, &ctl).await, before);
    let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    assert!(m["champion"].is_null(), "{m}");

    // A verified delivery wakes the poll (once per id): seeded now.
    let (s, r) = deliver(&c, &hook, BODY, signed("d-1", now)).await;
    assert_eq!((s, r["woke"].as_bool()), (200, Some(true)), "{r}");
    let (s, r) = deliver(&c, &hook, BODY, signed("d-1", now)).await;
    assert_eq!((s, r["duplicate"].as_bool()), (200, Some(true)), "{r}");
    until(Duration::from_secs(20), "the champion seeded", || async {
        let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
        m["champion"].as_str().map(str::to_string)
    })
    .await;

    // MLflow's own webhook: @challenger set, the rollout starts at once.
    mlflow
        .call(
            &c,
            "POST",
            "webhooks",
            json!({ "name": "rollgate", "url": hook, "secret": "s3cret",
                    "events": [{ "entity": "MODEL_VERSION_ALIAS", "action": "CREATED" }] }),
        )
        .await;
    let v2 = mlflow.version(&c, &candidate).await;
    let set_at = Instant::now();
    mlflow.set_alias(&c, "challenger", &v2).await;
    // (Within 30 s: well before the next poll, a minute away.)
    let id = started_after(&c, &ctl, None).await;
    let created = set_at.elapsed();
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        phase(r) != "pending"
    })
    .await;
    eprintln!(
        "@challenger set -> rollout {id} created through MLflow's webhook: {} ms, its first stage: {} ms (poll 60 s)",
        created.as_millis(),
        set_at.elapsed().as_millis()
    );
    // Who acted: the test's own model, the follower, the controller's
    // judging; never a webhook's caller.
    let (_, audit) = api(&c, &ctl, "GET", "/api/v1/audit?model=m", None).await;
    let actors: Vec<&str> = audit
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["actor"].as_str())
        .collect();
    assert!(
        actors
            .iter()
            .all(|a| ["local", "registry:mlflow", "controller"].contains(a)),
        "{actors:?}"
    );
}
