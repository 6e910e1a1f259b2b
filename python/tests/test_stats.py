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


def test_bootstrap_mean_ci_matches_the_t_interval_for_large_n():
    v = np.arange(1, 101, dtype=float)  # mean 50.5, sd 29.01: ±1.984·2.901 = ±5.76
    m, lo, hi = stats.mean_ci_bootstrap(v)
    mt, lot, hit = stats.mean_ci_t(v)
    assert m == mt == 50.5
    assert hit - mt == pytest.approx(stats.t975(99) * np.std(v, ddof=1) / 10)
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


# ---------------------------------------------------------------------------------------------
# Student-t intervals


@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (4, 2.776), (5, 2.571), (10, 2.228),
                                   (20, 2.086), (30, 2.042), (40, 2.021), (60, 2.000),
                                   (120, 1.980), (1000, 1.962)])
def test_t975_known_values(df, t):
    assert stats.t975(df) == pytest.approx(t, abs=5e-4)


def test_t975_fractional_df_continuity_and_limits():
    # Reference values (mpmath, regularized incomplete beta): Welch gives fractional df.
    assert stats.t975(1.5) == pytest.approx(6.0166631, abs=1e-6)
    assert stats.t975(2.5) == pytest.approx(3.5746548, abs=1e-6)
    assert stats.t975(7.5) == pytest.approx(2.3330396, abs=1e-6)
    assert stats.t975(29.5) == pytest.approx(2.0437250, abs=1e-6)
    # The exact CDF agrees with the table; Cornish-Fisher agrees with it where they meet.
    for df in range(1, 31):
        assert stats.t_sf(stats.T975_TABLE[df - 1], df) == pytest.approx(0.025, abs=1e-7)
    for df in (10, 20, 30):
        assert stats._cornish_fisher_975(df) == pytest.approx(stats.t975(df), rel=1e-5)
    grid = [1 + 0.25 * k for k in range(200)] + [60, 120, 1e4]
    vals = [stats.t975(d) for d in grid]
    assert all(a > b for a, b in zip(vals, vals[1:]))  # decreasing in df, no jump at 30
    assert stats.t975(30.0001) == pytest.approx(stats.t975(30), abs=1e-5)
    assert stats.t975(math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert math.isnan(stats.t975(0)) and math.isnan(stats.t975(math.nan))
    assert stats.t975(0.5) > stats.t975(1)


def test_mean_ci_t_is_the_student_interval():
    m, lo, hi = stats.mean_ci_t([1, 2, 3, 4, 5])  # s = 1.5811, s/√5 = 0.7071, t_4 = 2.7764
    assert m == 3 and hi - m == pytest.approx(2.776445 * 0.7071068, rel=1e-6)
    assert m - lo == pytest.approx(hi - m)
    assert stats.mean_ci_t([2.0]) == (2.0, 2.0, 2.0)
    assert all(math.isnan(x) for x in stats.mean_ci_t([]))


def test_mean_ci_t_covers_95_percent_at_n_3():
    rng = np.random.default_rng(7)
    covered = sum(lo <= 0 <= hi for _, lo, hi in
                  (stats.mean_ci_t(rng.normal(0, 1, 3)) for _ in range(2000)))
    assert 0.93 <= covered / 2000 <= 0.97, covered


def test_welch_diff_ci_known_answer():
    # s_a² = 2.5 (n 5), s_b² = 14 (n 6): se = √(0.5 + 2.3333) = 1.68325, Welch df = 6.9723,
    # t = 2.36652: −4 ± 3.98347 (reference: mpmath).
    r = stats.welch_diff_ci([1, 2, 3, 4, 5], [2, 4, 6, 8, 10, 12])
    assert r.value == -4 and (r.n_a, r.n_b) == (5, 6)
    assert r.df == pytest.approx(6.972256, abs=1e-5) and r.se == pytest.approx(1.683251, abs=1e-6)
    assert r.lo == pytest.approx(-7.983469, abs=1e-5) and r.hi == pytest.approx(-0.016531, abs=1e-5)
    assert r.excludes_zero()
    pct = r.scaled(7.0)
    assert (pct.value, pct.lo, pct.hi) == pytest.approx((-4 / 7, r.lo / 7, r.hi / 7))
    # Too few values: no interval; constant samples: a zero-width one.
    one = stats.welch_diff_ci([1.0], [2.0, 3.0])
    assert one.value == -1.5 and math.isnan(one.lo) and not one.excludes_zero()
    const = stats.welch_diff_ci([2.0, 2.0, 2.0], [1.0, 1.0])
    assert (const.value, const.lo, const.hi) == (1.0, 1.0, 1.0) and const.excludes_zero()


def test_welch_interval_excludes_zero_about_5_percent_without_a_difference():
    # n = 5 normal samples per side, no true difference: the 95% interval must exclude 0 in
    # about 5% of the trials (the normal approximation ±1.96·se did in ~10%).
    rng = np.random.default_rng(20161121)
    hits = sum(stats.welch_diff_ci(rng.normal(0, 1, 5), rng.normal(0, 1, 5)).excludes_zero()
               for _ in range(2000))
    assert 0.02 <= hits / 2000 <= 0.09, hits
    # Unequal sizes and variances (Welch's case): still about 5%.
    hits = sum(stats.welch_diff_ci(rng.normal(0, 1, 3), rng.normal(0, 3, 8)).excludes_zero()
               for _ in range(2000))
    assert 0.02 <= hits / 2000 <= 0.09, hits


def test_paired_t_ci():
    r = stats.paired_t_ci([1, 2, 3, 4, None], [0, 0, 1, 1, 5])  # differences 1 2 2 3
    assert (r.value, r.df, r.n_a) == (2.0, 3.0, 4)
    assert r.hi - 2 == pytest.approx(3.182446 * 0.8164966 / 2, rel=1e-6)
    with pytest.raises(ValueError):
        stats.paired_t_ci([1, 2], [1])
    assert math.isnan(stats.paired_t_ci([1.0], [0.0]).lo)


def test_share_ci_fieller():
    # Constant samples: the share exactly, a zero-width interval.
    r = stats.share_ci([95.0] * 4, [80.0] * 4, [100.0] * 4)
    assert (r.value, r.lo, r.hi) == pytest.approx((0.75, 0.75, 0.75))
    # No gap between base and ref (beyond the noise): unbounded, so no interval.
    rng = np.random.default_rng(3)
    r = stats.share_ci(rng.normal(95, 2, 5), rng.normal(100, 2, 5), rng.normal(100.5, 2, 5))
    assert math.isnan(r.lo) and math.isnan(r.hi)
    # Coverage: true share 0.75, n = 5 per sample, sd 2 on a gap of 20: about 95%; the
    # interval is asymmetric (Fieller), wider towards the side of the noisier ratio.
    covered, n = 0, 1000
    for _ in range(n):
        s = stats.share_ci(rng.normal(95, 2, 5), rng.normal(80, 2, 5), rng.normal(100, 2, 5))
        covered += s.lo <= 0.75 <= s.hi
    assert 0.92 <= covered / n <= 0.98, covered
