//! The web dashboard in a real browser: Debian's Chromium driven by
//! playwright-core (`tests/browser/dashboard.mjs`), against a controller,
//! a gateway and model servers on 127.0.0.1 with traffic flowing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

/// Chromium and the script's directory (with playwright-core), from
/// `tests/browser/install.sh`; `None` (locally) without them.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = std::env::var_os("ROLLGATE_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/bin/chromium")).filter(|p| p.exists()));
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/browser"));
    let ready = dir.join("node_modules/playwright-core").exists();
    match chromium {
        Some(c) if ready => Some((c, dir)),
        _ if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: Chromium or playwright-core is missing (tests/browser/install.sh)");
            None
        }
        _ => panic!("CI needs Chromium and playwright-core: run tests/browser/install.sh"),
    }
}

/// One run of a browser check: its stdout lines as they come, and its
/// exit status at the end.
struct Check {
    lines: mpsc::Receiver<String>,
    child: std::process::Child,
    seen: Vec<String>,
}

impl Check {
    fn start(browser: &(PathBuf, PathBuf), args: &[&str]) -> Check {
        let (chromium, dir) = browser;
        let mut child = Command::new("node")
            .arg(dir.join("dashboard.mjs"))
            .args(args)
            .current_dir(dir)
            .env("ROLLGATE_CHROMIUM", chromium)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node runs (it comes with npm)");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("browser: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Check {
            lines,
            child,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a line starting with `prefix`.
    fn expect(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(l) => self.seen.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the browser check ended before {prefix:?}: {:?}", self.seen)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "no {prefix:?} from the browser within {within:?}: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits (bounded) for the check to end; panics unless it passed.
    fn passed(mut self, within: Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                self.seen.extend(self.lines.try_iter());
                assert!(status.success(), "browser check failed: {:?}", self.seen);
                return self.seen;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "browser check still running after {within:?}: {:?}",
                    self.seen
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("join")
}

async fn token(c: &HttpClient, ctl: &Proc, name: &str, role: &str) -> String {
    let (s, t) = api(
        c,
        ctl,
        "POST",
        "/api/v1/tokens",
        Some(json!({ "name": name, "role": role })),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    t["secret"].as_str().expect("secret").to_string()
}

/// Where the screenshots go: `$ROLLGATE_SCREENSHOTS` (docs/img to refresh
/// the committed ones), or the test's directory.
fn shots(dir: &Path) -> PathBuf {
    std::env::var_os("ROLLGATE_SCREENSHOTS")
        .and_then(|d| std::path::absolute(d).ok())
        .unwrap_or_else(|| dir.to_path_buf())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_explains_and_acts_in_a_real_browser() {
    let Some(browser) = browser() else { return };
    let browser = Arc::new(browser);
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let healthy = model_server(Model::new(false)).await;
    let broken = model_server(Model::new(true)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &healthy).await;
    let operator = token(&c, &ctl, "olga", "operator").await;
    let viewer = token(&c, &ctl, "vic", "viewer").await;
    let base = format!("http://{}", ctl.addr());
    let out = shots(dir.path());
    let gw = start_gateway(dir.path());

    // 1. The page follows a rollout from SHADOW to PROMOTED. No traffic
    // until the page has shown SHADOW (a long evidence deadline keeps it
    // there), then traffic moves it on.
    let mut patient = plan();
    patient["evidence_timeout"] = json!("90s");
    let id = start_rollout_with(&c, &ctl, &cand, patient).await;
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        phase(r) == "shadow"
    })
    .await;
    let healthy_png = out.join("dashboard-promoted.png");
    let mut follow = {
        let (b, id, base, op, shot) = (
            Arc::clone(&browser),
            id.to_string(),
            base.clone(),
            operator.clone(),
            healthy_png.to_string_lossy().into_owned(),
        );
        blocking(move || Check::start(&b, &["follow", &base, &op, &id, &shot])).await
    };
    let mut follow = blocking(move || {
        follow.expect("seen shadow", Duration::from_secs(60));
        follow
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let seen = blocking(move || {
        let phases = follow.expect("phases", Duration::from_secs(150));
        let mut rest = follow.passed(Duration::from_secs(60));
        rest.push(phases);
        rest
    })
    .await;
    let phases = seen.last().cloned().unwrap_or_default();
    assert!(
        phases.contains("shadow") && phases.contains("CANARY") && phases.contains("promoted"),
        "{phases}"
    );
    let r = wait_for(&c, &ctl, id, Duration::from_secs(5), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    // Its plots: the e-value on a log axis against its threshold, real
    // elapsed time, both arms side by side, round numbers (the check
    // fails on any of these; its summary is printed for the log).
    let (b, base2, id_s, op) = (
        Arc::clone(&browser),
        base.clone(),
        id.to_string(),
        operator.clone(),
    );
    let axes = blocking(move || {
        Check::start(&b, &["axes", &base2, &op, &id_s]).passed(Duration::from_secs(90))
    })
    .await;
    eprintln!("{}", axes.join("\n"));

    // 2. A broken candidate is rolled back; from the model's page, one
    // click shows why, with the deciding bound.
    let bad = register(&c, &ctl, &broken).await;
    let id = start_rollout_with(&c, &ctl, &bad, plan()).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    let rolled_png = out.join("dashboard-rolled-back.png");
    let (b, op, base2, id_s, shot) = (
        Arc::clone(&browser),
        operator.clone(),
        base.clone(),
        id.to_string(),
        rolled_png.to_string_lossy().into_owned(),
    );
    blocking(move || {
        Check::start(&b, &["why", &base2, &op, "m", &id_s, &shot]).passed(Duration::from_secs(90))
    })
    .await;

    // 3. A live rollout: a viewer sees it without buttons; an operator
    // aborts it from the page.
    let another = model_server(Model::new(false)).await;
    let again = register(&c, &ctl, &another).await;
    let mut slow = plan();
    slow["min_stage_duration"] = json!("5m");
    slow["evidence_timeout"] = json!("10m");
    let id = start_rollout_with(&c, &ctl, &again, slow).await;
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        matches!(phase(r), "shadow" | "canary")
    })
    .await;
    let (b, base2, id_s, vw) = (
        Arc::clone(&browser),
        base.clone(),
        id.to_string(),
        viewer.clone(),
    );
    blocking(move || {
        Check::start(&b, &["viewer", &base2, &vw, &id_s]).passed(Duration::from_secs(90))
    })
    .await;
    // The overview says when the controller is behind its tick (the
    // leader's answer changed in the browser: making a real pass late
    // would need a slow store), and not when it keeps it.
    let (b, base2, op) = (Arc::clone(&browser), base.clone(), operator.clone());
    let lag =
        blocking(move || Check::start(&b, &["lag", &base2, &op]).passed(Duration::from_secs(90)))
            .await;
    assert!(lag.iter().any(|l| l.contains("waited 5.0 s")), "{lag:?}");
    let (b, base2, id_s, op) = (
        Arc::clone(&browser),
        base.clone(),
        id.to_string(),
        operator.clone(),
    );
    blocking(move || {
        Check::start(&b, &["abort", &base2, &op, &id_s]).passed(Duration::from_secs(90))
    })
    .await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(10), finished).await;
    assert_eq!(phase(&r), "aborted", "{r}");
    assert_eq!(r["routing"]["candidate_weight_bp"], 0, "{r}");
    assert_eq!(r["routing"]["mirror_bp"], 0, "{r}");
    let (_, records) = api(
        &c,
        &ctl,
        "GET",
        &format!("/api/v1/audit?rollout={id}"),
        None,
    )
    .await;
    let aborted: Vec<&Value> = records
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "aborted")
        .collect();
    assert_eq!(aborted.len(), 1, "{records}");
    assert_eq!(aborted[0]["actor"], "olga", "{}", aborted[0]);
    assert!(
        aborted[0]["body"]
            .to_string()
            .contains("aborted from the dashboard"),
        "{}",
        aborted[0]
    );
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    assert!(healthy_png.exists() && rolled_png.exists());
    assert!(chain_intact(&c, &ctl).await);
}
