//! Per-thread memos of integer boundaries by sample size.
//!
//! Several bounds the gates read on every look depend, for fixed settings,
//! on the sample size alone: the ranks bounding a quantile, the count at
//! which a one-sided rate test rejects. The same sizes recur on every look
//! of every rollout (and of every simulated one), and each costs a search
//! over incomplete-beta or log-gamma evaluations, so they are computed once
//! per thread. These are caches of pure functions: results are identical
//! with or without them.

use std::cell::RefCell;

/// Sample sizes below this are memoised: at most 2 MiB per setting.
const SIZES: u64 = 1 << 18;
/// Settings kept per thread; a new one beyond this clears the memo, so a
/// long-running controller with many plans holds at most 32 MiB a thread.
const SETTINGS: usize = 16;
/// A slot not yet computed (values are below 2^18 + 1).
const UNSET: [u32; 2] = [u32::MAX; 2];

/// A setting and its two values per sample size.
type Memo = ([u64; 4], Vec<[u32; 2]>);

thread_local! {
    /// A handful of settings are live at once (one per quantile and level),
    /// so a list searched in order beats hashing the key on every look.
    static MEMO: RefCell<Vec<Memo>> = Default::default();
}

/// `compute()` for sample size `n` under `key`, memoised. Both values
/// must be below 2^18 + 1 (they are counts or ranks of at most `n`).
fn by_size(key: [u64; 4], n: u64, compute: impl FnOnce() -> [u32; 2]) -> [u32; 2] {
    if n >= SIZES {
        return compute();
    }
    let slot = n as usize;
    let hit = MEMO.with_borrow(|m| {
        m.iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.get(slot).copied())
    });
    if let Some(hit) = hit.filter(|&h| h != UNSET) {
        return hit;
    }
    let value = compute();
    MEMO.with_borrow_mut(|m| {
        let at = match m.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                if m.len() >= SETTINGS {
                    m.clear();
                }
                m.push((key, Vec::new()));
                m.len() - 1
            }
        };
        let v = &mut m[at].1;
        if v.len() <= slot {
            v.resize(slot + 1, UNSET);
        }
        v[slot] = value;
    });
    value
}

/// `0` for `None`, else the value.
fn encode(x: Option<u64>) -> u32 {
    x.map_or(0, |x| x as u32)
}

fn decode(x: u32) -> Option<u64> {
    (x > 0).then_some(u64::from(x))
}

/// A quantile's rank interval at sample size `n`, as `(lower, upper)`
/// 1-based ranks (`None`: that side is not bounded).
pub(crate) fn ranks(
    key: [u64; 3],
    n: u64,
    compute: impl FnOnce() -> (Option<u64>, Option<u64>),
) -> (Option<u64>, Option<u64>) {
    let [lower, upper] = by_size([0, key[0], key[1], key[2]], n, || {
        let (lower, upper) = compute();
        [encode(lower), encode(upper)]
    });
    (decode(lower), decode(upper))
}

/// A count threshold at sample size `n` (`None`: never reached).
pub(crate) fn threshold(
    key: [u64; 3],
    n: u64,
    compute: impl FnOnce() -> Option<u64>,
) -> Option<u64> {
    // Stored plus one, so that a threshold of 0 is not `None`.
    let [t, _] = by_size([1, key[0], key[1], key[2]], n, || {
        [encode(compute().map(|t| t + 1)), 0]
    });
    decode(t).map(|t| t - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_is_transparent_across_evictions_and_large_sizes() {
        let compute = |k: u64, n: u64| (Some(k + 1), (n > 3).then(|| n - 1));
        for round in 0..2 {
            // More settings than a thread keeps: later ones evict earlier.
            for k in 0..(SETTINGS as u64 + 4) {
                for n in [0, 1, 5, 1_000, SIZES - 1, SIZES, SIZES + 7] {
                    let got = ranks([k, 7, round], n, || compute(k, n));
                    assert_eq!(got, compute(k, n), "setting {k}, n {n}");
                    // A hit returns what was stored, not a new computation.
                    let again = ranks([k, 7, round], n, || (None, None));
                    if n < SIZES {
                        assert_eq!(again, compute(k, n));
                    }
                }
            }
        }
        assert_eq!(threshold([1, 2, 3], 10, || Some(0)), Some(0));
        assert_eq!(threshold([1, 2, 3], 10, || None), Some(0));
        assert_eq!(threshold([1, 2, 4], 10, || None), None);
    }
}
