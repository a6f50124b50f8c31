//! The dashboard's weight and speed, in the test browser (Debian's
//! Chromium, playwright-core; `tests/browser/install.sh`).
//!
//! `cargo bench -p rollgate --bench dashboard` writes a store holding two
//! rollouts — one with 10,000 recorded evaluations, one with 100 — starts
//! `rollgate controller` on it, and opens each rollout's page five times,
//! alternating: the bytes transferred (page, script, style and the API's
//! answers) and the time from navigation until every gate's plot is drawn.
//! Prints a Markdown table and a JSON line.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rollgate_core::{AuditEvent, AuditKind, Effect, Phase, RolloutState};
use rollgate_store::{ModelSpec, RevisionSpec, SqlStore, Store, TransitionWrite};
use serde_json::{Value, json};

const RUNS: usize = 5;

/// One evaluation's verdict, shaped as the sequential policy writes it:
/// error rate (e-process), latency (quantile bounds), shadow agreement.
fn verdict(i: u64) -> Value {
    let n = 100 + i * 10;
    let wave = ((i as f64) / 300.0).sin();
    let interval = |lo: f64, hi: f64| json!({"lower": lo, "upper": hi});
    let q = |est: u64| json!({"estimate_us": est, "lower_us": est - 800, "upper_us": est + 900});
    let cmp = |quantile: f64, c: u64, h: u64| {
        json!({"quantile": quantile, "candidate": q(c), "champion": q(h), "max_ratio": 1.2,
            "max_added_ms": 10.0, "regressed": false, "not_regressed": true})
    };
    json!({
        "stage": "canary", "outcome": "wait", "reason": {"code": "awaiting_evidence", "gates": ["error_rate"]},
        "gross": false, "elapsed_ms": i * 1000,
        "champion": {"requests": n, "failures": n / 100, "error_rate": interval(0.005, 0.02), "outage": false},
        "gates": [
            {"gate": "error_rate", "outcome": "wait", "reason": {"code": "inconclusive"}, "evidence": {
                "kind": "error_rate",
                "candidate": {"failures": n / 100, "requests": n, "rate": 0.01},
                "champion": {"failures": n / 100, "requests": n, "rate": 0.01},
                "difference": interval(-0.01 - 0.001 * wave, 0.01 + 0.001 * wave), "margin": 0.01,
                "candidate_rate": interval(0.005, 0.02), "champion_rate": interval(0.005, 0.02),
                "e_value": (1.0 + wave).max(0.05), "client_error_e_value": 0.9, "pass_e_value": 1.0 + i as f64 / 100.0,
                "design_effect": 1.0}},
            {"gate": "latency", "outcome": "pass", "reason": {"code": "within_budget"}, "evidence": {
                "kind": "latency", "candidate_successes": n, "champion_successes": n,
                "median": cmp(0.5, 20_000 + (wave * 500.0) as u64, 20_000),
                "tail": cmp(0.95, 45_000 + (wave * 2000.0) as u64, 44_000)}},
            {"gate": "shadow_agreement", "outcome": "pass", "reason": {"code": "within_budget"}, "evidence": {
                "kind": "shadow_agreement", "pairs": n, "agreements": n - n / 50,
                "agreement": interval(0.95 + 0.01 * wave, 0.99), "min_agreement": 0.9,
                "champion_confident": n / 2, "confident_flips": 0, "flip_rate": interval(0.0, 0.01),
                "max_flip_rate": 0.02, "mirror_dropped": 0}}
        ]
    })
}

