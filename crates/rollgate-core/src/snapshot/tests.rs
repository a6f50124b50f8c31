use super::*;
use proptest::prelude::*;

/// One measured event, as the gateway would record it.
#[derive(Debug, Clone)]
enum Event {
    Success {
        rev: u8,
        latency_us: u64,
        class: u8,
    },
    Failure {
        rev: u8,
        class: u8,
    },
    ClientError {
        rev: u8,
    },
    Pair {
        shadow: u8,
        agreed: bool,
        confident: bool,
    },
    Drop {
        shadow: u8,
    },
    /// A mirrored request's pairs, as `(agreed, confident)` bits.
    Request {
        shadow: u8,
        agreed: u8,
        confident: u8,
        instances: u8,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0u8..3, 1u64..5_000_000, 0u8..3).prop_map(|(rev, latency_us, class)| Event::Success {
            rev,
            latency_us,
            class
        }),
        (0u8..3, 0u8..4).prop_map(|(rev, class)| Event::Failure { rev, class }),
        (0u8..3).prop_map(|rev| Event::ClientError { rev }),
        (0u8..2, any::<bool>(), any::<bool>()).prop_map(|(shadow, agreed, confident)| {
            Event::Pair {
                shadow,
                agreed,
                confident,
            }
        }),
        (0u8..2).prop_map(|shadow| Event::Drop { shadow }),
        (0u8..2, any::<u8>(), any::<u8>(), 1u8..8).prop_map(
            |(shadow, agreed, confident, instances)| Event::Request {
                shadow,
                agreed,
                confident,
                instances
            }
        ),
    ]
}

fn record(events: &[Event]) -> Snapshot {
    let mut s = Snapshot::default();
    for e in events {
        match *e {
            Event::Success {
                rev,
                latency_us,
                class,
            } => {
                let r = s.revision_mut(&format!("r{rev}"));
                r.record_success(latency_us, [format!("c{class}").as_str()]);
                r.unit_mut(u16::from(class) * 7).record_success(latency_us);
            }
            Event::Failure { rev, class } => {
                let r = s.revision_mut(&format!("r{rev}"));
                r.record_failure(FailureClass::ALL[class as usize]);
                r.unit_mut(u16::from(class)).record_failures(1);
            }
            Event::ClientError { rev } => {
                let r = s.revision_mut(&format!("r{rev}"));
                r.record_client_error();
                r.unit_mut(u16::from(rev)).record_client_error();
            }
            Event::Request {
                shadow,
                agreed,
                confident,
                instances,
            } => {
                let pairs: Vec<(bool, bool)> = (0..instances)
                    .map(|i| (agreed >> i & 1 == 1, confident >> i & 1 == 1))
                    .collect();
                s.pairs_mut(&format!("s{shadow}")).record_request(&pairs);
            }
            Event::Pair {
                shadow,
                agreed,
                confident,
            } => s
                .pairs_mut(&format!("s{shadow}"))
                .record_pair(agreed, confident),
            Event::Drop { shadow } => s.pairs_mut(&format!("s{shadow}")).record_drop(),
        }
    }
    s
}

proptest! {
    #[test]
    fn merge_of_replicas_equals_snapshot_of_the_union(a in proptest::collection::vec(event(), 0..80),
                                                      b in proptest::collection::vec(event(), 0..80)) {
        let union: Vec<Event> = a.iter().chain(b.iter()).cloned().collect();
        prop_assert_eq!(Snapshot::merged([&record(&a), &record(&b)]), record(&union));
    }

    #[test]
    fn merge_is_commutative(a in proptest::collection::vec(event(), 0..60),
                            b in proptest::collection::vec(event(), 0..60)) {
        prop_assert_eq!(Snapshot::merged([&record(&a), &record(&b)]), Snapshot::merged([&record(&b), &record(&a)]));
    }

    #[test]
    fn window_is_later_minus_earlier(a in proptest::collection::vec(event(), 0..80),
                                     b in proptest::collection::vec(event(), 0..80)) {
        let earlier = record(&a);
        let both: Vec<Event> = a.iter().chain(b.iter()).cloned().collect();
        let later = record(&both);
        let window = later.window_since(&earlier).expect("counters only grow");
        // Revisions untouched in the window appear with zero counts; compare
        // against the events of the window alone, padded the same way.
        let mut expected = record(&b);
        for id in earlier.revisions().keys() { expected.revision_mut(id); }
        for id in earlier.pairs().keys() { expected.pairs_mut(id); }
        prop_assert_eq!(window, expected);
    }

    #[test]
    fn no_rate_is_ever_above_one(a in proptest::collection::vec(event(), 0..120),
                                 b in proptest::collection::vec(event(), 0..120)) {
        let later = record(&[a.clone(), b].concat());
        for snap in [record(&a), later.window_since(&record(&a)).expect("grows")] {
            for s in snap.revisions().values() {
                if let Some(r) = s.error_rate() { prop_assert!((0.0..=1.0).contains(&r)); }
            }
        }
    }

    #[test]
    fn json_round_trip_is_exact(a in proptest::collection::vec(event(), 0..80)) {
        let s = record(&a);
        let json = serde_json::to_string(&s).expect("serialise");
        prop_assert_eq!(serde_json::from_str::<Snapshot>(&json).expect("parse"), s);
    }
}

