//! The audit log on both engines: the hash chain, its export, signed
//! checkpoints, retention, the notification cursors, notes and the
//! sampled reading the dashboard uses. Helpers: `it.rs`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rollgate_core::{Effect, Phase, Plan, Timestamp};
use rollgate_store::{AuditFilter, SqlStore, Store, TransitionWrite};

use crate::it::*;

/// Every audit record's kind, in order.
pub(crate) fn audit_kinds(store: &dyn Store) -> Vec<String> {
    store
        .audit(&AuditFilter::default())
        .expect("audit")
        .into_iter()
        .map(|r| r.kind)
        .collect()
}

/// Opens the SQLite file directly, bypassing the store, as an attacker or a
/// buggy tool would.
fn raw(dir: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(dir.join("rollgate.db")).expect("raw open");
    c.execute_batch(
        "DROP TRIGGER audit_is_append_only_update; DROP TRIGGER audit_is_append_only_delete;",
    )
    .expect("drop triggers");
    c
}

#[test]
fn the_audit_log_refuses_updates_and_deletes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(dir.path());
    model_with_champion(store.as_ref(), 0);
    let c = rusqlite::Connection::open(dir.path().join("rollgate.db")).expect("raw");
    let upd = c.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 1", []);
    assert!(
        upd.expect_err("append-only")
            .to_string()
            .contains("append-only")
    );
    assert!(c.execute("DELETE FROM audit WHERE seq = 1", []).is_err());
}

#[test]
fn the_hash_chain_detects_an_edited_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(dir.path());
    model_with_champion(store.as_ref(), 3);
    assert!(store.verify_audit().expect("verify").is_intact());
    raw(dir.path())
        .execute("UPDATE audit SET actor = 'mallory' WHERE seq = 3", [])
        .expect("tamper");
    let report = store.verify_audit().expect("verify");
    assert_eq!(report.first_break.expect("broken").seq, 3);
}

#[test]
fn the_hash_chain_detects_a_deleted_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(dir.path());
    model_with_champion(store.as_ref(), 3);
    raw(dir.path())
        .execute("DELETE FROM audit WHERE seq = 2", [])
        .expect("tamper");
    let b = store
        .verify_audit()
        .expect("verify")
        .first_break
        .expect("broken");
    assert_eq!(b.seq, 3);
    assert!(b.problem.contains("missing"), "{}", b.problem);
}

#[test]
fn the_hash_chain_detects_reordered_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(dir.path());
    model_with_champion(store.as_ref(), 3);
    let c = raw(dir.path());
    // Swap the contents of records 2 and 3, keeping their sequence numbers.
    c.execute_batch(
        "UPDATE audit SET seq = -2 WHERE seq = 2;
         UPDATE audit SET seq = 2 WHERE seq = 3;
         UPDATE audit SET seq = 3 WHERE seq = -2;",
    )
    .expect("swap");
    let b = store
        .verify_audit()
        .expect("verify")
        .first_break
        .expect("broken");
    assert_eq!(b.seq, 2);
}

#[test]
fn jsonl_export_round_trips_and_still_verifies() {
    for_each_store(|store, _| {
        model_with_champion(store, 2);
        let records = store.audit(&AuditFilter::default()).expect("audit");
        let mut buf = Vec::new();
        rollgate_store::write_jsonl(&records, &mut buf).expect("export");
        let text = String::from_utf8(buf).expect("utf8");
        assert_eq!(text.lines().count(), records.len());
        let back: Vec<rollgate_store::AuditRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("line is a record"))
            .collect();
        assert_eq!(back, records);
        assert!(rollgate_store::verify_chain(&back).is_intact());
    });
}

#[test]
fn a_body_that_is_not_json_is_named_by_verify_and_odd_queries_are_not_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(dir.path());
    model_with_champion(store.as_ref(), 3);
    raw(dir.path())
        .execute("UPDATE audit SET body = 'not json {' WHERE seq = 2", [])
        .expect("tamper");
    let report = store.verify_audit().expect("verify reads every record");
    assert_eq!(report.first_break.expect("broken").seq, 2);
    let all = store.audit(&AuditFilter::default()).expect("audit reads");
    assert_eq!(all[1].body["unreadable_body"], "not json {");
    let beyond = AuditFilter {
        after_seq: Some(u64::MAX),
        limit: Some(u64::MAX),
        ..AuditFilter::default()
    };
    assert!(
        store
            .audit(&beyond)
            .expect("no records after the last")
            .is_empty()
    );
}

