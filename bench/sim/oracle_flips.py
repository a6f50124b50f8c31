#!/usr/bin/env python3
"""The fewest mirrored pairs any test could need to refuse the broken feature.

`broken-feature` (bench/sim/scenarios.toml): half the mirrored pairs are
ones the champion is confident on, and the candidate flips 12% of those
against a budget of 2%. An SPRT that *knows* the alternative (12%) is the
most efficient test there is for it; at the per-metric level rollgate's
sequential policy gives the flip test (α = 0.01 over four metrics:
errors, latency, agreement, flips), this prints its median number of
mirrored pairs to a rejection. No anytime-valid test that must also
reject other alternatives can beat it by much.

    python3 bench/sim/oracle_flips.py          # 2,000 runs, seed 1
"""
import math
import random
import statistics

ALPHA = 0.01 / 4
CONFIDENT, FLIP, BUDGET = 0.5, 0.12, 0.02


def pairs_to_reject(rng: random.Random) -> int:
    up, down = math.log(FLIP / BUDGET), math.log((1 - FLIP) / (1 - BUDGET))
    llr, pairs = 0.0, 0
    while llr < math.log(1 / ALPHA) and pairs < 10_000:
        pairs += 1
        if rng.random() < CONFIDENT:
            llr += up if rng.random() < FLIP else down
    return pairs


def main() -> None:
    rng = random.Random(1)
    runs = [pairs_to_reject(rng) for _ in range(2000)]
    print(f"oracle SPRT at alpha {ALPHA}: median {statistics.median(runs)} mirrored pairs, "
          f"mean {statistics.mean(runs):.1f} (2,000 runs)")


if __name__ == "__main__":
    main()
