//! `rollgate rollout status`: one rollout in words, as the operator reads
//! it. Every number printed is one the deciding test used (see
//! [`rollgate_core::words`]); the snapshot tests below pin that on
//! rollouts decided by the real state machine.

use rollgate_core::words;
use rollgate_store::RolloutRecord;

/// What model registries said of a rollout, from its timeline (`GET
/// /api/v1/rollouts/{id}/timeline`): each conflict and each verdict
/// written back, a line each.
pub(crate) fn registry_lines(timeline: &serde_json::Value) -> String {
    let mut out = String::new();
    for e in timeline["events"].as_array().into_iter().flatten() {
        let label = match e["kind"].as_str() {
            Some("registry_conflict") => "REGISTRY CONFLICT",
            Some("registry_written") => "REGISTRY",
            _ => continue,
        };
        out.push_str(&format!(
            "  {label}: {}\n",
            e["summary"].as_str().unwrap_or("")
        ));
    }
    out
}

/// A compact view of one rollout: stage, weight, per-gate verdict and bounds.
pub(crate) fn rollout_view(r: &RolloutRecord) -> String {
    let mut out = format!(
        "rollout {}  {}  {} -> {}  {}{}\n",
        r.id,
        r.spec.model,
        r.spec.champion,
        r.spec.candidate,
        words::stage_label(&r.state.phase),
        if r.state.paused { "  (PAUSED)" } else { "" }
    );
    if r.state.phase.is_terminal() {
        out.push_str(&format!(
            "  {}\n",
            words::rollout_phase_line(&r.spec.plan, &r.state.phase)
        ));
    }
    if let rollgate_core::Phase::Watching { since, .. } = r.state.phase {
        out.push_str(&format!(
            "  PROMOTED, WATCHING until {}: labels judge {} against the previous champion {}, \
             mirrored; a regression shown restores it\n",
            rfc3339(since.plus(r.spec.plan.watch.window), false),
            r.spec.candidate,
            r.spec.champion
        ));
    }
    if let Some(a) = &r.state.awaiting {
        let deadline = r
            .spec
            .plan
            .approval_before(a.before)
            .and_then(|s| s.deadline.map(|d| (d, s.on_deadline)));
        out.push_str(&format!(
            "  WAITING FOR APPROVAL of {} since {}{} (rollgate rollout approve {} --reason ...)\n",
            a.before,
            rfc3339(a.since, false),
            match deadline {
                Some((d, on)) if !a.deadline_passed => format!(
                    "; {} at {}",
                    if on == rollgate_core::plan::OnDeadline::Hold {
                        "holds"
                    } else {
                        "rolls back"
                    },
                    rfc3339(a.since.plus(d), false)
                ),
                Some(_) => "; its deadline passed, holding".to_string(),
                None => String::new(),
            },
            r.id
        ));
    }
    if let rollgate_core::Phase::RolledBack { reason } = &r.state.phase {
        out.push_str(&format!(
            "  {}\n",
            words::rejection_line(reason, &r.spec.plan)
        ));
    }
    if r.state.phase == (rollgate_core::Phase::Promoted { manual: false }) {
        out.push_str(&format!("  {}\n", words::promotion_line(&r.spec.plan)));
    }
    if let Some(v) = &r.state.last_verdict {
        out.push_str(&format!(
            "  last evaluation: {:?} ({}), {:.0}s into the stage\n",
            v.outcome,
            v.reason.code(),
            v.elapsed_ms as f64 / 1000.0
        ));
        for line in words::verdict_lines(v) {
            out.push_str(&format!("    {line}\n"));
        }
    }
    out
}

/// A store timestamp as RFC 3339 to the millisecond: in UTC (`Z`), or
/// with `local` in the local time zone (its offset).
pub(crate) fn rfc3339(t: rollgate_core::Timestamp, local: bool) -> String {
    rfc3339_in(t, local.then(jiff::tz::TimeZone::system).as_ref())
}

