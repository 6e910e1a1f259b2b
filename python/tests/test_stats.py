"""The lab's statistics against known answers (pure: no CLI)."""

import math

import numpy as np
import pandas as pd
import pytest

from preheat_lab import stats


def test_median_ci_of_1_to_100_is_ranks_40_and_61():
    # The classic distribution-free 95% CI of the median for n = 100 is (x(40), x(61)).
    v = list(range(1, 101))
    assert stats.quantile_ci(v, 0.5) == (50, 40, 61)


def test_p99_ci_of_1_to_100():
    # n*q = 99, half width 1.96*sqrt(0.99) = 1.95: ranks floor(97.05) = 97 and ceil(100.95)+1
    # = 102, clamped to n.
    assert stats.quantile_ci(list(range(1, 101)), 0.99) == (99, 97, 100)


def test_same_answers_as_the_rust_unit_test():
    # crates/preheat-model/src/stats.rs: median_and_ci_bracket_the_truth
    s = stats.summarize(range(1, 102))
    assert s.p50 == 51
    assert s.p50_lo < 51 < s.p50_hi
    assert s.p50_lo >= 40 and s.p50_hi <= 62
    assert (s.min, s.max) == (1, 101)
    assert s.p99 >= 100


def test_empty_and_single():
    assert stats.summarize([]).n == 0
    assert all(math.isnan(x) for x in stats.quantile_ci([], 0.5))
    s = stats.summarize([3.0])
    assert (s.p50, s.p99, s.p50_lo, s.p50_hi, s.mean, s.mean_lo, s.mean_hi) == (3, 3, 3, 3, 3, 3, 3)


def test_nan_and_none_are_dropped():
    s = stats.summarize([1.0, None, float("nan"), 3.0, float("inf")])
    assert s.n == 2 and s.mean == 2.0


def test_bootstrap_mean_ci_matches_the_normal_interval():
    v = np.arange(1, 101, dtype=float)  # mean 50.5, sd 29.01: ±5.69
    m, lo, hi = stats.mean_ci_bootstrap(v)
    mt, lot, hit = stats.mean_ci_t(v)
    assert m == mt == 50.5
    assert abs(lo - lot) < 0.6 and abs(hi - hit) < 0.6
    assert lo < 50.5 < hi
    # deterministic: same data, same interval
    assert stats.mean_ci_bootstrap(v) == (m, lo, hi)


def test_overhead_removed_arithmetic():
    assert stats.overhead_removed(cold=200, warm=100, mode=120) == pytest.approx(0.8)
    assert stats.overhead_removed(200, 100, 100) == 1.0
    assert stats.overhead_removed(200, 100, 200) == 0.0
    assert stats.overhead_removed(200, 100, 250) == pytest.approx(-0.5)
    assert math.isnan(stats.overhead_removed(100, 100, 90))  # no overhead: undefined
    assert math.isnan(stats.overhead_removed(90, 100, 90))


def _rounds(values_by_mode, rounds=40, noise=0.0, seed=1):
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(rounds):
        for m, v in values_by_mode.items():
            rows.append({"round": r, "mode": m, "latency_us": v + noise * rng.standard_normal()})
    return pd.DataFrame(rows)


def test_paired_bootstrap_collapses_on_constant_data():
    df = _rounds({"warm": 20.0, "cold-sweep": 120.0, "preheat:lines": 70.0})
    modes = ["warm", "cold-sweep", "preheat:lines"]
    mat, rounds = stats.round_matrix(df, modes)
    assert mat.shape == (40, 3) and len(rounds) == 40
    for st in ("mean", "p50", "p99"):
        res = stats.paired_bootstrap(mat, modes, {"s": stats.share_fn("cold-sweep", "warm", "preheat:lines"),
                                                  "d": stats.diff_fn("cold-sweep", "warm")}, st, boot=200)
        assert res["s"].value == pytest.approx(0.5)
        assert res["s"].lo == pytest.approx(0.5) and res["s"].hi == pytest.approx(0.5)
        assert res["d"].value == pytest.approx(100.0)
        assert res["s"].undefined_share == 0


def test_paired_bootstrap_interval_covers_the_truth_about_95_percent_of_the_time():
    # 60 synthetic experiments (100 rounds, sd 5 µs per request): the true share is 0.5; a 95%
    # interval must cover it in roughly 95% of them (binomial: 51..60 is a generous band) and
    # must not be absurdly wide.
    modes = ["warm", "cold-sweep", "preheat:lines"]
    fn = {"s": stats.share_fn("cold-sweep", "warm", "preheat:lines")}
    covered, widths = 0, []
    for seed in range(60):
        df = _rounds({"warm": 20.0, "cold-sweep": 120.0, "preheat:lines": 70.0}, rounds=100,
                     noise=5.0, seed=seed)
        mat, _ = stats.round_matrix(df, modes)
        res = stats.paired_bootstrap(mat, modes, fn, "mean", boot=400, seed=seed)["s"]
        covered += res.lo <= 0.5 <= res.hi
        widths.append(res.hi - res.lo)
    assert 51 <= covered <= 60, covered
    # SE of the share here is about 0.0071: a 95% interval is about 0.028 wide
    assert 0.015 < float(np.median(widths)) < 0.045


def test_share_undefined_when_there_is_no_overhead():
    df = _rounds({"warm": 100.0, "cold-sweep": 100.0, "preheat:lines": 90.0}, noise=0.0)
    modes = ["warm", "cold-sweep", "preheat:lines"]
    mat, _ = stats.round_matrix(df, modes)
    res = stats.paired_bootstrap(mat, modes, {"s": stats.share_fn("cold-sweep", "warm", "preheat:lines")},
                                 "p50", boot=100)["s"]
    assert math.isnan(res.value) and res.undefined_share == 1.0


def test_bootstrap_p50_uses_the_same_order_statistic():
    # An even number of rounds: the median is the ceil(n/2)-th value, not the mean of two.
    df = pd.DataFrame({"round": [0, 1, 2, 3], "mode": ["a"] * 4, "latency_us": [1.0, 2.0, 3.0, 4.0]})
    mat, _ = stats.round_matrix(df, ["a"])
    res = stats.paired_bootstrap(mat, ["a"], {"a": lambda s: s["a"]}, "p50", boot=50)
    assert res["a"].value == 2.0
    st = stats._stat_axis1(mat[None, :, :], "p50")
    assert st[0, 0] == 2.0
