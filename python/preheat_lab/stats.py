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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

Z95 = 1.96
DEFAULT_BOOT = 2000
DEFAULT_SEED = 20161121  # fixed: the same data always gives the same intervals


def _rank_value(sorted_vals: Sequence[float], r: float) -> float:
    """The value at 1-based rank `r` (rounded, clamped to 1..n), as `stats.rs` does."""
    n = len(sorted_vals)
    # Rust's f64::round rounds half away from zero; the ranks here are integers already, but
    # keep the same rule for safety.
    idx = int(math.floor(abs(r) + 0.5)) * (1 if r >= 0 else -1)
    idx = min(max(idx, 1), n)
    return float(sorted_vals[idx - 1])


def quantile_ci(sorted_vals: Sequence[float], q: float) -> Tuple[float, float, float]:
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

    def to_dict(self) -> Dict[str, float]:
        return asdict(self)


def clean(values: Iterable[Optional[float]]) -> np.ndarray:
    a = np.asarray([np.nan if v is None else float(v) for v in values], dtype=float)
    return a[np.isfinite(a)]


def mean_ci_bootstrap(values: Sequence[float], boot: int = DEFAULT_BOOT,
                      seed: int = DEFAULT_SEED) -> Tuple[float, float, float]:
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


def mean_ci_t(values: Sequence[float]) -> Tuple[float, float, float]:
    """`(mean, lo, hi)` with a normal-approximation interval (mean ± 1.96 s/√n); for n ≥ 30 it
    is the t-interval within 4%. Used to cross-check the bootstrap."""
    a = clean(values)
    n = len(a)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    m = float(a.mean())
    if n == 1:
        return (m, m, m)
    h = Z95 * float(a.std(ddof=1)) / math.sqrt(n)
    return (m, m - h, m + h)


def summarize(values: Iterable[Optional[float]], boot: int = DEFAULT_BOOT,
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

    def to_dict(self) -> Dict[str, float]:
        return asdict(self)


def round_matrix(samples, modes: Sequence[str], value: str = "latency_us") -> Tuple[np.ndarray, List]:
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
                     fns: Dict[str, Callable[[Dict[str, np.ndarray]], np.ndarray]],
                     stat: str = "mean", boot: int = DEFAULT_BOOT,
                     seed: int = DEFAULT_SEED) -> Dict[str, Derived]:
    """Evaluate each derived quantity `fns[name](per_mode_stat)` on the full data (point
    estimate) and on `boot` resamples of the rounds (rows of `mat`), giving a 95% percentile
    interval. `per_mode_stat` maps a mode to an array of statistics (one per resample; a
    1-element array for the point estimate). A resample where the quantity is NaN (undefined)
    counts in `undefined_share`; the interval is taken over the defined ones."""
    R, M = mat.shape
    point_stats = {m: np.array([_stat_point(mat[:, j], stat)]) for j, m in enumerate(modes)}
    out: Dict[str, Derived] = {}
    points = {name: float(np.asarray(fn(point_stats))[0]) for name, fn in fns.items()}
    if R < 2 or boot <= 0:
        return {n: Derived(v, math.nan, math.nan, 1.0) for n, v in points.items()}
    rng = np.random.default_rng(seed)
    chunk = max(1, 4_000_000 // max(1, R * M))
    acc: Dict[str, List[np.ndarray]] = {n: [] for n in fns}
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


def share_fn(cold: str, warm: str, mode: str):
    """Vectorized (cold − mode)/(cold − warm) over per-mode statistics; NaN where cold ≤ warm."""
    return part_share_fn(cold, mode, cold, warm)


def diff_fn(a: str, b: str):
    return lambda s: s[a] - s[b]


def part_share_fn(a: str, b: str, cold: str, warm: str):
    """(a − b)/(cold − warm): the share of the cold overhead that the step b → a accounts for."""

    def f(s: Dict[str, np.ndarray]) -> np.ndarray:
        d = s[cold] - s[warm]
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (s[a] - s[b]) / d
        return np.where(d > 0, r, np.nan)

    return f
