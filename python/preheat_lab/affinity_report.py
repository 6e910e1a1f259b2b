"""preheat lab affinity: statistics, tables, figures and report.html (the runs: affinity.py).

Statistics (all from stats.py, nothing re-implemented here):

* per condition (workload × cell × preheat): mean and 95% Student-t interval
  (`stats.mean_ci_t`, mean ± t_{0.975, n−1}·s/√n) of the rate, and the standard deviation (the
  figures' whiskers are 2σ, as the paper's);
* % difference of a low-affinity cell vs its matching high cell (BV_0 at the same retention
  and quantum; Table 3: the same pair with high affinity): the Welch 95% interval of the
  difference of the means (`stats.welch_diff_ci`, Welch–Satterthwaite df) divided by the high
  mean; significant only when it excludes 0, judged only with ≥ MIN_N ok runs per side;
* win-back (low, low + preheat, high, high + preheat): recovered share = (low_pre − low) /
  (high_pre − low) with Fieller's interval (`stats.share_ci`), undefined unless high_pre − low
  is significantly > 0; what the preheat does without an affinity loss (high_pre vs high); its
  CPU time as a share of the run's; the rate counting it.
"""

from __future__ import annotations

import html
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from . import atomic, stats
from .affinity import (
    BUNDLED,
    MIN_N,
    STANDS_FOR,
    WHAT,
    WORKLOADS,
    high_cell_id,
    matrix_rows,
    substitutions,
    t2_cond_id,
    t3_cond_id,
)
from .affinity_figures import (
    _num,
    _pct_ci,
    fig2_groups,
    fig_bars,
    fig_quanta,
    fig_refill,
    fig_table2_grid,
    t3_groups,
    winback_groups,
)
from .report import Report

LABEL = "measured"
#: The paper's numbers (Kazempour et al.), quoted for reference, labeled "the paper's".
PAPER_L1 = ("≤ 4% difference: only twolf (Intel Clovertown, 2 ms quantum, low L2 retention, "
            "low I-cache affinity): IPC −4%, MPI +174%; every other benchmark < 1%, not "
            "significant")
PAPER_MMP = "11% average, 27% maximum (art) performance decrease with low L2 affinity"
PAPER_UMP = "16% average, 45% maximum (art) performance decrease with low L2 affinity"
PAPER_SIZE = "288 experiments × 3 runs (8 SPEC CPU2000 benchmarks, 2 machines)"
NO_PMU = ("no PMU here: the metric is work per CPU-second for the bundled kernels and jobs per "
          "CPU-second for the programs (the paper's IPC and misses per instruction are not "
          "available)")


def _g(v) -> str:
    f = _num(v)
    return "–" if f is None else f"{f:.4g}"


def _mean_ci(v, lo, hi) -> str:
    return "–" if _num(v) is None else f"{_g(v)} [{_g(lo)}, {_g(hi)}]"


# ---------------------------------------------------------------------------------------------
# Tables


def _cis(df: pd.DataFrame, v: str, lo: str, hi: str, fmt: Callable = _pct_ci, **kw) -> list:
    """A column's values with their intervals, formatted per row."""
    return [fmt(a, b, c, **kw) for a, b, c in zip(df[v], df[lo], df[hi])]


def _share(v, lo, hi, d: int = 0) -> str:
    return _pct_ci(v, lo, hi, d).replace("+", "")


def _skipped(runs: pd.DataFrame, w: str) -> int:
    if not len(runs):
        return 0
    why = runs["reason"].fillna("").astype(str)
    return int(((runs["status"] == "skipped") & why.str.startswith(f"{w} ")).sum())


def correspondence(unavailable: dict, selected: Sequence[str]) -> pd.DataFrame:
    """The workloads, the paper's benchmark each stands for, and whether it ran here."""
    return pd.DataFrame([{
        "workload": w, "what": WHAT[w], "stands for (the paper's benchmark)": STANDS_FOR[w],
        "measured here": ("SKIPPED (unavailable)" if w in unavailable
                          else "yes" if w in selected else "not selected"),
        "metric": "work per CPU-second" if w in BUNDLED else "jobs per CPU-second"}
        for w in WORKLOADS])


def _verdict_cis(df: pd.DataFrame, col: str) -> list:
    return [f"{x} ({v})" for x, v in zip(_cis(df, col, f"{col}_lo", f"{col}_hi"),
                                         df[f"{col}_verdict"])]


def winback_display(wb: pd.DataFrame) -> pd.DataFrame:
    rec = [_share(a, b, c) if _num(a) is not None else n for a, b, c, n in
           zip(wb["recovered"], wb["recovered_lo"], wb["recovered_hi"], wb["recovered_note"])]
    return pd.DataFrame({
        "workload": wb["workload"], "comparison": wb["comparison"],
        "n low/low+pre/high/high+pre": [
            f"{a}/{b}/{c}/{d}" for a, b, c, d in
            zip(wb["low_n"], wb["low_pre_n"], wb["high_n"], wb["high_pre_n"])],
        "affinity loss: low vs high [95% CI]": _verdict_cis(wb, "loss"),
        "preheat without affinity loss: high+pre vs high [95% CI]":
            _verdict_cis(wb, "preheat_alone"),
        "preheat under low affinity: low+pre vs low [95% CI]": _verdict_cis(wb, "gain"),
        "loss left with preheat: low+pre vs high+pre [95% CI]": _verdict_cis(wb, "loss_pre"),
        "recovered (low+pre − low)/(high+pre − low) [95% CI]": rec,
        "net gain counting the preheat's CPU: low+pre vs low [95% CI]":
            _verdict_cis(wb, "net_gain"),
        "preheat CPU / run CPU, low+pre [95% CI]": _cis(
            wb, "low_pre_cost_share", "low_pre_cost_share_lo", "low_pre_cost_share_hi", _share,
            d=2),
        "preheat CPU / run CPU, high+pre [95% CI]": _cis(
            wb, "high_pre_cost_share", "high_pre_cost_share_lo", "high_pre_cost_share_hi",
            _share, d=2)})


