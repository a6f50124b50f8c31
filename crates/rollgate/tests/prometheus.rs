//! rollgate scraped by a real Prometheus (Debian's `prometheus`; `.ci/run`
//! installs it): the alert a team would write on the rollback counter sees
//! the very first rollback. Every wait is bounded.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// A Prometheus server on 127.0.0.1, killed and reaped when dropped.
pub(crate) struct Prometheus {
    child: Child,
    pub(crate) url: String,
    listen: String,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prometheus's configuration scraping `targets` (host:port) every second.
fn scrape_config(dir: &std::path::Path, targets: &[&str]) {
    let targets = targets
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: rollgate\n    static_configs:\n      - targets: [{targets}]\n"
        ),
    )
    .expect("config");
}

impl Prometheus {
    /// Scrapes `targets` (host:port) every second, or `None` (locally, with
    /// a note) where Prometheus is not installed; in CI that is a failure.
    pub(crate) fn scraping(targets: &[&str]) -> Option<Prometheus> {
        let dir = tempfile::tempdir().expect("tempdir");
        scrape_config(dir.path(), targets);
        Self::start(dir)
    }

    /// Runs with the configuration `yml` (e.g. a documented example).
    pub(crate) fn with_config(yml: &str) -> Option<Prometheus> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("prometheus.yml"), yml).expect("config");
        Self::start(dir)
    }

    fn start(dir: tempfile::TempDir) -> Option<Prometheus> {
        let listen = free_addr();
        match Self::spawn(dir.path(), &listen) {
            Ok(child) => Some(Prometheus {
                child,
                url: format!("http://{listen}"),
                listen,
                dir,
            }),
            Err(_) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: prometheus is not installed (apt-get install prometheus)");
                None
            }
            Err(e) => panic!("CI needs prometheus (apt-get install prometheus): {e}"),
        }
    }

    fn spawn(dir: &std::path::Path, listen: &str) -> std::io::Result<Child> {
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// Kills Prometheus and starts it again on the same address and data
    /// (what it scraped is kept; what it missed meanwhile is not).
    pub(crate) fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.dir.path(), &self.listen).expect("prometheus again");
    }

    /// Scrapes `targets` from now on (the configuration reloaded on
    /// SIGHUP, as an operator or a service discovery would change it): a
    /// target left out goes stale.
    pub(crate) fn set_targets(&self, targets: &[&str]) {
        scrape_config(self.dir.path(), targets);
        self.signal("HUP");
    }

    /// Sends Prometheus `signal` (`STOP`: it neither scrapes nor answers;
    /// `CONT`: it goes on).
    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -{signal}");
    }

    /// The value of the instant query `promql` (`None`: no sample yet).
    pub(crate) async fn query(&self, c: &HttpClient, promql: &str) -> Option<f64> {
        let v = self.query_raw(c, promql).await?;
        let sample: &Value = v["data"]["result"].get(0)?;
        sample["value"][1].as_str()?.parse().ok()
    }

    /// Prometheus's whole answer to the instant query `promql`.
    async fn query_raw(&self, c: &HttpClient, promql: &str) -> Option<Value> {
        let url = format!(
            "{}/api/v1/query?query={}",
            self.url,
            form_urlencoded::byte_serialize(promql.as_bytes()).collect::<String>()
        );
        // Not `request`: Prometheus may not be listening yet.
        let req = hyper::Request::get(&url)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .ok()?;
        let resp = tokio::time::timeout(Duration::from_secs(5), c.request(req))
            .await
            .ok()?
            .ok()?;
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .ok()?
            .to_bytes();
        serde_json::from_slice(&body).ok()
    }

    /// Waits (bounded) until `promql` has a value that `ok` accepts.
    pub(crate) async fn wait_for(
        &self,
        c: &HttpClient,
        promql: &str,
        ok: impl Fn(f64) -> bool,
    ) -> f64 {
        let started = Instant::now();
        loop {
            if let Some(v) = self.query(c, promql).await
                && ok(v)
            {
                return v;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{promql} never got there (last: {:?})",
                self.query(c, promql).await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_on_the_rollback_counter_sees_the_first_rollback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let gw = start_gateway(dir.path());
    let Some(prom) = Prometheus::scraping(&[ctl.addr(), gw.addr()]) else {
        return;
    };
    let c = client();
    // Scraped (the counter at 0 for every reason) before anything happens.
    prom.wait_for(&c, r#"sum(up{job="rollgate"})"#, |v| v == 2.0)
        .await;
    prom.wait_for(&c, "count(rollgate_rollbacks_total)", |v| v >= 6.0)
        .await;
    let champion = model_server(Model::new(false)).await;
    let broken = model_server(Model::new(true)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &broken).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    // What an alert would evaluate: the increase over the last minute.
    let increase = prom
        .wait_for(&c, "sum(increase(rollgate_rollbacks_total[1m]))", |v| {
            v >= 0.9
        })
        .await;
    eprintln!("increase(rollgate_rollbacks_total[1m]) after one rollback: {increase}");
    assert!(increase < 2.5, "one rollback, not {increase}");
    // The controller's cadence: its passes, and the time between two
    // looks at a rollout, as histograms.
    for series in [
        "rollgate_controller_pass_seconds_count",
        "rollgate_controller_rollout_lag_seconds_count",
    ] {
        prom.wait_for(&c, &format!("sum({series})"), |v| v >= 1.0)
            .await;
    }
    // Every query of the committed Grafana dashboard is valid PromQL over
    // these metrics, and the traffic panels show the traffic.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/rollgate.json"
        ))
        .expect("the dashboard"),
    )
    .expect("dashboard JSON");
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(exprs.len() >= 9, "{exprs:?}");
    for expr in &exprs {
        let v = prom.query_raw(&c, expr).await.expect("an answer");
        assert_eq!(v["status"], "success", "{expr}: {v}");
    }
    // The request-rate and p95 panels show the traffic (still running: the
    // champion serves everyone now).
    for expr in exprs.iter().filter(|e| {
        e.starts_with("sum by (model, revision) (rate(rollgate_requests_total")
            || e.starts_with("histogram_quantile")
    }) {
        let started = Instant::now();
        loop {
            let v = prom.query_raw(&c, expr).await.unwrap_or(Value::Null);
            let finite = v["data"]["result"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["value"][1].as_str()?.parse::<f64>().ok())
                .any(|x| x.is_finite() && x > 0.0);
            if finite {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{expr}: {v}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

/// The body `rollgate serve`'s trained model reads: one row of 12 features.
pub(crate) const ROW: &[u8] =
    br#"{"instances":[[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2]]}"#;

/// A model server (`rollgate serve`, MLServer's metrics on its port)
/// serving `model` as `m`, with `flags`.
pub(crate) fn serve(model: &str, flags: &[&str]) -> Proc {
    let mut args = vec![
        "serve",
        "--model",
        model,
        "--name",
        "m",
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(flags);
    spawn(&args, &[])
}

/// The champion model `rollgate train` writes into `dir`; its path.
pub(crate) fn trained_model(dir: &std::path::Path) -> String {
    let models = dir.join("models");
    let trained = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["train", "--out", &models.to_string_lossy()])
        .output()
        .expect("train");
    assert!(trained.status.success(), "{trained:?}");
    models.join("champion.json").to_string_lossy().into_owned()
}

/// A model spec's `prometheus`: `rollgate serve`'s MLServer-shaped
/// counters and latency buckets, told apart by instance, scraped every
/// second, with a 1.5 s horizon.
pub(crate) fn evidence(prometheus_url: &str) -> Value {
    let labels = r#"{model="$served_name",instance="$instance"}"#;
    json!({
        "url": prometheus_url,
        "successes": format!("model_infer_request_success_total{labels}"),
        "failures": format!("model_infer_request_failure_total{labels}"),
        "latency_buckets": format!("model_infer_request_duration_bucket{labels}"),
        "scrape_interval_ms": 1000,
        "horizon_ms": 1500,
    })
}

/// Registers model `m` with its evidence from `prom` (see [`evidence`])
/// and the model server at `champion` as its champion; the champion's id.
async fn scraped_model(c: &HttpClient, ctl: &Proc, prom: &Prometheus, champion: &str) -> String {
    let (s, r) = api(
        c,
        ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "m", "spec": { "prometheus": evidence(&prom.url) } })),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let champ = register(c, ctl, champion).await;
    let (s, r) = api(
        c,
        ctl,
        "PUT",
        "/api/v1/models/m/champion",
        Some(json!({ "revision": champ, "reason": "first" })),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    champ
}

/// The rollout's evidence came from Prometheus's series (and the
/// gateways' pairs), and counts `revision`.
pub(crate) fn scraped_evidence_counts(r: &Value, revision: &str) -> bool {
    let series = r["state"]["evidence"]["series"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    series
        .keys()
        .any(|k| k.starts_with("prometheus/") && k.ends_with(revision))
        && ledger_requests(r, revision) > 0
}

/// A model whose evidence is read from Prometheus scraping its model
/// servers (the gateway splits and mirrors, its own counts of the
/// revisions unread): an identical candidate is promoted; a candidate that
/// is ready and answers every prediction 503 is rolled back, every request
/// after on the champion; a candidate whose scrape target goes away
/// mid-stage never promotes (no evidence is not health) and fails safe; a
/// Prometheus restarted mid-rollout loses nothing it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_from_prometheus_promotes_identical_and_rolls_back_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let model = trained_model(d);
    let champion = serve(&model, &[]);
    let identical = serve(&model, &[]);
    let broken = serve(&model, &["--ready-then-503"]);
    let mut vanishing = serve(&model, &[]);
    let Some(mut prom) = Prometheus::scraping(&[
        champion.addr(),
        identical.addr(),
        broken.addr(),
        vanishing.addr(),
    ]) else {
        return;
    };
    let ctl = start_controller(d, &[]);
    let gw = start_gateway(d);
    let c = client();
    // A selector that cannot tell the revisions apart is refused.
    let (s, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "m", "spec": { "prometheus": {
            "url": prom.url,
            "successes": "model_infer_request_success_total{model=\"m\"}",
        }}})),
    )
    .await;
    assert_eq!(s, 422, "{r}");
    assert!(r.to_string().contains("$revision"), "{r}");
    let url = |p: &Proc| format!("http://{}", p.addr());
    let champ = scraped_model(&c, &ctl, &prom, &url(&champion)).await;
    prom.wait_for(&c, r#"count(up == 1)"#, |v| v == 4.0).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic_of(gw.addr(), ROW, Arc::clone(&stop));
    let mut plan = plan();
    plan["evidence_timeout"] = json!("20s");

    // An identical candidate is promoted on the scraped counts.
    let same = register(&c, &ctl, &url(&identical)).await;
    let id = start_rollout_with(&c, &ctl, &same, plan.clone()).await;
    // Prometheus restarted mid-rollout: the counters it reads after are
    // still the targets' cumulative ones, so nothing is lost but the
    // scrapes it missed.
    wait_for(&c, &ctl, id, Duration::from_secs(60), |r| {
        phase(r) == "canary" || finished(r)
    })
    .await;
    prom.restart();
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    eprintln!(
        "identical: promoted; scraped requests: candidate {}, champion {}",
        ledger_requests(&r, &same),
        ledger_requests(&r, &champ)
    );
    assert!(
        scraped_evidence_counts(&r, &same),
        "{}",
        r["state"]["evidence"]
    );
    assert!(
        scraped_evidence_counts(&r, &champ),
        "{}",
        r["state"]["evidence"]
    );

    // Ready, then 503 to every prediction: rolled back on what the model
    // server's own failure counter says.
    let bad = register(&c, &ctl, &url(&broken)).await;
    let id = start_rollout_with(&c, &ctl, &bad, plan.clone()).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    eprintln!("ready-then-503: {}", r["state"]["phase"]);
    let reason = &r["state"]["phase"]["reason"];
    assert!(
        ["breach", "anytime_breach"].contains(&reason["code"].as_str().unwrap_or(""))
            && reason["gates"].to_string().contains("error_rate"),
        "{r}"
    );
    assert!(
        scraped_evidence_counts(&r, &bad),
        "{}",
        r["state"]["evidence"]
    );
    let failed = prom
        .query(
            &c,
            &format!(
                r#"sum(model_infer_request_failure_total{{instance="{}"}})"#,
                broken.addr()
            ),
        )
        .await
        .unwrap_or(0.0);
    assert!(failed > 0.0, "the broken server counted its failures");
    // Every request after the rollback (once the gateway has followed the
    // store) is the champion's: the identical candidate, promoted above.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let stop_after = Arc::new(AtomicBool::new(false));
    let after = traffic_of(gw.addr(), ROW, Arc::clone(&stop_after));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_after.store(true, Ordering::SeqCst);
    let by = after.await.expect("traffic");
    assert!(!by.is_empty() && by.keys().all(|k| *k == same), "{by:?}");

    // A candidate whose model server (and so its scrape target) goes away
    // once its stage has begun: no evidence for it, so never promoted; the
    // stage starves and fails safe at its deadline.
    let gone = register(&c, &ctl, &url(&vanishing)).await;
    let id = start_rollout_with(&c, &ctl, &gone, plan.clone()).await;
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        phase(r) != "pending"
    })
    .await;
    vanishing.kill();
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    eprintln!("target gone: {}", r["state"]["phase"]);
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "evidence_timeout",
        "{r}"
    );
    stop.store(true, Ordering::SeqCst);
    let by = load.await.expect("traffic");
    assert!(by.get(&same).copied().unwrap_or(0) > 0, "{by:?}");
}

