"""Statistics for the lab: the same order-statistic confidence intervals as the Rust side
(`crates/preheat-model/src/stats.rs`), bootstrap intervals for means, and a paired bootstrap
over measurement rounds for derived quantities (differences and shares of the cold overhead).

Conventions (identical to `stats.rs`):

* the `q` quantile of an ascending sample of `n` values is the `ceil(n*q)`-th smallest value
  (1-based), so the median of 1..100 is 50 and its p99 is 99;
* its 95% confidence interval is the pair of order statistics at ranks
  `floor(n*q - 1.96*sqrt(n*q*(1-q)))` and `ceil(n*q + 1.96*sqrt(n*q*(1-q))) + 1`, clamped to
  `1..n` (the binomial distribution of order statistics, normal approximation: no assumption
  about the latency distribution). For the median of 1..100 that is (40, 61).

Means get a percentile-bootstrap interval (resampling the values), derived quantities a
percentile bootstrap over *rounds*: a round measured every mode once in shuffled order, so
resampling whole rounds keeps the pairing between modes (what drifted during one round drifted
for all its modes).

For few samples (n < ~20) the bootstrap is too narrow (it covers ~85% at n = 5): there the
Student-t intervals below are the right tool. `t975(df)` is the 0.975 quantile of Student's t
(an exact table for df 1..30, the Cornish-Fisher expansion beyond, and for a fractional df —
the Welch–Satterthwaite df — Newton's method on the t CDF, computed from the regularized
incomplete beta function); `mean_ci_t` is the t-interval of a mean, `welch_diff_ci` of a
difference of two means (unequal variances), `paired_t_ci` of a mean paired difference and
`share_ci` Fieller's interval of a ratio of two such differences (the share of a gap covered).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Union

import numpy as np

if TYPE_CHECKING:  # pandas is imported where it is used: stats works without it
    import pandas as pd

#: What the statistics take: a sequence of numbers or a NumPy array of them.
Floats = Union[Sequence[float], np.ndarray]

Z95 = 1.96
DEFAULT_BOOT = 2000
DEFAULT_SEED = 20161121  # fixed: the same data always gives the same intervals
#: A derived quantity of per-mode statistics (mode → one value per resample), vectorized.
StatFn = Callable[[dict[str, np.ndarray]], np.ndarray]


def _rank_value(sorted_vals: Floats, r: float) -> float:
    """The value at 1-based rank `r` (rounded, clamped to 1..n), as `stats.rs` does."""
    n = len(sorted_vals)
    # Rust's f64::round rounds half away from zero; the ranks here are integers already, but
    # keep the same rule for safety.
    idx = int(math.floor(abs(r) + 0.5)) * (1 if r >= 0 else -1)
    idx = min(max(idx, 1), n)
    return float(sorted_vals[idx - 1])


def quantile_ci(sorted_vals: Floats, q: float) -> tuple[float, float, float]:
    """`(value, lo, hi)`: the `q` quantile of an ascending sample and its 95% CI (see module doc).
    NaN for an empty sample."""
    n = len(sorted_vals)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    nf = float(n)
    center = _rank_value(sorted_vals, math.ceil(nf * q))
    half = Z95 * math.sqrt(nf * q * (1.0 - q))
    lo = _rank_value(sorted_vals, math.floor(nf * q - half))
    hi = _rank_value(sorted_vals, math.ceil(nf * q + half) + 1.0)
    return (center, lo, hi)


def quantile(values: Iterable[float], q: float) -> float:
    v = sorted(x for x in values if x is not None and math.isfinite(x))
    return quantile_ci(v, q)[0]


@dataclass
class Summary:
    """Like `stats.rs::Summary`, plus a bootstrap interval for the mean."""

    n: int
    mean: float
    mean_lo: float
    mean_hi: float
    p50: float
    p50_lo: float
    p50_hi: float
    p99: float
    p99_lo: float
    p99_hi: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def clean(values: Iterable[float | None]) -> np.ndarray:
    a = np.asarray([np.nan if v is None else float(v) for v in values], dtype=float)
    return a[np.isfinite(a)]


def mean_ci_bootstrap(values: Floats, boot: int = DEFAULT_BOOT,
                      seed: int = DEFAULT_SEED) -> tuple[float, float, float]:
    """`(mean, lo, hi)`: the mean and its 95% percentile-bootstrap interval."""
    a = clean(values)
    n = len(a)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    m = float(a.mean())
    if n == 1 or boot <= 0:
        return (m, m, m)
    rng = np.random.default_rng(seed)
    means = np.empty(boot)
    chunk = max(1, 2_000_000 // n)
    for s in range(0, boot, chunk):
        e = min(boot, s + chunk)
        means[s:e] = a[rng.integers(0, n, size=(e - s, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return (m, float(lo), float(hi))


# ---------------------------------------------------------------------------------------------
# Student-t intervals

#: t_{0.975, df} for df = 1..30 (to 6 decimals; the classic table's 12.706, 4.303, 3.182, ...).
T975_TABLE = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
              2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
              2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
              2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
Z975 = 1.959963984540054  # the normal 0.975 quantile (df = ∞)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    bt = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                  + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return bt * _betacf(a, b, x) / a
    return 1.0 - bt * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with DF degrees of freedom (any real df > 0)."""
    p = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return p if t >= 0 else 1.0 - p