/// The tamperings the hash chain alone misses — cutting the tail, editing
/// a record and re-hashing everything after it — and deleting or forging
/// a checkpoint: each is reported by the signed checkpoints, on a copy of
/// a real store.
#[test]
fn signed_checkpoints_detect_truncation_rehashing_and_deleted_or_forged_checkpoints() {
    use rollgate_store::{CheckpointKey, checkpoint_head, read_sink, verify_store_anchors};
    let key = CheckpointKey::from_bytes(b"a key kept off the database disk").expect("key");
    let setup = || {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = sqlite(dir.path());
        model_with_champion(store.as_ref(), 3);
        let sink = dir.path().join("checkpoints.jsonl");
        let seq = checkpoint_head(store.as_ref(), &key, Some(&sink), None, Timestamp(1))
            .expect("checkpoint")
            .expect("a head");
        // Nothing new: no second checkpoint.
        assert_eq!(
            checkpoint_head(store.as_ref(), &key, Some(&sink), Some(seq), Timestamp(2)),
            Ok(None)
        );
        (dir, store, sink, seq)
    };
    let report = |store: &dyn Store, sink: &Path| {
        let (cps, bad) = read_sink(sink).expect("sink");
        assert!(bad.is_empty());
        verify_store_anchors(store, &key, &cps).expect("verify")
    };

    let (dir, store, sink, seq) = setup();
    assert!(report(store.as_ref(), &sink).is_intact());

    // Cut the tail: the chain still verifies, the checkpoint does not.
    raw(dir.path())
        .execute("DELETE FROM audit WHERE seq >= ?1", [seq - 1])
        .expect("tamper");
    assert!(store.verify_audit().expect("chain").is_intact());
    let r = report(store.as_ref(), &sink);
    assert!(r.problems[0].problem.contains("cut from its tail"), "{r:?}");

    // Edit record 2 and re-hash it and everything after it.
    let (dir, store, sink, seq) = setup();
    let mut records = store.audit(&AuditFilter::default()).expect("records");
    let c = raw(dir.path());
    let mut prev = records[0].hash.clone();
    for r in records.iter_mut().skip(1) {
        if r.seq == 2 {
            r.actor = "mallory".into();
        }
        r.prev_hash = prev;
        r.hash = r.compute_hash();
        prev = r.hash.clone();
        c.execute(
            "UPDATE audit SET actor = ?2, prev_hash = ?3, hash = ?4 WHERE seq = ?1",
            rusqlite::params![r.seq, r.actor, r.prev_hash, r.hash],
        )
        .expect("tamper");
    }
    assert!(
        store.verify_audit().expect("chain").is_intact(),
        "re-hashed"
    );
    let r = report(store.as_ref(), &sink);
    assert_eq!(r.problems.len(), 1, "{r:?}");
    assert_eq!(r.problems[0].seq, seq);
    assert!(r.problems[0].problem.contains("re-hashed"), "{r:?}");

    // Delete the checkpoint from the store: the sink still has it.
    let (dir, store, sink, _) = setup();
    let c = rusqlite::Connection::open(dir.path().join("rollgate.db")).expect("raw");
    assert!(
        c.execute("DELETE FROM checkpoints", []).is_err(),
        "append-only"
    );
    c.execute_batch("DROP TRIGGER checkpoints_are_append_only_delete; DELETE FROM checkpoints;")
        .expect("tamper");
    let r = report(store.as_ref(), &sink);
    assert!(
        r.problems[0].problem.contains("missing from the store"),
        "{r:?}"
    );

    // A checkpoint forged without the key.
    let (_dir, store, sink, seq) = setup();
    let forged = CheckpointKey::from_bytes(b"the attacker's own key!!").expect("key");
    rollgate_store::append_to_sink(&sink, &forged.sign(seq + 5, "0f", Timestamp(3)))
        .expect("append");
    let r = report(store.as_ref(), &sink);
    assert!(
        r.problems[0].problem.contains("another key") && r.problems[0].problem.contains("forged"),
        "{r:?}"
    );
    // A checkpoint that names this key but whose MAC is not its own.
    let (_dir, store, sink, seq) = setup();
    let mut tampered = key.sign(seq, "0f", Timestamp(3));
    tampered.hash = "1e".into();
    rollgate_store::append_to_sink(&sink, &tampered).expect("append");
    let r = report(store.as_ref(), &sink);
    assert!(
        r.problems[0]
            .problem
            .contains("not signed with the key it names"),
        "{r:?}"
    );
    // One log, one signer: a second key is refused before it signs, with
    // the setting named; the first key goes on signing.
    let (_dir, store, _sink, _) = setup();
    let refused = rollgate_store::key_fits_store(store.as_ref(), &forged).expect_err("another key");
    assert!(
        refused.contains("checkpoint_key_file") && refused.contains(&key.id()),
        "{refused}"
    );
    assert!(
        checkpoint_head(store.as_ref(), &forged, None, None, Timestamp(9))
            .expect_err("not signed")
            .contains("checkpoint_key_file")
    );
    rollgate_store::key_fits_store(store.as_ref(), &key).expect("the signer's own key");
    // A fresh store: the first key claims it, a second is refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let fresh = sqlite(dir.path());
    rollgate_store::key_fits_store(fresh.as_ref(), &forged).expect("the first key claims");
    let refused = rollgate_store::key_fits_store(fresh.as_ref(), &key).expect_err("a second key");
    assert!(refused.contains(&forged.id()), "{refused}");
    rollgate_store::key_fits_store(fresh.as_ref(), &forged).expect("again, the same key");
}

