"""preheat lab affinity: the runs → tables with their statistics — one row per run with the
CLI's numbers, the Table 2 cells, the Table 3 pairs, the win-back comparisons, achieved quanta and
refill profiles.

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

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from . import stats
from .affinity_figures import _num
from .affinity_plan import (
    BUNDLED,
    MIN_N,
    STANDS_FOR,
    high_cell_id,
    t2_cond_id,
    t3_cond_id,
)

LABEL = "measured"


def _g(v: object) -> str:
    f = _num(v)
    return "–" if f is None else f"{f:.4g}"


def runs_table(plan: Sequence[dict], conds: dict[str, dict]) -> pd.DataFrame:
    """One row per planned run (ok, failed, skipped, not run) with the CLI's numbers."""
    rows = []
    for rec in plan:
        c = conds.get(rec["cond"], {})
        d = rec.get("data") or {}
        q = d.get("quanta") or {}
        w = c.get("workload")
        r = {k: rec.get(k) for k in ("run_id", "round", "order", "cond", "status", "reason",
                                     "seconds", "command", "void_attempt")}
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


def interleaving_check(requested_ms: object, p50_ms: object, n: object) -> str:
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
