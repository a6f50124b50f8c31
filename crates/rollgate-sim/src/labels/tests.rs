use super::*;

fn cell(accuracy: (f64, f64)) -> LabelCell {
    LabelCell {
        name: "t".into(),
        expect: Expect::Stop,
        rate: 5.0,
        positive_rate: 0.5,
        accuracy: Some(accuracy),
        mistakes: None,
        overlap: 0.8,
        labels: vec![LabelRule {
            shown: None,
            truth: None,
            right: None,
            arm: None,
            p: 1.0,
            delay: LabelDelay::Exponential { mean_s: 30.0 },
        }],
        key_spread: 0.0,
        key_labelling: 0.0,
        shadow: true,
        window_s: 1200,
        look_every_s: 5,
        quality: QualityOverride::default(),
    }
}

fn plan() -> Plan {
    let mut plan = Plan::default();
    plan.gates.shadow.min_agreement = 0.0;
    plan.gates.shadow.max_flip_rate = 1.0;
    plan.gates.quality.enabled = true;
    plan.gates.quality.label_window = Some(Duration::from_secs(200));
    plan
}

#[test]
fn a_candidate_much_worse_on_labels_is_refused_and_the_draws_match_the_cell() {
    let r = simulate_labels(&plan(), &cell((0.85, 0.6)), 1);
    assert_eq!(r.outcome, LabelOutcome::Refused, "{r:?}");
    let mut rng = StdRng::seed_from_u64(3);
    let c = cell((0.85, 0.80));
    let (mut h, mut k, mut one) = (0, 0, 0);
    for i in 0..100_000 {
        let positive = i % 2 == 0;
        let (a, b) = answers(&mut rng, &c, positive, 1.0);
        h += u32::from(a == positive);
        k += u32::from(b == positive);
        one +=
            u32::from(a != positive && b == positive) + u32::from(a == positive && b != positive);
    }
    assert!((f64::from(h) / 1e5 - 0.85).abs() < 0.01);
    assert!((f64::from(k) / 1e5 - 0.80).abs() < 0.01);
    assert!((f64::from(one) / 1e5 - c.discordant()).abs() < 0.01);
}

#[test]
fn a_label_process_takes_the_first_rule_that_matches_what_users_saw() {
    // Fraud: flagged answers reviewed in 3 s, passed frauds charged back
    // at 120 s, passed legitimate ones never labelled.
    let mut c = cell((0.85, 0.85));
    let fixed = |s| LabelDelay::Fixed { s };
    c.labels = vec![
        LabelRule {
            shown: Some("1".into()),
            truth: None,
            right: None,
            arm: None,
            p: 1.0,
            delay: fixed(3.0),
        },
        LabelRule {
            shown: None,
            truth: Some("1".into()),
            right: None,
            arm: None,
            p: 1.0,
            delay: fixed(120.0),
        },
    ];
    let mut rng = StdRng::seed_from_u64(1);
    let at = |rng: &mut StdRng, shown, positive| {
        label_comes(rng, &c, (shown, positive, Arm::Champion), (0, 1.0))
    };
    assert_eq!(at(&mut rng, true, false), Some(3_000));
    assert_eq!(at(&mut rng, true, true), Some(3_000));
    assert_eq!(at(&mut rng, false, true), Some(120_000));
    assert_eq!(at(&mut rng, false, false), None);
}

#[test]
fn with_a_watch_a_run_goes_on_past_promotion_and_the_watch_decides() {
    let mut plan = plan();
    plan.gates.quality.in_stages = false;
    plan.watch.window = Duration::from_secs(900);
    plan.min_stage_duration = Duration::from_secs(30);
    let long = |accuracy| LabelCell {
        window_s: 3000,
        ..cell(accuracy)
    };
    let r = simulate_labels(&plan, &long((0.85, 0.6)), 1);
    assert_eq!(r.outcome, LabelOutcome::Refused, "{r:?}");
    let r = simulate_labels(&plan, &long((0.85, 0.85)), 2);
    assert_eq!(r.outcome, LabelOutcome::Passed, "{r:?}");
    // At the watch's end, not when SHADOW passed.
    assert!(r.seconds >= 900, "{r:?}");
}
