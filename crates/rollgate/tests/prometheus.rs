//! rollgate scraped by a real Prometheus (Debian's `prometheus`; `.ci/run`
//! installs it): the alert a team would write on the rollback counter sees
//! the very first rollback. Every wait is bounded.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

/// A Prometheus server on 127.0.0.1, killed and reaped when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `targets` (host:port) every second, or `None` (locally, with
    /// a note) where Prometheus is not installed; in CI that is a failure.
    fn scraping(targets: &[&str]) -> Option<Prometheus> {
        let targets = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: rollgate\n    static_configs:\n      - targets: [{targets}]\n"
            ),
        )
        .expect("config");
        let listen = free_addr();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match child {
            Ok(child) => Some(Prometheus {
                child,
                url: format!("http://{listen}"),
                _dir: dir,
            }),
            Err(_) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: prometheus is not installed (apt-get install prometheus)");
                None
            }
            Err(e) => panic!("CI needs prometheus (apt-get install prometheus): {e}"),
        }
    }

    /// The value of the instant query `promql` (`None`: no sample yet).
    async fn query(&self, c: &HttpClient, promql: &str) -> Option<f64> {
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
    async fn wait_for(&self, c: &HttpClient, promql: &str, ok: impl Fn(f64) -> bool) -> f64 {
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
