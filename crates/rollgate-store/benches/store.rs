//! Store throughput with durable commits (WAL, synchronous=FULL).
//!
//! `cargo bench -p rollgate-store --bench store` prints a Markdown table and
//! a JSON line, for SQLite and — when `ROLLGATE_TEST_POSTGRES` names a
//! server (`tests/postgres/start.sh`) — for PostgreSQL, side by side. Each transition carries one audit record holding a real stage
//! verdict (every gate's evidence), as the controller writes on every
//! evaluation. Measured side by side in one run: one transition per commit,
//! and group commit (one transaction for a batch of rollouts, as a
//! controller reconciling many rollouts per tick does).

use std::time::{Duration, Instant};

use rollgate_core::stage::StageKind;
use rollgate_core::windowed::{StageInput, evaluate};
use rollgate_core::{
    Actor, AuditEvent, AuditKind, Effect, FailureClass, Phase, Plan, Snapshot, Timestamp,
};
use rollgate_store::{ModelSpec, RevisionSpec, SqlStore, Store, TransitionWrite};

fn verdict_effect() -> Effect {
    let mut w = Snapshot::default();
    for i in 0..1000u64 {
        w.revision_mut("champion")
            .record_success(20_000 + i * 7, ["ok"]);
        w.revision_mut("candidate")
            .record_success(21_000 + i * 5, ["ok"]);
    }
    w.revision_mut("candidate")
        .record_failure(FailureClass::Timeout);
    let verdict = evaluate(
        &Plan::default(),
        &StageInput {
            stage: StageKind::Canary,
            window: Some(&w),
            champion: "champion",
            candidate: "candidate",
            elapsed: Duration::from_secs(30),
        },
    );
    Effect::Audit {
        event: Box::new(AuditEvent {
            kind: AuditKind::Evaluated,
            actor: Actor::Controller,
            from: Phase::Shadow,
            to: Phase::Shadow,
            verdict: Some(std::sync::Arc::new(verdict)),
            note: None,
            dry_run: false,
        }),
    }
}

/// Where the bench's stores live: a fresh SQLite directory, or a fresh
/// database on a PostgreSQL server.
#[derive(Clone, Copy)]
enum Engine<'a> {
    Sqlite,
    Postgres(&'a str),
}

fn open(engine: Engine, dir: &std::path::Path, name: &str) -> SqlStore {
    match engine {
        Engine::Sqlite => SqlStore::open_dir(dir).expect("open"),
        Engine::Postgres(server) => {
            let url = rollgate_store::scratch_database(server, name).expect("scratch database");
            SqlStore::connect(&url).expect("connect")
        }
    }
}

/// A store with `models` models, each with an active rollout; returns rollout ids.
fn setup(store: SqlStore, models: usize) -> (SqlStore, Vec<i64>) {
    let mut ids = Vec::new();
    for m in 0..models {
        let name = format!("m{m}");
        store
            .create_model(&name, &ModelSpec::default(), "bench")
            .expect("model");
        let mut revs = Vec::new();
        for n in 0..2 {
            let spec = RevisionSpec {
                upstream: format!("http://127.0.0.1:{}", 9000 + n),
                ..RevisionSpec::default()
            };
            revs.push(
                store
                    .register_revision(&name, &spec, "bench")
                    .expect("rev")
                    .id,
            );
        }
        store
            .set_champion(&name, &revs[0], "bench", "bench")
            .expect("champion");
        ids.push(
            store
                .create_rollout(&name, &revs[1], &Plan::default(), "bench")
                .expect("rollout")
                .id,
        );
    }
    (store, ids)
}

struct Row {
    engine: &'static str,
    name: &'static str,
    transitions: u64,
    seconds: f64,
}

fn run(engine: Engine, name: &'static str, batch: usize, total: u64, effect: &Effect) -> Row {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, ids) = setup(
        open(engine, dir.path(), &format!("rg_bench_{batch}")),
        batch,
    );
    let mut records: Vec<_> = ids
        .iter()
        .map(|&id| store.rollout(id).expect("rollout"))
        .collect();
    let effects = std::slice::from_ref(effect);
    let start = Instant::now();
    let mut done = 0u64;
    while done < total {
        let writes: Vec<TransitionWrite> = records
            .iter()
            .map(|r| TransitionWrite {
                rollout: r.id,
                expected_version: r.version,
                state: &r.state,
                effects,
                actor: "controller",
                fence: None,
            })
            .collect();
        let out = if batch == 1 {
            vec![store.apply(writes[0].clone()).expect("apply")]
        } else {
            store.apply_batch(&writes).expect("apply batch")
        };
        done += out.len() as u64;
        records = out;
    }
    let seconds = start.elapsed().as_secs_f64();
    assert!(store.verify_audit().expect("verify").is_intact());
    Row {
        engine: store.engine(),
        name,
        transitions: done,
        seconds,
    }
}

fn main() {
    let effect = verdict_effect();
    let audit_bytes = serde_json::to_string(&effect).map_or(0, |s| s.len());
    let _ = Timestamp(0);
    let server = std::env::var("ROLLGATE_TEST_POSTGRES").ok();
    let mut engines = vec![Engine::Sqlite];
    match &server {
        Some(s) => engines.push(Engine::Postgres(s)),
        None => eprintln!("PostgreSQL skipped: ROLLGATE_TEST_POSTGRES is unset"),
    }
    let mut rows = Vec::new();
    for engine in engines {
        rows.push(run(engine, "1 transition per commit", 1, 2_000, &effect));
        rows.push(run(
            engine,
            "group commit, 16 rollouts",
            16,
            20_000,
            &effect,
        ));
        rows.push(run(
            engine,
            "group commit, 64 rollouts",
            64,
            40_000,
            &effect,
        ));
    }
    println!("audit record size: {audit_bytes} bytes of JSON evidence\n");
    println!("| engine | mode | transitions | seconds | transitions/s (= audit appends/s) |");
    println!("|---|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.0} |",
            r.engine,
            r.name,
            r.transitions,
            r.seconds,
            r.transitions as f64 / r.seconds
        );
    }
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"engine\":\"{}\",\"mode\":\"{}\",\"transitions\":{},\"seconds\":{:.3},\"per_second\":{:.0}}}",
                r.engine,
                r.name,
                r.transitions,
                r.seconds,
                r.transitions as f64 / r.seconds
            )
        })
        .collect();
    println!("\nJSON: [{}]", json.join(","));
}