def _t_pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)
                    - 0.5 * math.log(df * math.pi) - (df + 1) / 2 * math.log1p(t * t / df))


def _cornish_fisher_975(df: float) -> float:
    """t_{0.975, df} by the Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5, four
    terms): relative error below 1e-5 at df = 10, 3e-8 at 30, 3e-11 at 120."""
    z = Z975
    g = ((z ** 3 + z) / 4,
         (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t (the half-width factor of a 95% two-sided interval):
    the exact table for integer df 1..30, Cornish-Fisher beyond 30, and for a fractional
    df ≤ 30 (Welch) Newton's method on `t_sf` (bracketed; |error| < 1e-9). NaN for df ≤ 0 or
    NaN; Z975 for df = ∞."""
    if not (df > 0):  # also NaN
        return math.nan
    if math.isinf(df):
        return Z975
    if df > 30:
        return _cornish_fisher_975(df)
    if df == int(df):
        return T975_TABLE[int(df) - 1]
    # t_{0.975} decreases with df: bracket between the neighbouring integers' values.
    lo = T975_TABLE[min(29, int(df))]
    hi = T975_TABLE[int(df) - 1] if df >= 1 else T975_TABLE[0]
    while df < 1 and t_sf(hi, df) > 0.025:
        hi *= 2
    t = (lo + hi) / 2
    for _ in range(100):
        f = t_sf(t, df) - 0.025  # decreasing in t
        if abs(f) < 1e-13:
            break
        if f > 0:
            lo = t
        else:
            hi = t
        step = t + f / _t_pdf(t, df)  # Newton (dF/dt = -pdf)
        t = step if lo < step < hi else (lo + hi) / 2
        if hi - lo < 1e-12:
            break
    return t


def mean_ci_t(values: Floats) -> tuple[float, float, float]:
    """`(mean, lo, hi)`: the mean and its 95% Student-t interval, mean ± t_{0.975, n−1}·s/√n
    (exact for normal samples; at n = 5 the factor is 2.776, not 1.96). n = 1: a zero-width
    interval (there is no spread to estimate); NaN for no values."""
    a = clean(values)
    n = len(a)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    m = float(a.mean())
    if n == 1:
        return (m, m, m)
    h = t975(n - 1) * float(a.std(ddof=1)) / math.sqrt(n)
    return (m, m - h, m + h)


@dataclass
class TInterval:
    """A difference (or ratio) with its 95% t-interval, the degrees of freedom behind it and
    the sample sizes. `lo`/`hi` are NaN when there is no interval (fewer than 2 values on a
    side, or an unbounded Fieller interval)."""

    value: float
    lo: float
    hi: float
    df: float
    se: float
    n_a: int
    n_b: int

    def excludes_zero(self) -> bool:
        return bool(math.isfinite(self.lo) and math.isfinite(self.hi)
                    and (self.lo > 0 or self.hi < 0))

    def scaled(self, k: float) -> TInterval:
        """The same interval divided by K (> 0), e.g. a difference as a share of a mean."""
        return TInterval(self.value / k, self.lo / k, self.hi / k, self.df, self.se / k,
                         self.n_a, self.n_b)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _mv(values: Iterable[float | None]) -> tuple[int, float, float]:
    a = clean(values)
    n = len(a)
    return (n, float(a.mean()) if n else math.nan,
            float(a.var(ddof=1)) / n if n > 1 else math.nan)  # (n, mean, var of the mean)


def _satterthwaite(terms: Sequence[tuple[float, int]]) -> float:
    """Welch–Satterthwaite df of a sum of independent variance terms (v_i, n_i)."""
    num = sum(v for v, _ in terms) ** 2
    den = sum(v * v / (n - 1) for v, n in terms)
    return num / den if den > 0 else math.inf


def welch_diff_ci(a: Floats, b: Floats) -> TInterval:
    """mean(a) − mean(b) with its 95% Welch interval: ± t_{0.975, df}·√(s_a²/n_a + s_b²/n_b),
    df by Welch–Satterthwaite (no equal-variance assumption). The interval is NaN with fewer
    than 2 values on a side; zero-width when both samples are constant."""
    na, ma, va = _mv(a)
    nb, mb, vb = _mv(b)
    d = ma - mb
    if na < 2 or nb < 2:
        return TInterval(d, math.nan, math.nan, math.nan, math.nan, na, nb)
    se = math.sqrt(va + vb)
    df = _satterthwaite([(va, na), (vb, nb)])
    h = t975(df) * se if se > 0 else 0.0
    return TInterval(d, d - h, d + h, df, se, na, nb)


def paired_t_ci(a: Sequence[float | None], b: Sequence[float | None]) -> TInterval:
    """mean(a_i − b_i) over the pairs where both are finite, with its 95% t-interval (df =
    pairs − 1): the interval for a design that pairs a and b (e.g. one of each per round)."""
    x = np.asarray([np.nan if v is None else float(v) for v in a], dtype=float)
    y = np.asarray([np.nan if v is None else float(v) for v in b], dtype=float)
    if len(x) != len(y):
        raise ValueError("paired_t_ci: a and b must pair up (same length)")
    d = (x - y)[np.isfinite(x) & np.isfinite(y)]
    m, lo, hi = mean_ci_t(d)
    n = len(d)
    if n < 2:
        return TInterval(m, math.nan, math.nan, math.nan, math.nan, n, n)
    return TInterval(m, lo, hi, float(n - 1), float(d.std(ddof=1)) / math.sqrt(n), n, n)


def share_ci(x: Floats, base: Floats, ref: Floats) -> TInterval:
    """The share of the gap base → ref that x covers, S = (x̄ − b̄)/(r̄ − b̄) (1 = x is as good
    as ref, 0 = no better than base), with Fieller's 95% interval for a ratio of means of
    three independent samples: every S with (x̄ − b̄ − S(r̄ − b̄))² ≤ t²·(v_x + S²v_r + (1−S)²v_b)
    (v = s²/n; t at the Welch–Satterthwaite df of that combination at the estimate). The
    interval is bounded only when the gap r̄ − b̄ differs from 0 at that level; else lo/hi are
    NaN (the share is then not estimable). `n_a`/`n_b`: the sizes of x and base."""
    nx, mx, vx = _mv(x)
    nb, mb, vb = _mv(base)
    nr, mr, vr = _mv(ref)
    num, den = mx - mb, mr - mb
    s0 = num / den if den != 0 else math.nan
    if min(nx, nb, nr) < 2 or not math.isfinite(s0):
        return TInterval(s0, math.nan, math.nan, math.nan, math.nan, nx, nb)
    terms = [(vx, nx), (s0 * s0 * vr, nr), ((1 - s0) ** 2 * vb, nb)]
    v0 = sum(v for v, _ in terms)
    df = _satterthwaite(terms)
    t2 = t975(df) ** 2 if v0 > 0 else 0.0
    qa = den * den - t2 * (vr + vb)
    qb = num * den - t2 * vb
    qc = num * num - t2 * (vx + vb)
    if qa <= 0:  # the gap is not distinguishable from 0: unbounded
        return TInterval(s0, math.nan, math.nan, df, math.sqrt(v0) / abs(den), nx, nb)
    root = math.sqrt(max(0.0, qb * qb - qa * qc))
    return TInterval(s0, (qb - root) / qa, (qb + root) / qa, df, math.sqrt(v0) / abs(den), nx,
                     nb)


def summarize(values: Iterable[float | None], boot: int = DEFAULT_BOOT,
              seed: int = DEFAULT_SEED) -> Summary:
    a = np.sort(clean(values))
    if len(a) == 0:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    m, mlo, mhi = mean_ci_bootstrap(a, boot, seed)
    p50 = quantile_ci(a, 0.5)
    p99 = quantile_ci(a, 0.99)
    return Summary(len(a), m, mlo, mhi, *p50, *p99, float(a[0]), float(a[-1]))


def overhead_removed(cold: float, warm: float, mode: float) -> float:
    """Share of the cold overhead (cold − warm) that `mode` removes: (cold − mode)/(cold − warm).
    1 = as fast as warm, 0 = as slow as cold, negative = slower than cold. NaN when cold ≤ warm
    (there is no overhead to remove)."""
    d = cold - warm
    if not (math.isfinite(d) and d > 0):
        return math.nan
    return (cold - mode) / d


# ---------------------------------------------------------------------------------------------
# Paired bootstrap over rounds


def _stat_axis1(x: np.ndarray, stat: str) -> np.ndarray:
    """Per-(resample, mode) statistic over axis 1 of a (B, R, M) array with NaN = missing.
    `p50`/`p99` use the same order-statistic definition as `quantile_ci`."""
    if stat == "mean":
        with np.errstate(invalid="ignore"):
            return np.nanmean(x, axis=1)
    q = {"p50": 0.5, "p99": 0.99}[stat]
    s = np.sort(x, axis=1)  # NaN sorts last
    k = np.sum(np.isfinite(x), axis=1)  # (B, M)
    idx = np.clip(np.ceil(k * q).astype(int), 1, None) - 1
    idx = np.minimum(idx, x.shape[1] - 1)
    out = np.take_along_axis(s, idx[:, None, :], axis=1)[:, 0, :]
    out[k == 0] = np.nan
    return out


def _stat_point(col: np.ndarray, stat: str) -> float:
    a = col[np.isfinite(col)]
    if len(a) == 0:
        return math.nan
    if stat == "mean":
        return float(a.mean())
    return quantile_ci(np.sort(a), {"p50": 0.5, "p99": 0.99}[stat])[0]


@dataclass
class Derived:
    """A quantity derived from per-mode statistics, with its bootstrap interval over rounds."""

    value: float
    lo: float
    hi: float
    #: share of resamples in which the quantity was undefined (e.g. no overhead to remove)
    undefined_share: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def round_matrix(samples: pd.DataFrame, modes: Sequence[str],
                 value: str = "latency_us") -> tuple[np.ndarray, list]:
    """A rounds × modes matrix of one value (NaN where a round lacks a mode; a round with
    several samples of one mode contributes their mean) from a DataFrame with columns
    `round`, `mode` and `value`."""
    import pandas as pd  # local: stats stays importable without pandas

    df = samples[samples["mode"].isin(modes)]
    if df.empty:
        return np.full((0, len(modes)), np.nan), []
    piv = pd.pivot_table(df, index="round", columns="mode", values=value, aggfunc="mean")
    piv = piv.reindex(columns=list(modes))
    return piv.to_numpy(dtype=float), list(piv.index)


def paired_bootstrap(mat: np.ndarray, modes: Sequence[str],
                     fns: dict[str, StatFn],
                     stat: str = "mean", boot: int = DEFAULT_BOOT,
                     seed: int = DEFAULT_SEED) -> dict[str, Derived]:
    """Evaluate each derived quantity `fns[name](per_mode_stat)` on the full data (point
    estimate) and on `boot` resamples of the rounds (rows of `mat`), giving a 95% percentile
    interval. `per_mode_stat` maps a mode to an array of statistics (one per resample; a
    1-element array for the point estimate). A resample where the quantity is NaN (undefined)
    counts in `undefined_share`; the interval is taken over the defined ones."""
    R, M = mat.shape
    point_stats = {m: np.array([_stat_point(mat[:, j], stat)]) for j, m in enumerate(modes)}
    out: dict[str, Derived] = {}
    points = {name: float(np.asarray(fn(point_stats))[0]) for name, fn in fns.items()}
    if R < 2 or boot <= 0:
        return {n: Derived(v, math.nan, math.nan, 1.0) for n, v in points.items()}
    rng = np.random.default_rng(seed)
    chunk = max(1, 4_000_000 // max(1, R * M))
    acc: dict[str, list[np.ndarray]] = {n: [] for n in fns}
    for s in range(0, boot, chunk):
        b = min(boot, s + chunk) - s
        idx = rng.integers(0, R, size=(b, R))
        st = _stat_axis1(mat[idx], stat)  # (b, M)
        per_mode = {m: st[:, j] for j, m in enumerate(modes)}
        for name, fn in fns.items():
            with np.errstate(invalid="ignore", divide="ignore"):
                acc[name].append(np.asarray(fn(per_mode), dtype=float))
    for name in fns:
        v = np.concatenate(acc[name])
        ok = v[np.isfinite(v)]
        und = 1.0 - len(ok) / len(v)
        if len(ok) == 0:
            out[name] = Derived(points[name], math.nan, math.nan, und)
        else:
            lo, hi = np.percentile(ok, [2.5, 97.5])
            out[name] = Derived(points[name], float(lo), float(hi), und)
    return out


def share_fn(cold: str, warm: str, mode: str) -> StatFn:
    """Vectorized (cold − mode)/(cold − warm) over per-mode statistics; NaN where cold ≤ warm."""
    return part_share_fn(cold, mode, cold, warm)


def diff_fn(a: str, b: str) -> StatFn:
    return lambda s: s[a] - s[b]


def part_share_fn(a: str, b: str, cold: str, warm: str) -> StatFn:
    """(a − b)/(cold − warm): the share of the cold overhead that the step b → a accounts for."""

    def f(s: dict[str, np.ndarray]) -> np.ndarray:
        d = s[cold] - s[warm]
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (s[a] - s[b]) / d
        return np.where(d > 0, r, np.nan)

    return f