def runs_table(plan: Sequence[dict], conds: dict[str, dict]) -> pd.DataFrame:
    """One row per planned run (ok, failed, skipped, not run) with the CLI's numbers."""
    rows = []
    for rec in plan:
        c = conds.get(rec["cond"], {})
        d = rec.get("data") or {}
        q = d.get("quanta") or {}
        w = c.get("workload")
        r = {k: rec.get(k) for k in ("run_id", "round", "order", "cond", "status", "reason",
                                     "seconds", "command")}
        r.update({k: c.get(k) for k in ("experiment", "purpose", "workload", "interfering",
                                        "cell_id", "interleaved", "concurrent", "concurrent_cpu",
                                        "affinity", "retention", "quantum_ms", "preheat")})
        r["workload_kind"] = d.get("workload_kind") or ("bundled" if w in BUNDLED else "program")
        r["stands_for"] = d.get("stands_for") or STANDS_FOR.get(w or "")
        r["metric"] = d.get("metric")
        for k in ("rate", "work", "cpu_s", "wall_s", "preheat_cpu_s", "preheats",
                  "rate_with_preheat_cost", "ipc", "mpi"):
            r[k] = _num(d.get(k))
        if c.get("preheat") and r["rate_with_preheat_cost"] is None and r["work"] is not None \
                and r["cpu_s"] is not None:
            r["rate_with_preheat_cost"] = r["work"] / (r["cpu_s"] + (r["preheat_cpu_s"] or 0.0))
        r["preheat_share"] = (r["preheat_cpu_s"] / r["cpu_s"]
                              if c.get("preheat") and r["preheat_cpu_s"] is not None and r["cpu_s"]
                              else None)
        r["q_mechanism"] = q.get("mechanism")
        r["q_requested_ms"] = _num(q.get("requested_ms"))
        for role in ("main", "vector"):
            x = q.get(role) or {}
            r[f"q_{role}_n"] = _num(x.get("n"))
            r[f"q_{role}_p50_ms"] = _num(x.get("p50_ms"))
            r[f"q_{role}_p99_ms"] = _num(x.get("p99_ms"))
        # How late the controller issued its switches, µs (p50_us/p99_us; the first CLI builds
        # put the µs values under the quanta's names p50_ms/p99_ms).
        late = q.get("controller_late_us") or {}
        r["q_late_n"] = _num(late.get("n"))
        r["q_late_p50_us"] = _num(late.get("p50_us", late.get("p50_ms")))
        r["q_late_p99_us"] = _num(late.get("p99_us", late.get("p99_ms")))
        r["interleaving"] = (interleaving_check(r["q_requested_ms"], r["q_main_p50_ms"],
                                                r["q_main_n"])
                             if rec.get("status") == "ok" and c.get("experiment") == "table2"
                             else "")
        copies = [_num(x.get("rate")) for x in d.get("copies") or [] if isinstance(x, dict)]
        r["copies"] = len(copies)
        r["copies_rates"] = " ".join(_g(x) for x in copies)
        r["notes"] = " | ".join(map(str, d.get("notes") or []))
        r["label"] = LABEL if rec.get("status") == "ok" else ""
        rows.append(r)
    df = pd.DataFrame(rows)
    if len(df) and df["ipc"].isna().all() and df["mpi"].isna().all():
        df = df.drop(columns=["ipc", "mpi"])
    return df


#: A Table 2 run interleaved as asked when its main workload's quanta (p50) are within this
#: share of the requested quantum.
QUANTUM_TOLERANCE = 0.2


def interleaving_check(requested_ms, p50_ms, n) -> str:
    """'ok' when a Table 2 run's main workload ran quanta (p50) within QUANTUM_TOLERANCE of the
    requested one, else what went wrong (no quanta: it was never interleaved, e.g. a workload
    shorter than one quantum)."""
    req, p50 = _num(requested_ms), _num(p50_ms)
    if req is None:
        return "no quanta reported"
    count = _num(n)
    if p50 is None or not count:
        return "not interleaved (no quanta of the main workload reported)"
    if abs(p50 / req - 1) <= QUANTUM_TOLERANCE:
        return "ok"
    return f"quanta off: p50 {p50:.3g} ms for {req:g} ms requested (n = {int(count)})"


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"] if len(runs) else runs


def cond_values(runs: pd.DataFrame, cond: str, col: str = "rate") -> np.ndarray:
    """COL over the ok runs of COND (finite values only)."""
    ok = _ok(runs)
    return stats.clean(ok.loc[ok["cond"] == cond, col]) if len(ok) and col in ok else np.array([])


def cond_stats(runs: pd.DataFrame, cond: str, col: str = "rate") -> dict:
    """n, mean, 95% Student-t interval (stats.mean_ci_t) and σ of COL over the ok runs of
    COND."""
    v = cond_values(runs, cond, col)
    m, lo, hi = stats.mean_ci_t(v)
    sd = float(v.std(ddof=1)) if len(v) > 1 else (0.0 if len(v) else math.nan)
    return {"n": len(v), "mean": m, "lo": lo, "hi": hi, "sd": sd}


