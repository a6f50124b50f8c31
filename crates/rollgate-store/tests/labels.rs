//! Answers recorded for labels, and the labels, on both engines: each
//! answer kept once, each label applied once, a batch whole with one audit
//! record, joined by request id; the `labeler` role kept. Helpers: `it.rs`.

use rollgate_core::Timestamp;
use rollgate_store::{AnswerRow, LabelIn, Role, StoreError, secret_hash};

use crate::audit::audit_kinds;
use crate::it::*;

fn answer(id: &str, revision: &str, class: &str) -> AnswerRow {
    AnswerRow {
        model: "risk".into(),
        request_id: id.into(),
        revision: revision.into(),
        rollout: 7,
        epoch: 1,
        unit: 5,
        at: Timestamp(1_000),
        class: Some(class.into()),
        value: Some(0.25),
    }
}

fn label(id: &str, label: &str) -> LabelIn {
    LabelIn {
        request_id: id.into(),
        label: label.into(),
        observed_at: Some(Timestamp(900)),
    }
}

#[test]
fn labels_join_recorded_answers_once_and_a_batch_is_one_audit_record() {
    for_each_store(|store, _| {
        model_with_champion(store, 0);
        let rows = [
            answer("a", "v1", "1"),
            answer("a", "v2", "0"),
            answer("b", "v1", "1"),
        ];
        assert_eq!(store.record_answers(&rows).expect("record"), 3);
        // Read again (a restarted controller starts its cursors over).
        assert_eq!(store.record_answers(&rows).expect("again"), 0);
        let before = audit_kinds(store).len();
        let counts = store
            .add_labels("risk", &[label("a", "1"), label("zzz", "1")], "pipeline")
            .expect("labels");
        assert_eq!((counts.received, counts.applied, counts.unknown), (2, 1, 1));
        let counts = store
            .add_labels(
                "risk",
                &[label("a", "1"), label("a", "0"), label("b", "0")],
                "pipeline",
            )
            .expect("again");
        assert_eq!(
            (counts.applied, counts.duplicates, counts.conflicts),
            (1, 1, 1),
            "{counts:?}"
        );
        let kinds = audit_kinds(store);
        assert_eq!(kinds.len(), before + 2);
        assert_eq!(kinds.last().map(String::as_str), Some("labels_received"));
        // A label that came before its answer joins it when it is read.
        store
            .record_answers(&[answer("zzz", "v2", "1")])
            .expect("late answer");
        let joined = store.labelled_answers(7).expect("joined");
        assert_eq!(joined.len(), 4);
        let late = joined.iter().find(|r| r.request_id == "zzz").expect("zzz");
        assert_eq!(late.label.as_deref(), Some("1"));
        let a: Vec<_> = joined.iter().filter(|r| r.request_id == "a").collect();
        assert!(a.iter().all(|r| r.label.as_deref() == Some("1")), "{a:?}");
        assert_eq!(a[0].unit, 5);
        assert_eq!(a[0].value, Some(0.25));
        let b = joined.iter().find(|r| r.request_id == "b").expect("b");
        assert_eq!(b.label.as_deref(), Some("0"));
        assert!(store.labelled_answers(8).expect("none").is_empty());
        // Labels for a model that is not: refused, nothing applied.
        assert!(matches!(
            store.add_labels("nope", &[label("a", "1")], "pipeline"),
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(
            store.prune_answers(Timestamp(u64::MAX / 2)).expect("prune"),
            7,
            "four answers, three labels (one kept before its answer came)"
        );
        assert!(store.labelled_answers(7).expect("pruned").is_empty());
        // The labeler role is kept like any other.
        let t = store
            .create_token("pipeline", Role::Labeler, &secret_hash("s"), "local")
            .expect("labeler token");
        assert_eq!(t.role, Role::Labeler);
        let found = store.token_by_hash(&secret_hash("s")).expect("lookup");
        assert_eq!(found.map(|t| t.role), Some(Role::Labeler));
    });
}

/// A plan whose quality gate judges only a watch after promotion.
fn watched_plan() -> rollgate_core::Plan {
    let mut plan = rollgate_core::Plan::default();
    plan.gates.quality.enabled = true;
    plan.gates.quality.in_stages = false;
    plan.gates.quality.label_window = Some(std::time::Duration::from_secs(600));
    plan.watch.window = std::time::Duration::from_secs(3600);
    plan.watch.mirror_percent = 25;
    plan
}

#[test]
fn a_watch_mirrors_the_previous_champion_and_ending_it_restores_that_champion_atomically() {
    use rollgate_core::{OperatorAction, Phase};
    use rollgate_store::RevisionState;
    for_each_store(|store, _| {
        let ids = model_with_champion(store, 2);
        for (candidate, abort) in [(&ids[1], true), (&ids[2], false)] {
            let r = store
                .create_rollout("risk", candidate, &watched_plan(), "a")
                .expect("rollout");
            let promote = OperatorAction::Promote {
                reason: "verified".into(),
            };
            let watching = act(store, r.id, promote);
            assert!(matches!(watching.state.phase, Phase::Watching { .. }));
            assert!(watching.is_active());
            // The candidate serves everyone; the previous champion is what
            // the rollout mirrors, and the gateways record both for labels.
            assert_eq!(champions(store), vec![candidate.clone()]);
            let routes = store.routes().expect("routes");
            let m = routes
                .iter()
                .find(|m| m.model.name == "risk")
                .expect("risk");
            assert_eq!(m.champion.as_ref().map(|c| &c.id), Some(candidate));
            let (mirrored, routing, _) = m.rollout.as_ref().expect("watching");
            assert_eq!(mirrored.id, ids[0]);
            assert_eq!((routing.candidate_weight_bp, routing.mirror_bp), (0, 2500));
            assert!(m.record_answers);
            // Ended by an abort (restored, not rejected) or by a shown
            // regression (restored and rejected), in one change.
            let r = store.rollout(r.id).expect("rollout");
            let (mut state, mut effects) = (r.state.clone(), vec![]);
            effects.push(rollgate_core::Effect::SetRouting {
                routing: rollgate_core::Routing::CHAMPION_ONLY,
            });
            effects.push(rollgate_core::Effect::RestoreChampion);
            state.phase = if abort {
                Phase::Aborted
            } else {
                effects.push(rollgate_core::Effect::RejectCandidate);
                Phase::RolledBack {
                    reason: rollgate_core::RollbackReason::WatchRegression {
                        gates: vec![rollgate_core::GateKind::Quality],
                    },
                }
            };
            store
                .apply(rollgate_store::TransitionWrite {
                    rollout: r.id,
                    expected_version: r.version,
                    state: &state,
                    effects: &effects,
                    actor: "controller",
                    fence: None,
                })
                .expect("ended");
            assert_eq!(champions(store), vec![ids[0].clone()]);
            let was = store.revision(candidate).expect("candidate").state;
            let want = if abort {
                RevisionState::Archived
            } else {
                RevisionState::Rejected
            };
            assert_eq!(was, want);
            let m = store.routes().expect("routes");
            let m = m.iter().find(|m| m.model.name == "risk").expect("risk");
            assert_eq!(m.champion.as_ref().map(|c| &c.id), Some(&ids[0]));
            assert!(m.rollout.is_none());
        }
    });
}