/// The reason code of the rollout's latest look, and its weight.
fn look(r: &Value) -> (String, String) {
    (
        r["state"]["last_verdict"]["reason"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        r["state"]["phase"].to_string(),
    )
}

/// Evidence covers the look, or it is not evidence: a scrape target
/// removed mid-stage (the candidate's in the first stage, the champion's
/// in the last) makes the looks wait with `evidence_stale` naming that
/// revision, and the stage does not pass however long it runs meanwhile;
/// the target back, the rollout goes on and promotes. Prometheus stopped
/// (SIGSTOP) mid-stage: the same, then it promotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_that_stops_never_passes_a_stage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let model = trained_model(d);
    let champion = serve(&model, &[]);
    let identical = serve(&model, &[]);
    let again = serve(&model, &[]);
    let all = [champion.addr(), identical.addr(), again.addr()];
    let Some(prom) = Prometheus::scraping(&all) else {
        return;
    };
    let ctl = start_controller(d, &[]);
    let gw = start_gateway(d);
    let c = client();
    let url = |p: &Proc| format!("http://{}", p.addr());
    let champ = scraped_model(&c, &ctl, &prom, &url(&champion)).await;
    prom.wait_for(&c, r#"count(up == 1)"#, |v| v == 3.0).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic_of(gw.addr(), ROW, Arc::clone(&stop));
    let mut plan = plan();
    plan["steps"] = json!([20, 50]);
    plan["shadow"] = json!({ "enabled": false });
    // Longer than Prometheus takes to apply a target change (its discovery
    // sends updates at most every 5 s) plus two scrape intervals: no stage
    // can pass on the last fresh counts before the looks see them stop.
    let min_stage = Duration::from_secs(15);
    plan["min_stage_duration"] = json!("15s");
    plan["evidence_timeout"] = json!("120s");
    let same = register(&c, &ctl, &url(&identical)).await;
    let id = start_rollout_with(&c, &ctl, &same, plan.clone()).await;
    let at_percent = |r: &Value, percent: u64| r["state"]["phase"]["weight_percent"] == percent;
    // Waits for the stage at `percent` to begin: when it began.
    let stage_began = |percent: u64| {
        let (c, ctl) = (&c, &ctl);
        async move {
            let r = wait_for(c, ctl, id, Duration::from_secs(60), |r| {
                at_percent(r, percent) || finished(r)
            })
            .await;
            assert!(!finished(&r), "{r}");
            (Instant::now(), look(&r).1)
        }
    };

    // Holds while `target` is out (for good, as far as the stage can
    // tell), then goes on once it is back.
    let cut_off = |target: String, revision: String, percent: u64| {
        let (c, ctl, prom) = (&c, &ctl, &prom);
        async move {
            let (began, stage) = stage_began(percent).await;
            let kept: Vec<&str> = all.iter().copied().filter(|t| *t != target).collect();
            prom.set_targets(&kept);
            // Gone from Prometheus: its `up` went stale.
            let started = Instant::now();
            while prom
                .query(c, &format!(r#"up{{instance="{target}"}}"#))
                .await
                .is_some()
            {
                assert!(started.elapsed() < Duration::from_secs(30), "never removed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let removed = Instant::now();
            let r = wait_for(c, ctl, id, Duration::from_secs(30), |r| {
                look(r).0 == "evidence_stale" || finished(r)
            })
            .await;
            assert_eq!(look(&r).0, "evidence_stale", "{r}");
            assert_eq!(
                r["state"]["last_verdict"]["reason"]["revision"], revision,
                "{r}"
            );
            eprintln!(
                "{percent}%: evidence_stale {:.1} s after Prometheus dropped the target, {:.1} s into the stage ({})",
                removed.elapsed().as_secs_f64(),
                began.elapsed().as_secs_f64(),
                r["state"]["last_verdict"]["reason"]["series"]
            );
            assert_eq!(
                look(&r).1,
                stage,
                "the stage passed before its series was seen stale: {r}"
            );
            // Past the minimum stage duration: still in that stage, still stale.
            tokio::time::sleep(
                (min_stage + Duration::from_secs(3)).saturating_sub(began.elapsed()),
            )
            .await;
            let r = wait_for(c, ctl, id, Duration::from_secs(5), |_| true).await;
            assert_eq!(
                look(&r).1,
                stage,
                "the stage passed on a stopped series: {r}"
            );
            assert_eq!(look(&r).0, "evidence_stale", "{r}");
            prom.set_targets(&all);
        }
    };
    cut_off(identical.addr().to_string(), same.clone(), 20).await;
    cut_off(champion.addr().to_string(), champ.clone(), 50).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");

    // Prometheus stopped from the stage's start to past its minimum
    // duration: no look passes while it is; then on.
    let next = register(&c, &ctl, &url(&again)).await;
    let id2 = start_rollout_with(&c, &ctl, &next, plan).await;
    let r = wait_for(&c, &ctl, id2, Duration::from_secs(60), |r| {
        at_percent(r, 20) || finished(r)
    })
    .await;
    assert!(!finished(&r), "{r}");
    let began = Instant::now();
    prom.signal("STOP");
    tokio::time::sleep(min_stage + Duration::from_secs(3)).await;
    let r = wait_for(&c, &ctl, id2, Duration::from_secs(5), |_| true).await;
    prom.signal("CONT");
    assert!(
        at_percent(&r, 20),
        "passed while Prometheus was stopped: {r}"
    );
    assert!(
        ["stats_unavailable", "evidence_stale"].contains(&look(&r).0.as_str()),
        "{r}"
    );
    eprintln!(
        "Prometheus stopped {:.1} s: {}",
        began.elapsed().as_secs_f64(),
        look(&r).0
    );
    let r = wait_for(&c, &ctl, id2, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}