def pct_diff(a: stats.Floats, b: stats.Floats) -> stats.TInterval:
    """mean(a)/mean(b) − 1 with a 95% interval: the Welch interval of mean(a) − mean(b)
    (stats.welch_diff_ci) divided by mean(b). Dividing by the point estimate of mean(b) leaves
    the verdict exactly Welch's (mean(b) > 0); it ignores mean(b)'s own uncertainty, which is
    small next to that of the difference when both sides have similar spread."""
    d = stats.welch_diff_ci(a, b)
    mb = float(np.mean(b)) if len(b) else math.nan
    if not (mb > 0):
        return stats.TInterval(math.nan, math.nan, math.nan, d.df, math.nan, d.n_a, d.n_b)
    return d.scaled(mb)


def pct_vs(runs: pd.DataFrame, cond: str, ref: str, col: str = "rate",
           ref_col: str = "rate") -> stats.TInterval:
    """`pct_diff` of COL over the ok runs of COND against REF_COL of REF."""
    return pct_diff(cond_values(runs, cond, col), cond_values(runs, ref, ref_col))


def significant(d: stats.TInterval) -> bool | None:
    """True when the 95% interval excludes 0, False when it does not, None (not assessed) with
    fewer than MIN_N ok runs on either side."""
    if min(d.n_a, d.n_b) < MIN_N:
        return None
    return d.excludes_zero()


def verdict(d: stats.TInterval) -> str:
    sig = significant(d)
    if sig is None:
        return f"not assessed (n = {d.n_a}/{d.n_b}; needs ≥ {MIN_N} per side)"
    return "significant" if sig else "not significant"


def _diff_cols(prefix: str, d: stats.TInterval) -> dict:
    return {f"{prefix}": d.value, f"{prefix}_lo": d.lo, f"{prefix}_hi": d.hi,
            f"{prefix}_df": d.df, f"{prefix}_significant": significant(d),
            f"{prefix}_verdict": verdict(d)}


def _stat_cols(prefix: str, s: dict) -> dict:
    return {f"{prefix}n": s["n"], f"{prefix}mean": s["mean"], f"{prefix}lo": s["lo"],
            f"{prefix}hi": s["hi"], f"{prefix}sd": s["sd"]}


def _metric(runs: pd.DataFrame, w: str) -> str:
    ok = _ok(runs)
    if not len(ok):
        return "work per CPU-second" if w in BUNDLED else "jobs per CPU-second"
    m = ok.loc[ok["workload"] == w, "metric"].dropna()
    if len(m):
        return str(m.iloc[0])
    return "work per CPU-second" if w in BUNDLED else "jobs per CPU-second"


def _pct_cols(d: stats.TInterval) -> dict:
    return {"pct": d.value, "pct_lo": d.lo, "pct_hi": d.hi, "df": d.df,
            "significant": significant(d), "verdict": verdict(d)}


def table2_table(runs: pd.DataFrame, conds: dict[str, dict]) -> pd.DataFrame:
    """Per workload × Table 2 cell (no preheat): the rate and, for low cells, the % difference
    vs BV_0 at the same retention and quantum (Welch)."""
    rows = []
    for c in conds.values():
        if c["experiment"] != "table2" or c["preheat"]:
            continue
        s = cond_stats(runs, c["cond"])
        r = {k: c.get(k) for k in ("workload", "cell_id", "retention", "affinity", "quantum_ms",
                                   "interleaved", "concurrent", "concurrent_cpu", "paper_cell",
                                   "substitute")}
        r.update({"stands_for": STANDS_FOR.get(c["workload"]),
                  "metric": _metric(runs, c["workload"]),
                  **_stat_cols("", s)})
        if c["affinity"] != "high":
            hc = t2_cond_id(c["workload"], high_cell_id(c), False)
            r.update({"high_cell": high_cell_id(c), **_stat_cols("high_", cond_stats(runs, hc)),
                      **_pct_cols(pct_vs(runs, c["cond"], hc))})
        else:
            r.update({"high_cell": "(this is the reference)", "pct": None, "pct_lo": None,
                      "pct_hi": None, "df": None, "significant": None, "verdict": "reference"})
        r["label"] = LABEL
        rows.append(r)
    return pd.DataFrame(rows)


def table3_table(runs: pd.DataFrame, conds: dict[str, dict]) -> pd.DataFrame:
    """Per Table 3 pair (no preheat): the rate (mean over the main copies) with high and low
    affinity and the % difference low vs high (Welch)."""
    rows = []
    for c in conds.values():
        if c["experiment"] != "table3" or c["preheat"] or c["affinity"] != "low":
            continue
        w, w2 = c["workload"], c["interfering"]
        hc = t3_cond_id(w, w2, "high", False)
        hs, ls = cond_stats(runs, hc), cond_stats(runs, c["cond"])
        rows.append({"main": w, "interfering": w2, "stands_for": STANDS_FOR.get(w),
                     "quantum_ms": c["quantum_ms"], "metric": _metric(runs, w),
                     **_stat_cols("high_", hs), **_stat_cols("low_", ls),
                     **_pct_cols(pct_vs(runs, c["cond"], hc)), "label": LABEL})
    return pd.DataFrame(rows)


def winback_groups_of(conds: dict[str, dict]) -> list[dict]:
    """The win-back comparisons in the plan: per bundled workload, Table 2 (the low cell run
    with --preheat, its BV_0 cell) and Table 3 (the pair), each as the condition ids of low,
    low + preheat, high and high + preheat."""
    out = []
    for c in conds.values():
        if not c["preheat"] or c["affinity"] == "high":
            continue
        w = c["workload"]
        if c["experiment"] == "table2":
            hid = high_cell_id(c)
            ids = {"low": t2_cond_id(w, c["cell_id"], False), "low_pre": c["cond"],
                   "high": t2_cond_id(w, hid, False), "high_pre": t2_cond_id(w, hid, True)}
            where = f"Table 2: {c['cell_id']} vs {hid}"
        else:
            w2 = c["interfering"]
            ids = {"low": t3_cond_id(w, w2, "low", False), "low_pre": c["cond"],
                   "high": t3_cond_id(w, w2, "high", False),
                   "high_pre": t3_cond_id(w, w2, "high", True)}
            where = f"Table 3: {w}+{w2}, moved vs pinned"
        out.append({"workload": w, "experiment": c["experiment"], "comparison": where, **ids})
    return out


