//! The traffic models against the distributions they stand for.

use rand::SeedableRng;
use rollgate_core::{LatencyHistogram, RevisionStats};

use super::{LatencyModel, bucket};
use crate::draw::Rng;
use crate::users::UnitAcc;

#[test]
fn latency_model_matches_the_lognormal_quantiles() {
    let t = LatencyModel::lognormal(20_000.0, 0.25);
    let mut rng = Rng::seed_from_u64(5);
    let mut few = RevisionStats::default();
    for _ in 0..2_000 {
        t.record(&mut rng, &mut few, 10, 1.0, &mut UnitAcc::new());
    }
    let mut many = RevisionStats::default();
    t.record(&mut rng, &mut many, 200_000, 1.0, &mut UnitAcc::new());
    for (stats, n) in [(few, 20_000), (many, 200_000)] {
        assert_eq!(stats.requests(), n);
        for (p, z) in [(0.05, -1.6449), (0.5, 0.0), (0.95, 1.6449), (0.99, 2.3263)] {
            let want = 20_000.0 * (0.25f64 * z).exp();
            let got = stats.latency().percentile_us(p).expect("samples") as f64;
            // Within the histogram's 1% buckets and the sampling error.
            assert!((got / want - 1.0).abs() < 0.02, "p{p}: {got} vs {want}");
        }
    }
    let mut point = RevisionStats::default();
    LatencyModel::lognormal(20_000.0, 0.0).record(
        &mut rng,
        &mut point,
        100,
        1.0,
        &mut UnitAcc::new(),
    );
    let range = LatencyHistogram::equivalent_range(20_000);
    assert_eq!(point.latency().buckets(), vec![(*range.end(), 100)]);
}

#[test]
fn sticky_buckets_are_stable_and_spread() {
    assert_eq!(bucket(42, 7), bucket(42, 7));
    let below: usize = (0..10_000u64).filter(|&k| bucket(k, 7) < 1000).count();
    assert!((800..1200).contains(&below), "{below}");
}