/// Retention prunes old evaluations' bodies and nothing else: the chain
/// still verifies (bodies are hashed by digest), decisions keep their
/// bodies, the database refuses any other change, and editing a pruned
/// record — or passing a decision off as a pruned evaluation — breaks the
/// chain.
#[test]
fn retention_prunes_old_evaluations_only_and_the_chain_still_verifies() {
    use rollgate_core::{Actor, AuditEvent, AuditKind};
    let dir = tempfile::tempdir().expect("tempdir");
    let tick = Arc::new(AtomicU64::new(1_000));
    let clock = Arc::clone(&tick);
    let store = SqlStore::open_dir(dir.path())
        .expect("open")
        .with_clock(move || Timestamp(clock.load(Ordering::SeqCst)));
    let ids = model_with_champion(&store, 1);
    let r = store
        .create_rollout("risk", &ids[1], &Plan::default(), "alice")
        .expect("rollout");
    let event = |kind| Effect::Audit {
        event: Box::new(AuditEvent {
            kind,
            actor: Actor::Controller,
            from: Phase::Pending,
            to: Phase::Pending,
            verdict: None,
            note: Some("evidence".into()),
            dry_run: false,
        }),
    };
    let mut version = r.version;
    for (at, kind) in [
        (2_000, AuditKind::Evaluated),
        (3_000, AuditKind::Paused),
        (4_000, AuditKind::Evaluated),
        (9_000, AuditKind::Evaluated),
    ] {
        tick.store(at, Ordering::SeqCst);
        let rec = store
            .apply(TransitionWrite {
                rollout: r.id,
                expected_version: version,
                state: &r.state,
                effects: &[event(kind)],
                actor: "controller",
                fence: None,
            })
            .expect("apply");
        version = rec.version;
    }
    assert_eq!(store.prune_evaluations(Timestamp(5_000)).expect("prune"), 2);
    assert_eq!(store.prune_evaluations(Timestamp(5_000)).expect("again"), 0);
    let all = store.audit(&AuditFilter::default()).expect("audit");
    let pruned: Vec<(&str, u64)> = all
        .iter()
        .filter(|r| r.pruned)
        .map(|r| (r.kind.as_str(), r.at.0))
        .collect();
    assert_eq!(pruned, [("evaluated", 2_000), ("evaluated", 4_000)]);
    assert!(
        all.iter()
            .filter(|r| !r.pruned)
            .all(|r| r.body != serde_json::json!({ "pruned": true }))
    );
    assert!(store.verify_audit().expect("verify").is_intact());

    // Nothing else may change, even to look like a pruning.
    let c = rusqlite::Connection::open(dir.path().join("rollgate.db")).expect("raw");
    let paused = all.iter().find(|r| r.kind == "paused").expect("paused").seq;
    for sql in [
        "UPDATE audit SET body = '{\"pruned\":true}', pruned = 1 WHERE seq = ?1",
        "UPDATE audit SET actor = 'mallory' WHERE seq = ?1",
    ] {
        assert!(c.execute(sql, [paused]).is_err(), "{sql}");
    }
    let first = pruned_seq(&all, 0);
    assert!(
        c.execute("UPDATE audit SET actor = 'mallory' WHERE seq = ?1", [first])
            .is_err()
    );

    // With the triggers dropped: both frauds are caught.
    let c = raw(dir.path());
    c.execute(
        "UPDATE audit SET body = '{\"pruned\":true}', pruned = 1, kind = 'evaluated' WHERE seq = ?1",
        [paused],
    )
    .expect("tamper");
    let b = store
        .verify_audit()
        .expect("verify")
        .first_break
        .expect("broken");
    assert_eq!(b.seq, paused, "{b:?}");
}