def winback_table(runs: pd.DataFrame, conds: dict[str, dict]) -> pd.DataFrame:
    """Per win-back comparison (low, low + preheat, high, high + preheat; all measured):

    * loss: low vs high (the affinity loss, no preheat); loss_pre: low + preheat vs high +
      preheat (what is left of it when both preheat);
    * gain: low + preheat vs low; preheat_alone: high + preheat vs high (what the preheat does
      without an affinity loss — it also restores what other work evicted);
    * recovered = (low_pre − low)/(high_pre − low) with Fieller's interval (stats.share_ci):
      1 = as fast as the pinned/high case *with the same preheat*. Undefined unless high_pre −
      low is significantly > 0 (Welch, ≥ MIN_N runs per side);
    * the preheat's CPU time as a share of the run's (preheat_cpu_s / cpu_s) with and without
      affinity loss, and net_gain: rate_with_preheat_cost of low + preheat vs the rate of low.

    All differences: Welch intervals of the difference of means divided by the reference mean
    (`pct_diff`)."""
    rows = []
    for g in winback_groups_of(conds):
        v = {k: cond_values(runs, g[k]) for k in ("low", "low_pre", "high", "high_pre")}
        r = {**g, **{f"{k}_cond": g[k] for k in ("low", "low_pre", "high", "high_pre")}}
        for k in ("low", "low_pre", "high", "high_pre"):
            del r[k]
            r.update(_stat_cols(f"{k}_", cond_stats(runs, g[k])))
        r.update(_stat_cols("low_pre_cost_", cond_stats(runs, g["low_pre"],
                                                        "rate_with_preheat_cost")))
        r.update(_stat_cols("high_pre_cost_", cond_stats(runs, g["high_pre"],
                                                         "rate_with_preheat_cost")))
        r.update(_diff_cols("loss", pct_diff(v["low"], v["high"])))
        r.update(_diff_cols("loss_pre", pct_diff(v["low_pre"], v["high_pre"])))
        r.update(_diff_cols("gain", pct_diff(v["low_pre"], v["low"])))
        r.update(_diff_cols("preheat_alone", pct_diff(v["high_pre"], v["high"])))
        r.update(_diff_cols("net_gain", pct_diff(
            cond_values(runs, g["low_pre"], "rate_with_preheat_cost"), v["low"])))
        gap = stats.welch_diff_ci(v["high_pre"], v["low"])
        gap_sig = significant(gap)
        sh = stats.share_ci(v["low_pre"], v["low"], v["high_pre"])
        defined = bool(gap_sig) and gap.value > 0 and math.isfinite(sh.lo)
        if defined:
            note = ""
        elif gap_sig is None:
            note = (f"not assessed: n = {gap.n_a}/{gap.n_b} (high + preheat / low) runs, needs "
                    f"≥ {MIN_N} per side")
        elif not (gap_sig and gap.value > 0):
            note = ("undefined: high + preheat is not significantly faster than low, so there is "
                    "no loss to win back")
        else:
            note = "undefined: the gap is too noisy for a bounded interval"
        r.update({"gap": gap.value, "gap_lo": gap.lo, "gap_hi": gap.hi,
                  "gap_significant": gap_sig,
                  "recovered": sh.value if defined else None,
                  "recovered_lo": sh.lo if defined else None,
                  "recovered_hi": sh.hi if defined else None,
                  "recovered_df": sh.df if defined else None, "recovered_note": note})
        for k in ("low_pre", "high_pre"):
            cost = cond_stats(runs, g[k], "preheat_share")
            r.update({f"{k}_cost_share": cost["mean"], f"{k}_cost_share_lo": cost["lo"],
                      f"{k}_cost_share_hi": cost["hi"],
                      f"{k}_preheats": cond_stats(runs, g[k], "preheats")["mean"]})
        r["label"] = LABEL
        rows.append(r)
    return pd.DataFrame(rows)


def quanta_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Achieved quanta per mechanism, requested quantum and role: the runs' p50 and p99."""
    ok = _ok(runs)
    if not len(ok) or "q_mechanism" not in ok:
        return pd.DataFrame()
    ok = ok[ok["q_mechanism"].notna()]
    rows = []
    for (mech, req), g in ok.groupby(["q_mechanism", "q_requested_ms"], sort=True):
        for role in ("main", "vector"):
            p50 = stats.clean(g[f"q_{role}_p50_ms"])
            p99 = stats.clean(g[f"q_{role}_p99_ms"])
            if not len(p50):
                continue
            med = stats.quantile(p50, 0.5)
            late50 = stats.clean(g["q_late_p50_us"] if "q_late_p50_us" in g else [])
            late99 = stats.clean(g["q_late_p99_us"] if "q_late_p99_us" in g else [])
            rows.append({"mechanism": mech, "requested_ms": req, "role": role, "runs": len(p50),
                         "runs_without_quanta": len(g) - len(p50),
                         "quanta": int(np.nansum(g[f"q_{role}_n"])),
                         "p50_ms_median_over_runs": med,
                         "p99_ms_median_over_runs": stats.quantile(p99, 0.5),
                         "p99_ms_max": float(p99.max()) if len(p99) else None,
                         "p50_over_requested": med / req if req else None,
                         "controller_late_p50_us_median": (stats.quantile(late50, 0.5)
                                                           if len(late50) else None),
                         "controller_late_p99_us_max": (float(np.max(late99)) if len(late99)
                                                        else None),
                         "label": LABEL})
    return pd.DataFrame(rows)


