#!/usr/bin/env python3
"""Reference values for rollgate's anytime-valid bounds, from `confseq`.

`confseq` (Howard, Waudby-Smith & Ramdas) is the authors' own implementation
of the boundaries rollgate's sequential policy uses. This script evaluates
its beta-binomial mixture (value and boundary) on a fixed grid and writes
them to `crates/rollgate-core/tests/data/confseq_golden.json`; the Rust test
`crates/rollgate-core/tests/golden.rs` compares against that file, so CI
needs no Python.

Run (once, when the bounds change):

    pip install pybind11 scikit-build cmake ninja numpy scipy setuptools wheel
    pip download confseq==0.0.11 --no-deps --no-build-isolation -d /tmp/confseq
    tar xzf /tmp/confseq/confseq-0.0.11.tar.gz -C /tmp/confseq
    pip install --no-build-isolation --no-deps /tmp/confseq/confseq-0.0.11
    python3 bench/golden/confseq_vectors.py

(confseq 0.0.11 ships only a source archive whose build pins pybind11 2.6,
which does not compile against Python 3.11; building without isolation uses
the current pybind11, with libboost-dev installed.)
"""

import itertools
import json
import math
import pathlib

from confseq import boundaries

OUT = pathlib.Path(__file__).resolve().parents[2] / "crates/rollgate-core/tests/data/confseq_golden.json"


def main() -> None:
    log_mixture = []
    bound = []
    rates = [0.02, 0.05, 0.1, 0.5, 0.9, 0.95]
    sizes = [5, 20, 100, 1000, 20000]
    for p, n, n_opt, alpha_opt, one_sided in itertools.product(
        rates, sizes, [30, 300], [0.001, 0.01], [False, True]
    ):
        g, h = p, 1.0 - p
        v, v_opt = g * h * n, g * h * n_opt
        # Sums from a deficit to an excess of observations.
        for k in sorted({0, 1, round(n * p), min(n, round(n * p + 2 * math.sqrt(n) + 1)), n}):
            s = k - n * p
            value = boundaries.beta_binomial_log_mixture(s, v, v_opt, g, h, alpha_opt, one_sided)
            if math.isfinite(value):
                log_mixture.append(dict(s=s, v=v, v_opt=v_opt, g=g, h=h, alpha_opt=alpha_opt,
                                        one_sided=one_sided, value=value))
        for alpha in [0.001, 0.01]:
            b = boundaries.beta_binomial_mixture_bound(v, alpha, v_opt, g, h, alpha_opt, one_sided)
            bound.append(dict(v=v, alpha=alpha, v_opt=v_opt, g=g, h=h, alpha_opt=alpha_opt,
                              one_sided=one_sided, bound=b))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "source": "confseq 0.0.11 (https://github.com/gostevehoward/confseq), boundaries module",
        "beta_binomial_log_mixture": log_mixture,
        "beta_binomial_mixture_bound": bound,
    }, indent=1) + "\n")
    print(f"wrote {len(log_mixture)} mixture values and {len(bound)} bounds to {OUT}")


if __name__ == "__main__":
    main()