/// A rollout of a new candidate on a new model, with `evaluations`
/// recorded evaluations; returns its id.
fn rollout(store: &SqlStore, model: &str, evaluations: u64) -> i64 {
    store
        .create_model(model, &ModelSpec::default(), "bench")
        .expect("model");
    let rev = |port: u16| {
        let spec: RevisionSpec =
            serde_json::from_value(json!({"upstream": format!("http://127.0.0.1:{port}")}))
                .expect("spec");
        store
            .register_revision(model, &spec, "bench")
            .expect("revision")
            .id
    };
    let (champion, candidate) = (rev(9), rev(10));
    store
        .set_champion(model, &champion, "bench", "first")
        .expect("champion");
    let r = store
        .create_rollout(model, &candidate, &rollgate_core::Plan::default(), "bench")
        .expect("rollout");
    let canary = Phase::Canary {
        step: 0,
        weight_percent: 5,
    };
    let mut version = r.version;
    // A thousand evaluations per transaction (group commit).
    for chunk in (0..evaluations).collect::<Vec<_>>().chunks(1000) {
        let states: Vec<(RolloutState, Vec<Effect>)> = chunk
            .iter()
            .map(|&i| {
                let mut state = r.state.clone();
                state.phase = canary.clone();
                state.evaluations = i + 1;
                let event = AuditEvent {
                    kind: AuditKind::Evaluated,
                    actor: rollgate_core::Actor::Controller,
                    from: canary.clone(),
                    to: canary.clone(),
                    verdict: Some(std::sync::Arc::new(
                        serde_json::from_value(verdict(i)).expect("a verdict"),
                    )),
                    note: None,
                    dry_run: false,
                };
                (
                    state,
                    vec![Effect::Audit {
                        event: Box::new(event),
                    }],
                )
            })
            .collect();
        let writes: Vec<TransitionWrite> = states
            .iter()
            .enumerate()
            .map(|(k, (state, effects))| TransitionWrite {
                rollout: r.id,
                expected_version: version + k as u64,
                state,
                effects,
                actor: "controller",
                fence: None,
            })
            .collect();
        store.apply_batch(&writes).expect("apply");
        version += writes.len() as u64;
    }
    r.id
}

fn main() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/browser"));
    if !dir.join("node_modules/playwright-core").exists() || which("chromium").is_none() {
        eprintln!("skipped: run tests/browser/install.sh first (Chromium and playwright-core)");
        return;
    }
    let data = tempfile::tempdir().expect("tempdir");
    let store = SqlStore::open_dir(data.path()).expect("store");
    let big = rollout(&store, "big", 10_000);
    let small = rollout(&store, "small", 100);
    drop(store);
    let cfg = data.path().join("controller.toml");
    std::fs::write(
        &cfg,
        "[api]\nlisten = \"127.0.0.1:0\"\n[controller]\ntick = \"1h\"\n",
    )
    .expect("config");
    let mut ctl = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["controller", "--data"])
        .arg(data.path())
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn controller");
    let mut lines = BufReader::new(ctl.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("stdout");
    let addr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .expect("the controller's address")
        .trim_end_matches('/')
        .to_string();
    std::thread::spawn(move || for _ in lines {});
    let base = format!("http://{addr}");
    let mut results: Vec<(&str, Vec<Value>)> = vec![("10,000", vec![]), ("100", vec![])];
    for _ in 0..RUNS {
        for (k, id) in [big, small].into_iter().enumerate() {
            let out = Command::new("node")
                .arg(dir.join("dashboard.mjs"))
                .args(["weigh", &base, "", &id.to_string()])
                .current_dir(&dir)
                .output()
                .expect("node");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8_lossy(&out.stdout);
            let v: Value = serde_json::from_str(line.trim()).expect("a JSON line");
            results[k].1.push(v);
        }
    }
    let _ = ctl.kill();
    let _ = ctl.wait();
    println!(
        "| recorded evaluations | drawn, median of {RUNS} (ms) | max (ms) | transferred (bytes) | of which page+script+style |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut summary = json!({});
    for (name, runs) in &results {
        let mut drawn: Vec<u64> = runs.iter().filter_map(|v| v["drawn_ms"].as_u64()).collect();
        drawn.sort_unstable();
        let bytes = runs[0]["transferred_bytes"].as_u64().unwrap_or(0);
        let assets = runs[0]["page"].as_u64().unwrap_or(0)
            + runs[0]["files"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f[0].as_str().is_some_and(|p| p.starts_with("/dashboard/")))
                .filter_map(|f| f[1].as_u64())
                .sum::<u64>();
        let median = drawn[drawn.len() / 2];
        println!(
            "| {name} | {median} | {} | {bytes} | {assets} |",
            drawn.last().unwrap_or(&0)
        );
        summary[name.replace(',', "")] =
            json!({"drawn_ms": drawn, "transferred_bytes": bytes, "assets_bytes": assets});
    }
    println!("{summary}");
    for (name, runs) in &results {
        // Where the first load went: each file's bytes and milliseconds.
        eprintln!("{name}: {}", runs[0]["files"]);
    }
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(cmd))
            .find(|p| p.exists())
    })
}
