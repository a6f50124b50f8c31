//! The `rollgate` binary, run as a user runs it.

use std::process::Command;

fn rollgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(args)
        .output()
        .expect("run rollgate")
}

#[test]
fn demo_promotes_the_retrain_and_refuses_the_two_broken_candidates() {
    let out = rollgate(&["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let section = |name: &str| {
        let start = stdout.find(&format!("== {name}")).expect("section present");
        let rest = &stdout[start + 3..];
        rest[..rest.find("\n== ").unwrap_or(rest.len())].to_string()
    };
    assert!(section("retrained").contains("PROMOTED"));
    let broken = section("broken-feature");
    assert!(broken.contains("ROLLED BACK"));
    assert!(broken.contains("shadow_agreement"));
    assert!(broken.contains("candidate exposure: 0 live requests"));
    let dead = section("ready-then-503");
    assert!(dead.contains("ROLLED BACK"));
    assert!(dead.contains("CANARY 5%"));
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let out = rollgate(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));
}
