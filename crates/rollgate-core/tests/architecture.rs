//! Architecture invariant, checked on every `cargo test`: the decision core
//! depends on no async runtime, network, database or filesystem crate, and
//! its source reads no clock, touches no file or socket and uses no global
//! random number generator. Time and randomness are parameters. And the
//! gateway and the controller never depend on each other, the gateway
//! uses none of the core's judgement, and the data-plane adapters sit
//! below the controller.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Crates whose presence in the core's normal dependency graph means I/O,
/// a runtime, or ambient randomness.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "hyper",
    "axum",
    "tower",
    "reqwest",
    "mio",
    "socket2",
    "rusqlite",
    "libsqlite3-sys",
    "postgres",
    "tokio-postgres",
    "sqlx",
    "diesel",
    "tempfile",
    "walkdir",
    "notify",
    "getrandom",
    "rand",
    "chrono",
    "time",
    "tracing",
    "log",
];

/// Source patterns that mean a clock, I/O or global randomness.
const FORBIDDEN_SOURCE: &[&str] = &[
    "std::fs",
    "std::net",
    "std::io",
    "std::env",
    "std::process",
    "std::thread",
    "Instant::now",
    "SystemTime",
    "thread_rng",
    "rand::",
    "println!",
    "eprintln!",
];

/// Names of every crate the core pulls in for a normal (non-dev) build, as
/// the feature resolver really builds it (`cargo metadata` would unify dev
/// features in).
fn normal_dependency_closure(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != package)
        .map(str::to_string)
        .collect()
}

#[test]
fn decision_core_depends_on_no_io_crate() {
    let deps = normal_dependency_closure("rollgate-core");
    assert!(deps.contains("statrs"), "closure looks wrong: {deps:?}");
    let bad: Vec<&String> = deps
        .iter()
        .filter(|d| FORBIDDEN.contains(&d.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "rollgate-core must stay pure, but depends on {bad:?}"
    );
}

#[test]
fn decision_core_source_reads_no_clock_and_does_no_io() {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n != "tests.rs") {
                // `tests.rs` holds a module's unit tests (`tidy.rs` checks
                // each is declared `#[cfg(test)]`).
                files.push(path);
            }
        }
    }
    assert!(files.len() > 10, "too few sources: {files:?}");
    let mut offences = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read source");
        // Unit tests may print and use seeded RNGs; only the library counts.
        let library = text.split("#[cfg(test)]").next().unwrap_or("");
        for pattern in FORBIDDEN_SOURCE {
            if library.contains(pattern) {
                offences.push(format!("{}: {pattern}", path.display()));
            }
        }
    }
    assert!(offences.is_empty(), "impure code in the core: {offences:?}");
}

/// The gateway and the controller never depend on each other (they meet in
/// the core's types and the store), and the gateway knows no store.
#[test]
fn the_gateway_and_the_controller_never_depend_on_each_other() {
    let controller = normal_dependency_closure("rollgate-controller");
    assert!(controller.contains("rollgate-store"), "{controller:?}");
    assert!(!controller.contains("rollgate-gateway"), "{controller:?}");
    let gateway = normal_dependency_closure("rollgate-gateway");
    assert!(gateway.contains("rollgate-core"), "{gateway:?}");
    for other in ["rollgate-controller", "rollgate-store"] {
        assert!(!gateway.contains(other), "the gateway depends on {other}");
    }
    // What they share for connections and for the gRPC wire are leaves:
    // no way round the rule.
    for leaf in ["rollgate-net", "rollgate-oip"] {
        let deps = normal_dependency_closure(leaf);
        let ours: Vec<_> = deps.iter().filter(|d| d.starts_with("rollgate-")).collect();
        assert!(ours.is_empty(), "{leaf} depends on {ours:?}");
    }
}

/// What of the core judges: the state machine, the rollout's ledger, the
/// policies, gates and stage verdicts, and the statistics they draw on
/// (modules, and the names the core re-exports from them). `*` would
/// import all of it.
const JUDGEMENT: &[&str] = &[
    "rollout",
    "step",
    "Input",
    "Observation",
    "Transition",
    "RolloutState",
    "RolloutSpec",
    "Phase",
    "Effect",
    "Ledger",
    "Exposure",
    "SeriesReport",
    "policy",
    "sequential",
    "windowed",
    "PolicyTests",
    "safety",
    "gate",
    "GateKind",
    "GateVerdict",
    "Outcome",
    "Reason",
    "Evidence",
    "stage",
    "StageVerdict",
    "StageReason",
    "RollbackReason",
    "stats",
    "anytime",
    "*",
];

/// Every name a source text takes from `rollgate_core`: the path after
/// each `rollgate_core::`, a `{...}` group whole, split into its names.
fn names_used_from_the_core(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices("rollgate_core::") {
        let rest = &text[at + "rollgate_core::".len()..];
        let path = if rest.starts_with('{') {
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(rest.len(), |(i, _)| i + 1);
            &rest[..end]
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '*'))
                .unwrap_or(rest.len());
            &rest[..end]
        };
        names.extend(
            path.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '*'))
                .filter(|n| !n.is_empty())
                .map(str::to_string),
        );
    }
    names
}