fn pruned_seq(all: &[rollgate_store::AuditRecord], i: usize) -> u64 {
    all.iter().filter(|r| r.pruned).nth(i).expect("pruned").seq
}

/// Records written before retention existed hash their body itself (no
/// digest): they still verify, and retention never prunes them.
#[test]
fn records_from_before_retention_still_verify_and_are_never_pruned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite(dir.path());
    model_with_champion(store.as_ref(), 2);
    let mut records = store.audit(&AuditFilter::default()).expect("records");
    let c = raw(dir.path());
    // As the older version wrote it (no digests), and every record an
    // evaluation, the kind retention could prune.
    let mut last = "0".repeat(64);
    for r in &mut records {
        r.body_digest = None;
        r.kind = "evaluated".into();
        r.prev_hash = last.clone();
        r.hash = r.compute_hash();
        last = r.hash.clone();
        c.execute(
            "UPDATE audit SET body_digest = NULL, kind = 'evaluated', prev_hash = ?2, hash = ?3 WHERE seq = ?1",
            rusqlite::params![r.seq, r.prev_hash, r.hash],
        )
        .expect("rewrite");
    }
    assert!(store.verify_audit().expect("verify").is_intact());
    assert_eq!(
        store
            .prune_evaluations(Timestamp(u64::MAX >> 2))
            .expect("prune"),
        0
    );
}

#[test]
fn a_notification_cursor_is_kept_and_never_moves_back() {
    for_each_store(|store, _| {
        assert_eq!(store.notify_cursor("ops").expect("read"), None);
        store.set_notify_cursor("ops", 5).expect("set");
        assert_eq!(store.notify_cursor("ops").expect("read"), Some(5));
        // A late writer (a deposed leader's notifier) cannot move it back.
        store.set_notify_cursor("ops", 3).expect("set");
        assert_eq!(store.notify_cursor("ops").expect("read"), Some(5));
        store.set_notify_cursor("ops", 9).expect("set");
        assert_eq!(store.notify_cursor("ops").expect("read"), Some(9));
        assert_eq!(store.notify_cursor("slack").expect("read"), None);
        // Cursors are not part of the audited record.
        assert!(store.verify_audit().expect("verify").is_intact());
    });
}

