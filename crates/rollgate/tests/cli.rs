//! The `rollgate` binary, run as a user runs it.

use std::process::Command;

fn rollgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(args)
        .output()
        .expect("run rollgate")
}

/// The short version of the main job, over real sockets: trains the zoo,
/// starts model servers, gateway, controller and API, and runs the three
/// rollouts.
#[test]
fn demo_promotes_the_retrain_and_refuses_the_two_broken_candidates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = rollgate(&["demo", "--quick", "--dir", &dir.path().to_string_lossy()]);
    the_three_rollouts_decided(&out, dir.path());
}

/// The same three rollouts with a real nginx serving the users (its
/// weights set by the nginx adapter, mirroring to rollgate's gateway for
/// SHADOW) and a real Prometheus scraping the evidence.
#[test]
fn demo_through_nginx_and_prometheus_decides_the_same_three_rollouts() {
    let has = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p} || test -x /usr/sbin/{p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(has("nginx") && has("prometheus")) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs nginx and prometheus (apt-get install nginx prometheus)"
        );
        eprintln!("skipped: nginx or prometheus is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = rollgate(&[
        "demo",
        "--quick",
        "--data-plane",
        "nginx",
        "--dir",
        &dir.path().to_string_lossy(),
    ]);
    let stdout = the_three_rollouts_decided(&out, dir.path());
    assert!(stdout.contains("nginx http://"), "{stdout}");
    // The model was routed by nginx, its evidence read from Prometheus.
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).expect("audit export");
    let created = audit.lines().next().unwrap_or_default();
    assert!(
        created.contains(r#""data_plane":"nginx""#) && created.contains(r#""prometheus":{"#),
        "{created}"
    );
}

/// A gateway cannot run on no threads: refused before anything starts,
/// naming the flag.
#[test]
fn a_gateway_on_zero_threads_is_refused() {
    let out = rollgate(&["gateway", "--data", "unused", "--threads", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--threads"), "{stderr}");
    assert!(
        !std::path::Path::new("unused").exists(),
        "nothing was created"
    );
}

/// Without nginx or Prometheus the data-plane demo says what is missing
/// and how to get it, and does nothing else.
#[test]
fn demo_through_nginx_says_what_is_missing() {
    let empty = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["demo", "--data-plane", "nginx"])
        .env("PATH", empty.path())
        .output()
        .expect("run rollgate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("prometheus is not installed")
            && stderr.contains("apt-get install nginx prometheus"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing was started");
}

/// The demo's summary, sections and audit export show the three rollouts
/// decided as they must be; its stdout.
fn the_three_rollouts_decided(out: &std::process::Output, dir: &std::path::Path) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = &stdout[stdout.find("-- summary").expect("summary")..];
    let line = |name: &str| {
        summary
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no summary line for {name}: {summary}"))
            .to_string()
    };
    assert!(line("retrained").contains("PROMOTED"));
    let broken = line("broken-feature");
    assert!(
        broken.contains("ROLLED_BACK") && broken.contains("zero live exposure"),
        "{broken}"
    );
    assert!(line("ready-then-503").contains("ROLLED_BACK"));
    let section = |name: &str| {
        let start = stdout.find(&format!("== {name}")).expect("section present");
        let rest = &stdout[start + 3..];
        rest[..rest
            .find("\n== ")
            .or_else(|| rest.find("\n-- "))
            .unwrap_or(rest.len())]
            .to_string()
    };
    assert!(section("broken-feature").contains("shadow_agreement"));
    assert!(section("ready-then-503").contains("CANARY 5% -> ROLLED_BACK"));
    assert!(stdout.contains("records, intact"), "{stdout}");
    // The audit log was exported and every line is a record.
    let audit = std::fs::read_to_string(dir.join("audit.jsonl")).expect("audit export");
    assert!(audit.lines().count() > 10);
    assert!(audit.lines().all(|l| l.starts_with("{\"seq\":")));
    stdout.into_owned()
}

#[test]
fn simulated_demo_decides_the_same_three_rollouts() {
    let out = rollgate(&["demo", "--simulated"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("candidate exposure: 0 live requests"));
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let out = rollgate(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));
}

/// `rollgate plan check`: a plan with a quality gate and no label window
/// is refused, naming the field; with one, the labels a pass needs and
/// the wait, and a deadline the traffic cannot meet said so.
#[test]
fn plan_check_refuses_a_quality_gate_without_a_window_and_estimates_the_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = dir.path().join("plan.toml");
    let quality = "steps = [50]\n[gates.quality]\nenabled = true\nmargin = 0.2\n";
    std::fs::write(&plan, quality).expect("write");
    let path = plan.to_string_lossy();
    let out = rollgate(&["plan", "check", &path]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("gates.quality.label_window"), "{err}");

    let windowed = format!("{quality}label_window = \"1h\"\nlabel_deadline = \"2h\"\n");
    std::fs::write(&plan, windowed).expect("write");
    let out = rollgate(&["plan", "check", &path, "--rate", "1", "--discordant", "0.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("valid") && text.contains("SHADOW") && text.contains("CANARY 50%"));
    assert!(!text.contains("past the label deadline"), "{text}");
    // A hundredth of the traffic: SHADOW's ~200 pairs take longer than 2 h.
    let out = rollgate(&[
        "plan",
        "check",
        &path,
        "--rate",
        "0.01",
        "--discordant",
        "0.2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("past the label deadline"), "{text}");
    // Coverage too low for a pass under the worst case: said, not estimated.
    let out = rollgate(&["plan", "check", &path, "--coverage", "0.5"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("can never pass on labels"), "{text}");
}

#[test]
fn a_bad_config_file_is_an_input_error_naming_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[controller]\ntick = \"soon\"\n").expect("write");
    for cmd in ["controller", "up"] {
        let out = rollgate(&[
            cmd,
            "--config",
            &cfg.to_string_lossy(),
            "--data",
            &dir.path().join("data").to_string_lossy(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("bad.toml") && err.contains("line 2"),
            "{cmd}: {err}"
        );
    }
}

#[test]
fn completions_and_a_manual_page_come_from_the_command_tree() {
    for shell in ["bash", "zsh", "fish"] {
        let out = rollgate(&["completions", shell]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shell}");
        assert!(
            script.contains("rollout") && script.contains("watch"),
            "{shell}: {script}"
        );
    }
    let out = rollgate(&["man"]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(page.contains(".TH rollgate 1"), "{page}");
}