def refill_table(plan: Sequence[dict], conds: dict[str, dict]) -> pd.DataFrame:
    """Mean rate_rel per bin of time since resume, per bundled workload × interleaved vector ×
    retention (Table 2 runs, with and without --preheat)."""
    rows = []
    for rec in plan:
        c = conds.get(rec["cond"], {})
        d = rec.get("data") or {}
        if rec.get("status") != "ok" or c.get("experiment") != "table2":
            continue
        for b in d.get("refill") or []:
            if isinstance(b, dict) and _num(b.get("rate_rel")) is not None:
                rows.append({"workload": c["workload"], "interleaved": c["interleaved"],
                             "retention": c["retention"], "preheat": bool(c["preheat"]),
                             "from_us": _num(b.get("from_us")), "to_us": _num(b.get("to_us")),
                             "rate_rel": float(b["rate_rel"]), "units": _num(b.get("units")) or 0})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    keys = ["workload", "interleaved", "retention", "preheat", "from_us", "to_us"]
    # dropna=False: the CLI's last bin may be open-ended (to_us null)
    out = df.groupby(keys, sort=True, dropna=False).agg(
        runs=("rate_rel", "size"), rate_rel=("rate_rel", "mean"),
        units=("units", "sum")).reset_index()
    out["label"] = LABEL
    return out


def paper_table(t2: pd.DataFrame, t3: pd.DataFrame, runs: pd.DataFrame, n_conds: int,
                reps: int) -> pd.DataFrame:
    """The paper's numbers beside ours."""
    rows = []
    l1 = t2[t2["affinity"].isin(["low-d", "low-i"])] if len(t2) else t2
    if len(l1):
        sig = l1[l1["significant"].eq(True)]
        worst = l1.loc[l1["pct"].astype(float).idxmin()] if l1["pct"].notna().any() else None
        ours = (f"{len(sig)} of {len(l1)} low L1-affinity cells significant (95%; "
                f"{int(l1['significant'].notna().sum())} assessed); the largest "
                "drop: " + (f"{_pct_ci(worst['pct'], worst['pct_lo'], worst['pct_hi'])} "
                            f"({worst['workload']}, {worst['cell_id']}, n={int(worst['n'])})"
                            if worst is not None else "–"))
    else:
        ours = "not measured"
    rows.append({"finding": "L1 cache affinity (Section 2, Table 2, Figures 2/3)",
                 "the paper's": PAPER_L1, "ours (measured)": ours})
    l2 = t2[t2["affinity"] == "low-d-l2"] if len(t2) else t2
    if len(l2):
        sig = l2[l2["significant"].eq(True)]
        worst = l2.loc[l2["pct"].astype(float).idxmin()] if l2["pct"].notna().any() else None
        rows.append({"finding": "L1D+L2 affinity by interleaving BV_L2 (substitute cell, not in "
                                "the paper)", "the paper's": "—",
                     "ours (measured)": f"{len(sig)} of {len(l2)} cells significant; the largest "
                     "drop: " + (f"{_pct_ci(worst['pct'], worst['pct_lo'], worst['pct_hi'])} "
                                 f"({worst['workload']}, {worst['cell_id']})"
                                 if worst is not None else "–")})
    if len(t3) and t3["pct"].notna().any():
        deg = -t3["pct"].astype(float)
        i = deg.idxmax()
        ours = (f"{100 * deg.mean():.1f}% average, {100 * deg.max():.1f}% maximum "
                f"({t3.loc[i, 'main']} + {t3.loc[i, 'interfering']}) decrease over "
                f"{int(deg.notna().sum())} pair(s); {int(t3['significant'].eq(True).sum())} "
                "significant")
    else:
        ours = "not measured"
    rows.append({"finding": "L2 affinity, multicore multiprocessor (MMP, Section 3, Figure 5)",
                 "the paper's": PAPER_MMP, "ours (measured)": ours})
    rows.append({"finding": "L2 affinity, conventional multiprocessor (UMP, Figure 4)",
                 "the paper's": PAPER_UMP, "ours (measured)": ours + " (one configuration "
                 "here: see Table 3 for which caches a move loses)" if len(t3) else ours})
    ok = int((runs["status"] == "ok").sum()) if len(runs) else 0
    rows.append({"finding": "size of the study", "the paper's": PAPER_SIZE,
                 "ours (measured)": f"{n_conds} conditions × {reps} rounds = {len(runs)} runs "
                                    f"({ok} ok)"})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# The report