fn rfc3339_in(t: rollgate_core::Timestamp, zone: Option<&jiff::tz::TimeZone>) -> String {
    let at = i64::try_from(t.0)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok());
    match (at, zone) {
        (None, _) => format!("{} ms", t.0),
        (Some(at), None) => at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        (Some(at), Some(z)) => at
            .to_zoned(z.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    //! `rollout status` on rollouts decided by the real gates and state
    //! machine over simulated traffic (seeded: the same every run).
    use super::*;
    use rollgate_core::gate::Evidence;
    use rollgate_core::{GateKind, Outcome, Phase, Plan, Routing, Timestamp};
    use rollgate_sim::{ArmModel, CoreDecider, Scenario, Traffic, simulate_with};
    use std::time::Duration;

    fn plan() -> Plan {
        Plan {
            min_stage_duration: Duration::from_secs(10),
            evidence_timeout: Duration::from_secs(120),
            ..Plan::default()
        }
    }

    /// Runs `scenario` to its end (or its `max_duration`) and returns the
    /// record `rollout status` would read.
    fn decided(scenario: &Scenario, seed: u64) -> RolloutRecord {
        let mut decider = CoreDecider::new(&scenario.plan(&plan()));
        simulate_with(&mut decider, &Traffic::new(scenario), seed);
        let (spec, state) = decider.rollout();
        RolloutRecord {
            id: 7,
            spec: spec.clone(),
            state: state.clone(),
            routing: Routing::CHAMPION_ONLY,
            version: state.evaluations,
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
        }
    }

    fn error_gate(r: &RolloutRecord) -> &Evidence {
        let v = r.state.last_verdict.as_ref().expect("a verdict");
        &v.gates
            .iter()
            .find(|g| g.gate == GateKind::ErrorRate)
            .expect("the error-rate gate")
            .evidence
    }

    /// Both arms fail everything from 25 s on: the test compares within
    /// epochs, and the words print each epoch's counts, the pooled totals
    /// labelled as pooled, and no verdict against the candidate.
    #[test]
    fn a_shared_outage_prints_the_epochs_it_compared_within() {
        let s = Scenario {
            name: "shared-outage".into(),
            shared_outage: Some((25, 10_000)),
            max_duration: Duration::from_secs(50),
            ..Scenario::identical("", 100.0)
        };
        let r = decided(&s, 3);
        assert!(!r.state.phase.is_terminal(), "{:?}", r.state.phase);
        let view = rollout_view(&r);
        let Evidence::ErrorRate {
            epochs, e_value, ..
        } = error_gate(&r)
        else {
            panic!("error-rate evidence")
        };
        assert!(epochs.len() >= 2, "{epochs:?}");
        for e in epochs {
            let line = format!(
                "epoch {}: candidate {}/{} failed",
                e.epoch, e.candidate.failures, e.candidate.requests
            );
            assert!(view.contains(&line), "{line} not in\n{view}");
        }
        let e = words::number(e_value.expect("sequential"));
        assert!(
            view.contains(&format!("failures e-value {e} (fails at ")),
            "{view}"
        );
        assert!(
            view.contains("pooled over the rollout (read, not tested)"),
            "{view}"
        );
        insta::assert_snapshot!(view);
    }

    /// A candidate that answers 404 to everything: no 5xx at all, so the
    /// failure counts are 0/0; the client-error test decides, and its
    /// counts and e-value are printed.
    #[test]
    fn a_4xx_rollback_prints_the_client_errors_that_decided() {
        let s = Scenario {
            name: "renamed-model-404".into(),
            candidate: ArmModel {
                client_error: 1.0,
                ..ArmModel::HEALTHY
            },
            shadow: Some(false),
            ..Scenario::identical("", 100.0)
        };
        let r = decided(&s, 1);
        assert!(
            matches!(r.state.phase, Phase::RolledBack { .. }),
            "{:?}",
            r.state.phase
        );
        let view = rollout_view(&r);
        let Evidence::ErrorRate {
            candidate,
            client_error_e_value,
            fail_at,
            ..
        } = error_gate(&r)
        else {
            panic!("error-rate evidence")
        };
        let (ce, at) = (
            client_error_e_value.expect("sequential"),
            fail_at.expect("sequential"),
        );
        assert!(ce >= at, "the client-error test decided: {ce} < {at}");
        assert_eq!((candidate.requests, candidate.failures), (0, 0));
        let shown = format!(
            "client errors (4xx) e-value {} (fails at {})",
            words::number(ce),
            words::number(at)
        );
        assert!(view.contains(&shown), "{shown} not in\n{view}");
        let answers = format!(
            "{}/{} answers 4xx (100.00%)",
            candidate.client_errors, candidate.client_errors
        );
        assert!(view.contains(&answers), "{answers} not in\n{view}");
        insta::assert_snapshot!(view);
    }

    /// SHADOW refuses a candidate whose answers differ: the one-sided test
    /// that decided is named with what it showed; the intervals beside it
    /// are labelled as read, not tested.
    #[test]
    fn a_shadow_refusal_names_the_test_that_decided() {
        let s = Scenario {
            name: "broken-feature".into(),
            flip_rate: 0.124,
            unconfident_disagreement: 0.25,
            ..Scenario::identical("", 100.0)
        };
        let r = decided(&s, 2);
        let v = r.state.last_verdict.as_ref().expect("a verdict");
        let shadow = v
            .gates
            .iter()
            .find(|g| g.gate == GateKind::ShadowAgreement)
            .expect("the shadow gate");
        assert_eq!(shadow.outcome, Outcome::Fail);
        let view = rollout_view(&r);
        assert!(view.contains("ROLLED BACK"), "{view}");
        assert!(
            view.contains("shown below the required") || view.contains("shown above the allowed"),
            "{view}"
        );
        assert!(view.contains("anytime bounds (read, not tested)"), "{view}");
        insta::assert_snapshot!(view);
    }
}

#[cfg(test)]
mod time_tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc_or_the_zone_asked_for() {
        let t = rollgate_core::Timestamp(1_767_225_600_123);
        assert_eq!(rfc3339_in(t, None), "2026-01-01T00:00:00.123Z");
        let kolkata = jiff::tz::TimeZone::get("Asia/Kolkata").expect("tzdata");
        assert_eq!(
            rfc3339_in(t, Some(&kolkata)),
            "2026-01-01T05:30:00.123+05:30"
        );
        let far = rollgate_core::Timestamp(u64::MAX);
        assert_eq!(rfc3339_in(far, None), format!("{} ms", u64::MAX));
    }
}