#[test]
fn snapshot_with_more_failures_than_requests_is_rejected() {
    let json = r#"{"revisions":{"r":{"requests":10,"failures":{"upstream_5xx":11}}}}"#;
    let err = serde_json::from_str::<Snapshot>(json).expect_err("invalid");
    assert!(
        err.to_string()
            .contains("failures (11) exceeds requests (10)"),
        "{err}"
    );
}

/// The same check on construction: no `RevisionStats` holds more failures
/// than requests, so no rate built from one exceeds 1.
#[test]
fn stats_built_with_more_failures_than_requests_are_refused() {
    let mut failures = FailureCounts::default();
    failures.add(FailureClass::Timeout, 3);
    let build = |requests| {
        RevisionStats::from_parts(
            requests,
            failures,
            0,
            LatencyHistogram::default(),
            BTreeMap::new(),
        )
    };
    let err = build(2).expect_err("inconsistent");
    assert!(
        err.to_string()
            .contains("failures (3) exceeds requests (2)"),
        "{err}"
    );
    let all_failed = build(3).expect("consistent");
    assert_eq!(all_failed.error_rate(), Some(1.0));
}

#[test]
fn pairs_with_more_flips_than_disagreements_are_rejected() {
    let json = r#"{"pairs":{"s":{"pairs":10,"agreements":10,"champion_confident":5,"confident_flips":1}}}"#;
    assert!(serde_json::from_str::<Snapshot>(json).is_err());
}

#[test]
fn window_after_gateway_restart_is_a_counter_reset() {
    let mut before = Snapshot::default();
    for _ in 0..5 {
        before
            .revision_mut("r")
            .record_failure(FailureClass::Timeout);
    }
    let mut after = Snapshot::default();
    after
        .revision_mut("r")
        .record_failure(FailureClass::Timeout);
    assert!(matches!(
        after.window_since(&before),
        Err(SnapshotError::CounterReset { .. })
    ));
    assert!(matches!(
        Snapshot::default().window_since(&before),
        Err(SnapshotError::CounterReset { .. })
    ));
}

/// The field bug: errors and totals read at two instants gave 1.0016 for
/// a candidate failing every request. From one snapshot it is exactly 1.
#[test]
fn error_ratio_of_an_always_failing_candidate_is_exactly_one() {
    let mut gateway = Snapshot::default();
    let mut snapshots = Vec::new();
    for tick in 0..10 {
        for _ in 0..(37 + tick) {
            gateway
                .revision_mut("cand")
                .record_failure(FailureClass::Upstream5xx);
        }
        snapshots.push(gateway.clone());
    }
    for pair in snapshots.windows(2) {
        let window = pair[1].window_since(&pair[0]).expect("grows");
        assert_eq!(window.revision("cand").error_rate(), Some(1.0));
    }
    assert_eq!(gateway.revision("cand").error_rate(), Some(1.0));
}

#[test]
fn client_errors_are_not_requests_of_the_revision() {
    let mut s = RevisionStats::default();
    s.record_client_error();
    s.record_client_error();
    s.record_success(1000, ["a"]);
    assert_eq!(s.requests(), 1);
    assert_eq!(s.client_errors(), 2);
    assert_eq!(s.error_rate(), Some(0.0));
}