def _guard(failures: list[str], what: str, fn: Callable, *a, **kw):
    try:
        return fn(*a, **kw)
    except Exception as e:  # one part failing must not lose the others
        failures.append(f"render {what}: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        return None


RATE_AXIS = "rate / rate with high affinity\n(rate: work or jobs per CPU-second)"
INTRO = (
    "Kazempour, Fedorova and Alagheband, Performance Implications of Cache Affinity on Multicore "
    "Processors (Euro-Par 2008). Section 2 (Table 2): a benchmark shares one CPU with a base "
    "vector whose footprint destroys its L1 D- or I-cache state each quantum (low affinity: "
    "BV_L1D, BV_L1I) or leaves it alone (high: BV_0); low L2 retention adds a vector running "
    "concurrently on a CPU that shares the L2 (BV_L2); quanta 2, 10 and 200 ms. Section 3 (Table "
    "3): copies of a main benchmark with an interfering one, bound to their cores (high "
    "affinity) or free to move (low), 2 ms. Here `preheat affinity` builds the same cells from "
    "this machine's caches (substitutions listed below) and the bundled kernels and Debian "
    "programs stand in for SPEC CPU2000. Beyond the paper: how much of the low-affinity loss "
    "`--preheat` wins back. Labels: measured = on this machine, now (n = samples behind the "
    "number); the paper's = quoted from the paper, not comparable in absolute terms.")
WINBACK_TEXT = (
    "Four conditions per comparison, all measured: low affinity, low + --preheat, high affinity "
    "and high + --preheat (Table 2: the strongest low cell and BV_0 in the same row and "
    "quantum; Table 3: moved vs pinned, where high + --preheat preheats every quantum on the "
    "copy's own CPU). The preheat also restores what other work (the concurrent vector, the "
    "interfering workload) evicted, so low + preheat can beat high without preheat: 'fully "
    "recovered' is measured against high *with the same preheat*. Recovered share = (low+pre − "
    "low)/(high+pre − low) with Fieller's 95% interval for a ratio of mean differences "
    "(stats.share_ci; asymmetric; t at the Welch–Satterthwaite df), undefined unless high+pre − "
    f"low is significantly > 0 (Welch, ≥ {MIN_N} runs per side). Differences: Welch intervals "
    "of the difference of means divided by the reference mean. The preheat's CPU time is the "
    "CLI's preheat_cpu_s (its share of the run's CPU time, with and without an affinity loss); "
    "the net gain divides the work by the run's CPU time plus the preheat's "
    "(rate_with_preheat_cost) and compares it with low without preheat.")
STATS_TEXT = (
    "Statistics (measured): per condition the mean rate with a 95% Student-t interval, mean ± "
    "t(0.975, n−1)·s/√n (stats.mean_ci_t; at n = 5 the factor is 2.78, at n = 2 it is 12.7). "
    "The % difference of a low-affinity cell vs BV_0 at the same retention and quantum (Table "
    "3: vs the same pair with high affinity) is the Welch 95% interval of the difference of the "
    "two means (stats.welch_diff_ci: unequal variances, Welch–Satterthwaite df) divided by the "
    "high mean — so 'significant' (the interval excludes 0) is exactly Welch's t-test at 5%; "
    "the interval ignores the uncertainty of the high mean in the denominator. A verdict needs "
    f"at least {MIN_N} ok runs on each side (else: not assessed). Calibration (simulated, "
    "normal noise, no true difference, n = 5 per side): the interval excludes 0 in ~5% of the "
    "cases, as it should (the paired bootstrap this report used before did in ~15%). Runs are "
    "not independent of the machine's drift, which is why every round runs every condition "
    "once in a shuffled order. Bar figures: whiskers are ±2 standard deviations, as the paper's "
    "figures (not confidence intervals).")


def render(out: Path, topo: dict, conds: dict[str, dict], plan: Sequence[dict],
           state: dict) -> dict:
    """Every table, figure, summary.json and report.html from the plan's runs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    failures = state.setdefault("failures", [])
    opts = state.get("options") or {}
    figures: list[tuple[Path, str]] = []
    tables: list[tuple[str, str]] = []
    rep = Report("preheat lab affinity: cache affinity on this machine (Kazempour et al.)")
    body = Report("")
    runs = runs_table(plan, conds)

    def table(name: str, df: pd.DataFrame, caption: str, display: pd.DataFrame | None = None):
        atomic.write_table(out / name, df)
        tables.append((f"{name}.csv", caption))
        if display is not None or len(df):
            body.table(display if display is not None else df, caption)

    def figure(png: Path | None, title: str):
        if png is not None:
            figures.append((png, title))
            body.image(png, title, png.with_suffix(".svg"))

    rep.text(INTRO)
    if state.get("state") not in (None, "complete"):
        rep.note(f"affinity: {str(state['state']).upper()} (interrupted by "
                 f"{state.get('interrupted_by')}) — below is what finished before.", "warn")
    for n in state.get("notes") or []:
        rep.note(f"note: {n}")
    for w, why in (state.get("unavailable") or {}).items():
        k = _skipped(runs, w)
        rep.note(f"SKIP {w}: the CLI reports it unavailable ({why}); {k} run(s) skipped, "
                 "including the Table 3 pairs it is part of.", "warn")

    # Machine and plan
    body.heading("This machine and the plan")
    t2i = (topo or {}).get("table2") or {}
    t3i = (topo or {}).get("table3") or {}
    caches = pd.DataFrame([{"cache": c.get("name"), "level": c.get("level"), "kind": c.get("kind"),
                            "bytes": c.get("bytes"), "line": c.get("line"),
                            "shared with CPUs": ",".join(map(str, c.get("shared_cpus") or []))}
                           for c in (topo or {}).get("caches") or []])
    if len(caches):
        body.table(caches, f"caches of CPU {topo.get('main_cpu')} (measured: sysfs of this "
                           "machine)")
    mat = pd.DataFrame(matrix_rows(topo or {}, opts.get("quanta") or []))
    if len(mat):
        body.table(mat, f"Table 2 as run here (measured machine): low retention destroys "
                        f"{t2i.get('retention_level')} from CPU {t2i.get('concurrent_cpu')}; the "
                        f"paper's exact cells: {'yes' if t2i.get('paper_exact') else 'no'}")
    for s in substitutions(topo or {}):
        body.note(f"substitution: {s}")
    for n in t2i.get("notes") or []:
        body.note(f"CLI note (Table 2): {n}")
    ev = pd.DataFrame((topo or {}).get("eviction") or [])
    if len(ev):
        body.table(ev, "eviction check of the base vectors (preheat affinity topology --verify; "
                       "measured)")
    if t3i:
        cpus = ",".join(map(str, t3i.get("cpus") or []))
        body.text(f"Table 3 here: {'feasible' if t3i.get('feasible') else 'NOT feasible'} on CPUs "
                  f"{cpus}: {t3i.get('main_copies')} copies of "
                  f"the main workload and {t3i.get('interfering')} interfering; a move between "
                  f"them loses {', '.join(t3i.get('lost_on_move') or []) or '–'} and keeps "
                  f"{', '.join(t3i.get('kept_on_move') or []) or '–'}. The paper's UMP/MMP "
                  "distinction is whether a move loses the L2; this machine is one configuration.")
        for n in t3i.get("notes") or []:
            body.note(f"CLI note (Table 3): {n}")
    metric = (topo or {}).get("metric") or NO_PMU
    body.text("Metric behind every figure: the rate each run reports — work per CPU-second for "
              "the bundled kernels, jobs per CPU-second for the programs (the CLI's topology: "
              f"\"{metric}\")." + ("" if (topo or {}).get("pmu") else
                                  " No PMU here: the paper's IPC and misses per instruction "
                                  "are not available, so the rate stands in for IPC."))
    corr = correspondence(state.get("unavailable") or {}, opts.get("workloads") or [])
    if "ipc" in runs or "mpi" in runs:
        body.note("the CLI reported IPC / misses per instruction for some runs: see runs.csv "
                  "(columns ipc, mpi; measured); the figures use the rate")
    table("workloads", corr, "workload correspondence (the paper's SPEC CPU2000 names; measured "
                             "here: this run)")

    # Runs
    n_status = runs["status"].value_counts().to_dict() if len(runs) else {}
    body.heading("Runs")
    body.text(f"{len(conds)} conditions × {opts.get('reps')} rounds = {len(runs)} runs, "
              f"--cpu-ms {opts.get('cpu_ms')} for the bundled kernels, seed {opts.get('seed')}; "
              + ", ".join(f"{v} {k}" for k, v in n_status.items())
              + (f"; took {state['seconds']:.0f} s (estimated {state.get('estimate_s', 0):.0f} s)"
                 if state.get("seconds") else "") + ". Measured.")
    fails = runs[runs["status"] == "failed"] if len(runs) else runs
    for why, g in (fails.groupby("reason", sort=False) if len(fails) else []):
        ids = list(g["run_id"])
        more = " …" if len(ids) > 3 else ""
        body.note(f"FAILED {len(ids)} run(s) ({', '.join(ids[:3])}{more}): {why}", "fail")
    bad = (runs[(runs["interleaving"] != "") & (runs["interleaving"] != "ok")]
           if len(runs) and "interleaving" in runs else runs.iloc[0:0])
    for why, g in (bad.groupby(bad["interleaving"].str.split(":").str[0], sort=False)
                   if len(bad) else []):
        cells = sorted({f"{a} {b}" for a, b in zip(g["workload"], g["cell_id"])})
        more = " …" if len(cells) > 4 else ""
        body.note(f"{len(g)} Table 2 run(s) not interleaved as requested ({why}; main quanta "
                  f"p50 not within {QUANTUM_TOLERANCE:.0%} of the requested quantum): "
                  f"{', '.join(cells[:4])}{more} — their cells do not measure the intended "
                  "interleaving (runs.csv, column interleaving)", "warn")
    atomic.write_table(out / "runs", runs)
    tables.append(("runs.csv", "every run (measured; failed and skipped runs with their reason)"))

    # Table 2
    t2 = _guard(failures, "table2", table2_table, runs, conds)
    t2 = t2 if t2 is not None else pd.DataFrame()
    body.heading("Section 2: L1 cache affinity (Table 2 cells)")
    body.text(STATS_TEXT)
    if len(t2):
        for w in [w for w in WORKLOADS if w in set(t2["workload"])]:
            t2w = t2[t2["workload"] == w]
            if t2w["n"].sum() == 0:
                continue
            png = _guard(failures, f"table2 grid {w}", fig_table2_grid, t2w, w,
                         out / f"table2-{w}")
            lo_n, hi_n = int(t2w["n"].min()), int(t2w["n"].max())
            n = f"{lo_n}" if lo_n == hi_n else f"{lo_n}–{hi_n}"
            figure(png, f"MEASURED: {w} ({_metric(runs, w)}), Table 2 grid: % difference vs BV_0, "
                        f"95% interval, n = {n} runs per cell")
        disp = pd.DataFrame({
            "workload": t2["workload"], "cell": t2["cell_id"], "n": t2["n"],
            "rate mean [95% CI]": _cis(t2, "mean", "lo", "hi", _mean_ci), "vs": t2["high_cell"],
            "% difference [95% CI]": _cis(t2, "pct", "pct_lo", "pct_hi"),
            "verdict (95%)": t2["verdict"], "metric": t2["metric"]})
        table("table2", t2, "Table 2 cells per workload (measured: mean rate over the runs, n "
                            "each; % difference vs BV_0 with its 95% Welch interval)",
              disp)
        qs = sorted({int(q) for q in t2["quantum_ms"]})
        q = 2 if 2 in qs else qs[0]
        groups = fig2_groups(t2, q)
        if groups:
            png = _guard(failures, "figure 2", fig_bars, groups, out / "fig2-low-retention",
                         "MEASURED on this machine (the paper's Figure 2 shape): low retention, "
                         f"{q} ms quantum — rate relative to high affinity (BV_0); whiskers ±2σ as "
                         "in the "
                         "paper; on top: % difference of the means (* = 95% interval excludes 0)",
                         RATE_AXIS)
            figure(png, f"MEASURED: low retention, {q} ms — high vs low affinity per workload "
                        "(the paper's Figure 2 shape; whiskers ±2σ, as the paper)")

    # Table 3
    t3 = _guard(failures, "table3", table3_table, runs, conds)
    t3 = t3 if t3 is not None else pd.DataFrame()
    wb = _guard(failures, "winback", winback_table, runs, conds)
    wb = wb if wb is not None else pd.DataFrame()
    if len(t3):
        body.heading("Section 3: L2 affinity (Table 3 pairs, 2 ms)")
        disp = pd.DataFrame({
            "main": t3["main"], "interfering": t3["interfering"],
            "n high/low": [f"{a}/{b}" for a, b in zip(t3["high_n"], t3["low_n"])],
            "high affinity [95% CI]": _cis(t3, "high_mean", "high_lo", "high_hi", _mean_ci),
            "low affinity [95% CI]": _cis(t3, "low_mean", "low_lo", "low_hi", _mean_ci),
            "% difference [95% CI]": _cis(t3, "pct", "pct_lo", "pct_hi"),
            "verdict (95%)": t3["verdict"], "metric": t3["metric"]})
        table("table3", t3, "Table 3 pairs (measured: main copies bound vs free to move, 2 ms)",
              disp)
        groups = t3_groups(t3, wb)
        if groups:
            png = _guard(failures, "figure 4/5", fig_bars, groups, out / "fig45-table3",
                         "MEASURED on this machine (the paper's Figures 4/5 shape): HI_AFF vs "
                         "LOW_AFF per main workload (+ interfering), 2 ms; rate relative to "
                         "HI_AFF; whiskers ±2σ as in the paper; on top: % difference (* = 95% "
                         "interval excludes 0)",
                         RATE_AXIS)
            figure(png, "MEASURED: Table 3 pairs, high vs low affinity (the paper's Figures 4/5 "
                        "shape; whiskers ±2σ, as the paper)")

    # Win-back
    if len(wb):
        body.heading("Beyond the paper: how much does --preheat win back?")
        body.text(WINBACK_TEXT)
        table("winback", wb, "win-back with --preheat (measured: low, low + preheat, high, high "
                             "+ preheat; n per condition in the table)", winback_display(wb))
        png = _guard(failures, "winback figure", fig_bars, winback_groups(wb), out / "winback",
                     "MEASURED on this machine: high and low affinity, each without and with "
                     "--preheat (and low + preheat counting the preheat's CPU time), relative "
                     "to high without preheat; whiskers ±2σ; on top: % vs high, the recovered "
                     "share on low + preheat", RATE_AXIS)
        figure(png, "MEASURED: win-back with --preheat (whiskers ±2σ)")

    # Refill, quanta
    rf = _guard(failures, "refill", refill_table, plan, conds)
    if rf is not None and len(rf):
        body.heading("Refill profile")
        table("refill", rf, "progress rate relative to the steady rate per bin of time since "
                            "resume (measured; runs = runs behind each bin)")
        figure(_guard(failures, "refill figure", fig_refill, rf, out / "refill"),
               "MEASURED: refill profile of the bundled kernels per interleaved vector")
    qt = _guard(failures, "quanta", quanta_table, runs)
    if qt is not None and len(qt):
        body.heading("Quanta achieved")
        table("quanta", qt, "quanta achieved vs requested per mechanism (measured: p50/p99 of "
                            "each run, median over runs; quanta = count behind them; how late "
                            "the controller switched, µs)")
        figure(_guard(failures, "quanta figure", fig_quanta, qt, out / "quanta"),
               "MEASURED: quanta achieved vs requested")

    # The paper
    body.heading("The paper's numbers beside ours")
    pt = _guard(failures, "paper", paper_table, t2, t3, runs, len(conds), opts.get("reps"))
    if pt is not None:
        table("paper", pt, "the paper's results (IPC on Clovertown/Niagara) beside ours "
                           f"(measured here: {metric})")

    for f in failures[:50]:
        rep.note(f, "fail")
    if len(failures) > 50:
        rep.note(f"… and {len(failures) - 50} more failures (runs.csv)", "fail")
    rep.parts.extend(body.parts)
    links = [t for t, _ in tables] + [p.name for p, _ in figures]
    rep.heading("Files")
    rep.html("<p class='note'>" + ", ".join(
        f"<a href='{html.escape(f)}'>{html.escape(f)}</a>" for f in links)
        + "; raw CLI outputs under raw/ (topology.json, plan.json, one JSON per run).</p>")
    headline: dict[str, Any] = {}
    if len(t2):
        l1 = t2[t2["affinity"].isin(["low-d", "low-i"])]
        headline["l1_cells"] = len(l1)
        headline["l1_significant"] = int(l1["significant"].eq(True).sum())
    if len(t3) and t3["pct"].notna().any():
        headline["table3_mean_pct"] = float(t3["pct"].mean())
        headline["table3_min_pct"] = float(t3["pct"].min())
    if len(wb):
        headline["winback"] = [{"workload": r.workload, "experiment": r.experiment,
                                "recovered": _num(r.recovered), "note": r.recovered_note}
                               for r in wb.itertuples()]
    summary = {**state, "runs": {k: int(v) for k, v in n_status.items()}, "conditions": len(conds),
               "headline": headline, "label": LABEL,
               "figures": [{"file": p.name, "title": t} for p, t in figures],
               "tables": [{"file": f, "title": t} for f, t in tables]}
    atomic.write_json(out / "summary.json", summary)
    rep.write(out / "report.html")
    return {"figures": figures, "tables": tables, "runs": runs, "table2": t2, "table3": t3,
            "winback": wb}