#[test]
fn a_note_is_chained_and_moves_its_cursor_in_the_same_write() {
    for_each_store(|store, _| {
        let note = |kind, cursor| rollgate_store::Note {
            model: "risk",
            rollout: Some(7),
            kind,
            actor: "registry:mlflow",
            body: serde_json::json!({ "written": "version 2 of fraud" }),
            cursor,
        };
        store.note(note("registry_conflict", None)).expect("note");
        assert_eq!(store.notify_cursor("registry:mlflow").expect("read"), None);
        store
            .note(note("registry_written", Some(("registry:mlflow", 1))))
            .expect("note");
        assert_eq!(
            store.notify_cursor("registry:mlflow").expect("read"),
            Some(1)
        );
        let recs = store.audit(&AuditFilter::default()).expect("audit");
        let kinds: Vec<&str> = recs.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(kinds, ["registry_conflict", "registry_written"]);
        assert_eq!(recs[1].actor, "registry:mlflow");
        assert_eq!(recs[1].rollout, Some(7));
        assert!(store.verify_audit().expect("verify").is_intact());
        // Recorded already (the cursor is there or past it): neither the
        // record nor the cursor is written again.
        for seq in [0, 1] {
            let again = store
                .note(note("registry_written", Some(("registry:mlflow", seq))))
                .expect("note");
            assert!(!again);
        }
        assert_eq!(
            store.notify_cursor("registry:mlflow").expect("read"),
            Some(1)
        );
        assert_eq!(
            store.audit(&AuditFilter::default()).expect("audit").len(),
            2
        );
    });
}

#[test]
fn a_sample_of_a_rollouts_evaluations_keeps_its_decisions_its_failures_and_its_last() {
    use rollgate_core::{Actor, AuditEvent, AuditKind, StageVerdict};
    for_each_store(|store, _| {
        let ids = model_with_champion(store, 1);
        let r = store
            .create_rollout("risk", &ids[1], &Plan::default(), "alice")
            .expect("rollout");
        let verdict = |outcome: &str| -> StageVerdict {
            serde_json::from_value(serde_json::json!({
                "stage": "canary", "outcome": outcome, "reason": {"code": "stats_unavailable"},
                "gross": false, "elapsed_ms": 0, "gates": []
            }))
            .expect("verdict")
        };
        let mut version = r.version;
        for n in 1..=50 {
            let kind = if n == 30 {
                AuditKind::Paused
            } else {
                AuditKind::Evaluated
            };
            let outcome = if n == 17 { "fail" } else { "wait" };
            let effects = [Effect::Audit {
                event: Box::new(AuditEvent {
                    kind,
                    actor: Actor::Controller,
                    from: Phase::Pending,
                    to: Phase::Pending,
                    verdict: Some(Arc::new(verdict(outcome))),
                    note: Some(format!("look {n}")),
                    dry_run: false,
                }),
            }];
            version = store
                .apply(TransitionWrite {
                    rollout: r.id,
                    expected_version: version,
                    state: &r.state,
                    effects: &effects,
                    actor: "controller",
                    fence: None,
                })
                .expect("apply")
                .version;
        }
        let everything = store
            .audit(&AuditFilter {
                rollout: Some(r.id),
                ..AuditFilter::default()
            })
            .expect("audit");
        let (sample, evaluated) = store.audit_sample(r.id, 10).expect("sample");
        assert_eq!(evaluated, 49);
        // Every record but evaluations, all of them.
        let others = |rs: &[rollgate_store::AuditRecord]| -> Vec<u64> {
            rs.iter()
                .filter(|r| r.kind != "evaluated")
                .map(|r| r.seq)
                .collect()
        };
        assert_eq!(others(&sample), others(&everything));
        assert!(others(&sample).len() >= 2, "created and paused");
        // Evaluations: every 5th of 49 (5, 10, …, 45), the last (49th),
        // and the failing one (the 17th), in order.
        let evals: Vec<u64> = everything
            .iter()
            .filter(|r| r.kind == "evaluated")
            .map(|r| r.seq)
            .collect();
        let kept: Vec<u64> = sample
            .iter()
            .filter(|r| r.kind == "evaluated")
            .map(|r| r.seq)
            .collect();
        let mut want: Vec<u64> = (1..=49)
            .filter(|n| n % 5 == 0 || *n == 49 || *n == 17)
            .map(|n| evals[n - 1])
            .collect();
        want.sort_unstable();
        assert_eq!(kept, want);
        assert!(sample.windows(2).all(|w| w[0].seq < w[1].seq));
        // Asking for more points than there are returns them all.
        let (all, _) = store.audit_sample(r.id, 1_000).expect("sample");
        assert_eq!(all.len(), everything.len());
    });
}
