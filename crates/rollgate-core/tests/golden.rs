//! rollgate's beta-binomial mixture against the authors' reference
//! implementation: values written by `bench/golden/confseq_vectors.py`
//! (confseq 0.0.11), compared here without Python.

use rollgate_core::anytime::BetaBinomialMixture;
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    beta_binomial_log_mixture: Vec<MixtureCase>,
    beta_binomial_mixture_bound: Vec<BoundCase>,
}

#[derive(Deserialize)]
struct MixtureCase {
    s: f64,
    v: f64,
    v_opt: f64,
    g: f64,
    h: f64,
    alpha_opt: f64,
    one_sided: bool,
    value: f64,
}

#[derive(Deserialize)]
struct BoundCase {
    v: f64,
    alpha: f64,
    v_opt: f64,
    g: f64,
    h: f64,
    alpha_opt: f64,
    one_sided: bool,
    bound: f64,
}

fn golden() -> Golden {
    serde_json::from_str(include_str!("data/confseq_golden.json")).expect("golden file parses")
}

#[test]
fn mixture_values_match_confseq() {
    let g = golden();
    assert!(g.beta_binomial_log_mixture.len() >= 500);
    for c in &g.beta_binomial_log_mixture {
        let m = BetaBinomialMixture::new(c.v_opt, c.alpha_opt, c.g, c.h, c.one_sided);
        let ours = m.log_value(c.s, c.v);
        let tolerance = 1e-7 * c.value.abs().max(1.0);
        assert!(
            (ours - c.value).abs() <= tolerance,
            "s={} v={} v_opt={} g={} one_sided={}: ours {ours}, confseq {}",
            c.s,
            c.v,
            c.v_opt,
            c.g,
            c.one_sided,
            c.value
        );
    }
}

/// Whether our mixture crosses `ln(1/alpha)` within a hundredth of an
/// observation of confseq's boundary `bound` (a sum `s`, signed: negative
/// for the boundary below). The gates decide by the mixture's value
/// (`log_value_counts` against the threshold), so this checks what they
/// use. A boundary at the largest possible sum `edge` means the mixture
/// never crosses there.
fn crosses_at(m: &BetaBinomialMixture, v: f64, alpha: f64, bound: f64, edge: f64) -> bool {
    let threshold = (1.0 / alpha).ln();
    let towards_zero = -bound.signum() * 0.011;
    let inside = m.log_value(bound + towards_zero, v) < threshold;
    let at_edge = (bound - edge).abs() <= 1e-6 * edge.abs().max(1.0);
    inside && (at_edge || m.log_value(bound - towards_zero, v) >= threshold)
}

#[test]
fn boundaries_match_confseq_within_a_hundredth_of_an_observation() {
    let g = golden();
    assert!(g.beta_binomial_mixture_bound.len() >= 200);
    for c in &g.beta_binomial_mixture_bound {
        let m = BetaBinomialMixture::new(c.v_opt, c.alpha_opt, c.g, c.h, c.one_sided);
        assert!(
            crosses_at(&m, c.v, c.alpha, c.bound, c.v / c.g),
            "v={} alpha={} g={} one_sided={}: confseq {}",
            c.v,
            c.alpha,
            c.g,
            c.one_sided,
            c.bound
        );
    }
}

/// The two-sided mixture is symmetric under `(g, h, s) → (h, g, −s)`, so
/// its lower boundary is confseq's upper boundary with `g` and `h` swapped.
#[test]
fn lower_boundaries_match_confseq_by_symmetry() {
    let g = golden();
    let mut checked = 0;
    for c in g
        .beta_binomial_mixture_bound
        .iter()
        .filter(|c| !c.one_sided)
    {
        let Some(swapped) = g.beta_binomial_mixture_bound.iter().find(|d| {
            !d.one_sided
                && (d.g - c.h).abs() < 1e-12
                && (d.v - c.v).abs() < 1e-9 * c.v.max(1.0)
                && (d.v_opt - c.v_opt).abs() < 1e-9 * c.v_opt.max(1.0)
                && d.alpha == c.alpha
                && d.alpha_opt == c.alpha_opt
        }) else {
            continue;
        };
        let m = BetaBinomialMixture::new(c.v_opt, c.alpha_opt, c.g, c.h, false);
        assert!(
            crosses_at(&m, c.v, c.alpha, -swapped.bound, -c.v / c.h),
            "g={} v={}: confseq (swapped) {}",
            c.g,
            c.v,
            swapped.bound
        );
        checked += 1;
    }
    assert!(checked >= 50, "{checked}");
}