/// The gateway measures and never judges: of the core it takes the
/// measurement data model, the wire types and the validators, never the
/// state machine, a policy, a gate or a statistical test.
#[test]
fn the_gateway_measures_and_never_judges() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rollgate-gateway/src");
    let mut dirs = vec![src];
    let (mut files, mut used) = (0, BTreeSet::new());
    let mut offences = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("gateway src dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            // Unit tests may build anything; only the library counts.
            let library: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or("")
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            files += 1;
            for name in names_used_from_the_core(&library) {
                if JUDGEMENT.contains(&name.as_str()) {
                    offences.push(format!("{}: rollgate_core::{name}", path.display()));
                }
                used.insert(name);
            }
        }
    }
    assert!(files > 10, "too few gateway sources: {files}");
    // The scan sees a judgement however it is imported.
    for line in [
        "use rollgate_core::{Snapshot, rollout::{Input, step}};",
        "let t = rollgate_core::step(&spec, &state, input, now);",
    ] {
        assert!(
            names_used_from_the_core(line).contains(&"step".to_string()),
            "{line}"
        );
    }
    // What it does take, so that the scan is seen to read the imports.
    for name in ["Snapshot", "RevisionStats", "GatewaySnapshot", "Protocol"] {
        assert!(used.contains(name), "{name} not found among {used:?}");
    }
    assert!(offences.is_empty(), "the gateway judges: {offences:?}");
}

/// The data-plane adapters sit below the controller: it depends on them
/// (and calls them through their trait), they depend on neither the
/// controller nor the gateway (the store only for the declaration and the
/// routes they are given), and the gateway knows none. A kind whose client
/// is heavy (Kubernetes) comes behind a feature, never in the default
/// build of the controller.
#[test]
fn the_adapters_sit_below_the_controller() {
    let adapters = normal_dependency_closure("rollgate-adapters");
    assert!(adapters.contains("rollgate-net"), "{adapters:?}");
    for other in ["rollgate-controller", "rollgate-gateway"] {
        assert!(!adapters.contains(other), "the adapters depend on {other}");
    }
    let controller = normal_dependency_closure("rollgate-controller");
    assert!(controller.contains("rollgate-adapters"), "{controller:?}");
    for heavy in ["kube", "kube-client", "k8s-openapi"] {
        assert!(
            !controller.contains(heavy),
            "the controller's default build pulls {heavy}: put it behind a feature"
        );
    }
    let gateway = normal_dependency_closure("rollgate-gateway");
    assert!(
        !gateway.contains("rollgate-adapters"),
        "the gateway depends on the adapters"
    );
}

/// The operator reaches rollgate only through its admin API: it depends
/// on neither the controller, the store, the gateway nor the adapters, so
/// every change a Kubernetes object asks for passes the API's validator,
/// roles, host boundary and audit like any other caller's.
#[test]
fn the_operator_reaches_rollgate_only_through_its_api() {
    let operator = normal_dependency_closure("rollgate-operator");
    assert!(operator.contains("kube-runtime"), "{operator:?}");
    for other in [
        "rollgate-controller",
        "rollgate-store",
        "rollgate-gateway",
        "rollgate-adapters",
    ] {
        assert!(!operator.contains(other), "the operator depends on {other}");
    }
}

/// A crate with one test binary (`autotests = false`) compiles only the
/// files its `tests/suite.rs` names: a test file added beside it and not
/// named there would silently never run.
#[test]
fn every_test_file_is_part_of_its_crates_suite() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).expect("crates dir") {
        let dir = entry.expect("entry").path();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        if !manifest.contains("autotests = false") {
            continue;
        }
        let suite = std::fs::read_to_string(dir.join("tests/suite.rs")).unwrap_or_else(|e| {
            panic!(
                "{}: autotests = false needs tests/suite.rs: {e}",
                dir.display()
            )
        });
        for file in std::fs::read_dir(dir.join("tests")).expect("tests dir") {
            let name = file
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            let Some(module) = name.strip_suffix(".rs") else {
                continue;
            };
            if module != "suite" {
                assert!(
                    suite.lines().any(|l| l.trim() == format!("mod {module};")),
                    "{}/tests/{name} is not a module of tests/suite.rs, so it never runs",
                    dir.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "too few test files found: {checked}");
}

/// Every `fn` name in the workspace's Rust sources (libraries and tests).
fn workspace_function_names() -> BTreeSet<String> {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("..")];
    let mut names = BTreeSet::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read source");
                for (at, _) in text.match_indices("fn ") {
                    let name: String = text[at + 3..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(name);
                }
            }
        }
    }
    names
}

/// A backticked name in ARCHITECTURE.md that reads as a test's name: lower
/// snake case of at least four words, not a metric's name.
fn cited_test_names(text: &str) -> Vec<&str> {
    const METRIC_UNITS: &[&str] = &["_total", "_seconds", "_bytes", "_count", "_bucket"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.split('_').count() >= 4
                && !METRIC_UNITS.iter().any(|unit| s.ends_with(unit))
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .collect()
}

/// ARCHITECTURE.md's invariants are checked, and say by what: each one
/// names at least one test, and every test it names exists (a renamed or
/// deleted test leaves the document stale, and this fails).
#[test]
fn every_architecture_invariant_names_a_test_that_exists() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ARCHITECTURE.md"),
    )
    .expect("ARCHITECTURE.md");
    let functions = workspace_function_names();
    let missing: Vec<&str> = cited_test_names(&doc)
        .into_iter()
        .filter(|name| !functions.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names no such test: {missing:?}"
    );
    let mut invariants = 0;
    let mut unchecked = Vec::new();
    for paragraph in doc.split("\n\n") {
        if let Some(start) = paragraph.find("**Architecture invariant:**") {
            invariants += 1;
            if cited_test_names(&paragraph[start..]).is_empty() {
                unchecked.push(paragraph.lines().next().unwrap_or_default().to_string());
            }
        }
    }
    assert!(invariants >= 30, "only {invariants} invariants found");
    assert!(
        unchecked.is_empty(),
        "invariants that name no test: {unchecked:#?}"
    );
}
