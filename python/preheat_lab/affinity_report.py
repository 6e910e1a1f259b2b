"""preheat lab affinity: statistics, tables, figures and report.html (the runs: affinity.py).

Statistics (all from stats.py, nothing re-implemented here):

* per condition (workload × cell × preheat): mean and 95% interval `stats.mean_ci_t`
  (mean ± 1.96 s/√n) of the rate, and the standard deviation (the figures' whiskers are 2σ,
  as the paper's);
* % difference of a low-affinity cell vs its matching high cell (BV_0 at the same retention
  and quantum; Table 3: the same pair with high affinity): mean(low)/mean(high) − 1 with a 95%
  percentile interval from `stats.paired_bootstrap` over rounds (every round ran every
  condition once, so resampling whole rounds keeps what drifted during a round together);
  significant only when the interval excludes 0;
* win-back: recovered share = (rate_preheat − rate_low)/(rate_high − rate_low)
  (`stats.part_share_fn`, same bootstrap), undefined unless the low-affinity loss is
  significant; the preheat's CPU time as a share of the run's; the rate including it.
"""

from __future__ import annotations

import html
import math
import sys
import traceback
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from . import atomic, stats
from .affinity import (BUNDLED, MIN_ROUNDS, STANDS_FOR, WHAT, WORKLOADS, high_cell_id,
                       matrix_rows, substitutions, t2_cond_id, t3_cond_id)
from .affinity_figures import (_num, _pct_ci, fig2_groups, fig_bars, fig_quanta, fig_refill,
                               fig_table2_grid, t3_groups, winback_groups)
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


def winback_display(wb: pd.DataFrame) -> pd.DataFrame:
    rec = [_share(a, b, c) if _num(a) is not None else n for a, b, c, n in
           zip(wb["recovered"], wb["recovered_lo"], wb["recovered_hi"], wb["recovered_note"])]
    rec_cost = [_share(a, b, c) if _num(a) is not None else "undefined" for a, b, c in
                zip(wb["recovered_with_cost"], wb["recovered_with_cost_lo"],
                    wb["recovered_with_cost_hi"])]
    return pd.DataFrame({
        "workload": wb["workload"], "comparison": wb["comparison"],
        "n high/low/preheat": [f"{a}/{b}/{c}" for a, b, c in
                               zip(wb["high_n"], wb["low_n"], wb["preheat_n"])],
        "low vs high [95% CI]": [f"{x} ({v})" for x, v in
                                 zip(_cis(wb, "loss", "loss_lo", "loss_hi"), wb["loss_verdict"])],
        "preheat vs low [95% CI]": _cis(wb, "gain", "gain_lo", "gain_hi"),
        "recovered share [95% CI]": rec,
        "recovered, counting the preheat's CPU [95% CI]": rec_cost,
        "preheat CPU / run CPU [95% CI]": _cis(wb, "preheat_cost_share", "preheat_cost_share_lo",
                                               "preheat_cost_share_hi", _share, d=2)})


def runs_table(plan: Sequence[dict], conds: Dict[str, dict]) -> pd.DataFrame:
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
        r["stands_for"] = d.get("stands_for") or STANDS_FOR.get(w)
        r["metric"] = d.get("metric")
        for k in ("rate", "work", "cpu_s", "wall_s", "preheat_cpu_s", "rate_with_preheat_cost",
                  "ipc", "mpi"):
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


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"] if len(runs) else runs


def cond_stats(runs: pd.DataFrame, cond: str, col: str = "rate") -> dict:
    """n, mean, 95% interval (stats.mean_ci_t) and σ of COL over the ok runs of COND."""
    ok = _ok(runs)
    v = stats.clean(ok.loc[ok["cond"] == cond, col]) if len(ok) and col in ok else np.array([])
    m, lo, hi = stats.mean_ci_t(v)
    sd = float(v.std(ddof=1)) if len(v) > 1 else (0.0 if len(v) else math.nan)
    return {"n": len(v), "mean": m, "lo": lo, "hi": hi, "sd": sd}


def _matrix(runs: pd.DataFrame, modes: Dict[str, Tuple[str, str]]):
    """A rounds × modes matrix: MODES maps a mode name to (condition, column)."""
    ok = _ok(runs)
    parts = []
    for mode, (cond, col) in modes.items():
        g = ok[ok["cond"] == cond] if len(ok) else ok
        if len(g) and col in g:
            parts.append(pd.DataFrame({"round": g["round"], "mode": mode, "v": g[col]}))
    df = pd.concat(parts) if parts else pd.DataFrame(columns=["round", "mode", "v"])
    df = df.dropna(subset=["v"])
    return stats.round_matrix(df, list(modes), "v")[0]


def paired(runs: pd.DataFrame, modes: Dict[str, Tuple[str, str]], fns: Dict[str, Callable],
           boot: int = stats.DEFAULT_BOOT,
           need: Sequence[str] = ()) -> Tuple[Dict[str, stats.Derived], int]:
    """stats.paired_bootstrap of FNS over the rounds × MODES matrix, and the number of rounds
    that have every mode in NEED (default: all)."""
    mat = _matrix(runs, modes)
    cols = [list(modes).index(m) for m in (need or modes)]
    rounds = int(np.all(np.isfinite(mat[:, cols]), axis=1).sum()) if mat.size else 0
    with warnings.catch_warnings():  # a mode without samples: NaN (undefined), said elsewhere
        warnings.simplefilter("ignore", RuntimeWarning)
        return stats.paired_bootstrap(mat, list(modes), fns, boot=boot), rounds


def paired_pct(runs: pd.DataFrame, low: str, high: str, boot: int = stats.DEFAULT_BOOT,
               col: str = "rate") -> Tuple[stats.Derived, int]:
    """mean(low)/mean(high) − 1 with a 95% paired bootstrap interval over rounds, and the
    number of rounds with both."""
    res, rounds = paired(runs, {"high": (high, col), "low": (low, col)},
                         {"pct": lambda s: s["low"] / s["high"] - 1}, boot)
    return res["pct"], rounds


def excludes_zero(d: stats.Derived) -> bool:
    lo, hi = _num(d.lo), _num(d.hi)
    return lo is not None and hi is not None and (lo > 0 or hi < 0)


def significant(d: stats.Derived, rounds: int) -> Optional[bool]:
    """True when the interval excludes 0, False when it does not, None (not assessed) with
    fewer than MIN_ROUNDS paired rounds: the percentile bootstrap over 2 rounds excludes 0 in
    about half of the cases without any true difference."""
    if rounds < MIN_ROUNDS:
        return None
    return excludes_zero(d)


def verdict(sig: Optional[bool], rounds: int) -> str:
    if sig is None:
        return f"not assessed ({rounds} paired round(s) < {MIN_ROUNDS})"
    return "significant" if sig else "not significant"


def _stat_cols(prefix: str, s: dict) -> dict:
    return {f"{prefix}n": s["n"], f"{prefix}mean": s["mean"], f"{prefix}lo": s["lo"],
            f"{prefix}hi": s["hi"], f"{prefix}sd": s["sd"]}


def _metric(runs: pd.DataFrame, w: str) -> str:
    ok = _ok(runs)
    m = ok.loc[ok["workload"] == w, "metric"].dropna() if len(ok) else []
    if len(m):
        return str(m.iloc[0])
    return "work per CPU-second" if w in BUNDLED else "jobs per CPU-second"


def table2_table(runs: pd.DataFrame, conds: Dict[str, dict], boot: int) -> pd.DataFrame:
    """Per workload × Table 2 cell (no preheat): the rate and, for low cells, the % difference
    vs BV_0 at the same retention and quantum."""
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
            hs = cond_stats(runs, hc)
            d, rounds = paired_pct(runs, c["cond"], hc, boot)
            sig = significant(d, rounds)
            r.update({"high_cell": high_cell_id(c), **_stat_cols("high_", hs), "pct": d.value,
                      "pct_lo": d.lo, "pct_hi": d.hi, "rounds": rounds, "significant": sig,
                      "verdict": verdict(sig, rounds)})
        else:
            r.update({"high_cell": "(this is the reference)", "pct": None, "pct_lo": None,
                      "pct_hi": None, "rounds": None, "significant": None,
                      "verdict": "reference"})
        r["label"] = LABEL
        rows.append(r)
    return pd.DataFrame(rows)


def table3_table(runs: pd.DataFrame, conds: Dict[str, dict], boot: int) -> pd.DataFrame:
    rows = []
    for c in conds.values():
        if c["experiment"] != "table3" or c["preheat"] or c["affinity"] != "low":
            continue
        w, w2 = c["workload"], c["interfering"]
        hc = t3_cond_id(w, w2, "high", False)
        hs, ls = cond_stats(runs, hc), cond_stats(runs, c["cond"])
        d, rounds = paired_pct(runs, c["cond"], hc, boot)
        sig = significant(d, rounds)
        rows.append({"main": w, "interfering": w2, "stands_for": STANDS_FOR.get(w),
                     "quantum_ms": c["quantum_ms"], "metric": _metric(runs, w),
                     **_stat_cols("high_", hs), **_stat_cols("low_", ls), "pct": d.value,
                     "pct_lo": d.lo, "pct_hi": d.hi, "rounds": rounds, "significant": sig,
                     "verdict": verdict(sig, rounds), "label": LABEL})
    return pd.DataFrame(rows)


def winback_table(runs: pd.DataFrame, conds: Dict[str, dict], boot: int) -> pd.DataFrame:
    """Per `--preheat` condition: the loss low vs high, the share of it the preheat recovers
    (undefined unless the loss is significant), the preheat's CPU cost and the rate with it."""
    rows = []
    for c in conds.values():
        if not c["preheat"]:
            continue
        w = c["workload"]
        if c["experiment"] == "table2":
            low, high = t2_cond_id(w, c["cell_id"], False), t2_cond_id(w, high_cell_id(c), False)
            where = f"Table 2 cell {c['cell_id']} vs {high_cell_id(c)}"
        else:
            low = t3_cond_id(w, c["interfering"], "low", False)
            high = t3_cond_id(w, c["interfering"], "high", False)
            where = f"Table 3 {w}+{c['interfering']}, low vs high affinity"
        modes = {"high": (high, "rate"), "low": (low, "rate"), "pre": (c["cond"], "rate"),
                 "pre_cost": (c["cond"], "rate_with_preheat_cost")}
        res, rounds = paired(runs, modes, {
            "loss": lambda s: s["low"] / s["high"] - 1,
            "gain": lambda s: s["pre"] / s["low"] - 1,
            "share": stats.part_share_fn("pre", "low", "high", "low"),
            "share_cost": stats.part_share_fn("pre_cost", "low", "high", "low")}, boot,
            need=("high", "low"))
        loss = res["loss"]
        sig = significant(loss, rounds)
        defined = bool(sig) and (_num(loss.value) or 0) < 0
        sh, shc = res["share"], res["share_cost"]
        cost = cond_stats(runs, c["cond"], "preheat_share")
        r = {"workload": w, "experiment": c["experiment"], "comparison": where,
             "high_cond": high, "low_cond": low, "preheat_cond": c["cond"],
             **_stat_cols("high_", cond_stats(runs, high)),
             **_stat_cols("low_", cond_stats(runs, low)),
             **_stat_cols("preheat_", cond_stats(runs, c["cond"])),
             **_stat_cols("with_cost_", cond_stats(runs, c["cond"], "rate_with_preheat_cost")),
             "loss": loss.value, "loss_lo": loss.lo, "loss_hi": loss.hi,
             "rounds": rounds, "loss_significant": sig, "loss_verdict": verdict(sig, rounds),
             "gain": res["gain"].value, "gain_lo": res["gain"].lo, "gain_hi": res["gain"].hi,
             "recovered": sh.value if defined else None,
             "recovered_lo": sh.lo if defined else None, "recovered_hi": sh.hi if defined else None,
             "recovered_undefined_share": sh.undefined_share if defined else None,
             "recovered_with_cost": shc.value if defined else None,
             "recovered_with_cost_lo": shc.lo if defined else None,
             "recovered_with_cost_hi": shc.hi if defined else None,
             "preheat_cost_share": cost["mean"], "preheat_cost_share_lo": cost["lo"],
             "preheat_cost_share_hi": cost["hi"],
             "recovered_note": ("" if defined else
                                f"undefined: the low-affinity loss is {verdict(sig, rounds)}, "
                                "so there is no loss to win back" if not sig else
                                "undefined: low affinity was faster than high here"),
             "label": LABEL}
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
            rows.append({"mechanism": mech, "requested_ms": req, "role": role, "runs": len(p50),
                         "quanta": int(np.nansum(g[f"q_{role}_n"])),
                         "p50_ms_median_over_runs": med,
                         "p99_ms_median_over_runs": stats.quantile(p99, 0.5),
                         "p99_ms_max": float(p99.max()) if len(p99) else None,
                         "p50_over_requested": med / req if req else None, "label": LABEL})
    return pd.DataFrame(rows)


def refill_table(plan: Sequence[dict], conds: Dict[str, dict]) -> pd.DataFrame:
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
    out = df.groupby(keys, sort=True).agg(runs=("rate_rel", "size"), rate_rel=("rate_rel", "mean"),
                                          units=("units", "sum")).reset_index()
    out["label"] = LABEL
    return out


def paper_table(t2: pd.DataFrame, t3: pd.DataFrame, runs: pd.DataFrame, n_conds: int,
                reps: int) -> pd.DataFrame:
    """The paper's numbers beside ours."""
    rows = []
    l1 = t2[t2["affinity"].isin(["low-d", "low-i"])] if len(t2) else t2
    if len(l1):
        sig = l1[l1["significant"] == True]  # noqa: E712 (None for missing)
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
        sig = l2[l2["significant"] == True]  # noqa: E712
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
                f"{int(deg.notna().sum())} pair(s); {int((t3['significant'] == True).sum())} "  # noqa: E712
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


def _guard(failures: List[str], what: str, fn: Callable, *a, **kw):
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
STATS_TEXT = (
    "Statistics (measured): per condition the mean rate with a 95% interval mean ± 1.96·s/√n "
    "(stats.mean_ci_t, a normal approximation: with 5 samples a t-interval would be ~1.4× "
    "wider); the % difference of a low-affinity cell vs BV_0 at the same retention and quantum "
    "(Table 3: vs the same pair with high affinity) is mean(low)/mean(high) − 1 with a 95% "
    "percentile interval from a paired bootstrap over rounds (stats.paired_bootstrap: every "
    "round ran every condition once in a shuffled order; with few rounds the interval is "
    "coarse); significant = the interval excludes 0, judged only with at least "
    f"{MIN_ROUNDS} paired rounds (else: not assessed). Calibration of this interval (simulated, "
    "normal noise, no true difference): it excluded 0 in ~46% of cases with 2 rounds, ~15% with "
    "5 and ~10% with 8–10 (nominal 5%): a marginal 'significant' at the default 5 rounds is "
    "weak evidence; more --reps make it stricter. Bar figures: whiskers are ±2 standard "
    "deviations, as the paper's figures (not confidence intervals).")


def render(out: Path, topo: dict, conds: Dict[str, dict], plan: Sequence[dict],
           state: dict) -> dict:
    """Every table, figure, summary.json and report.html from the plan's runs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    failures = state.setdefault("failures", [])
    opts = state.get("options") or {}
    boot = 500 if opts.get("quick") else stats.DEFAULT_BOOT
    figures: List[Tuple[Path, str]] = []
    tables: List[Tuple[str, str]] = []
    rep = Report("preheat lab affinity: cache affinity on this machine (Kazempour et al.)")
    body = Report("")
    runs = runs_table(plan, conds)

    def table(name: str, df: pd.DataFrame, caption: str, display: Optional[pd.DataFrame] = None):
        atomic.write_table(out / name, df)
        tables.append((f"{name}.csv", caption))
        if display is not None or len(df):
            body.table(display if display is not None else df, caption)

    def figure(png: Optional[Path], title: str):
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
    atomic.write_table(out / "runs", runs)
    tables.append(("runs.csv", "every run (measured; failed and skipped runs with their reason)"))

    # Table 2
    t2 = _guard(failures, "table2", table2_table, runs, conds, boot)
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
                            "each; % difference vs BV_0 with its 95% paired-bootstrap interval)",
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
    t3 = _guard(failures, "table3", table3_table, runs, conds, boot)
    t3 = t3 if t3 is not None else pd.DataFrame()
    wb = _guard(failures, "winback", winback_table, runs, conds, boot)
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
        body.text("Recovered share = (rate with --preheat − rate low)/(rate high − rate low), "
                  "paired bootstrap over rounds; undefined when the low-affinity loss is not "
                  "significant. The preheat's CPU time is reported by the CLI (preheat_cpu_s); "
                  "'with cost' divides the work by the run's CPU time plus the preheat's. "
                  "Measured.")
        table("winback", wb, "win-back with --preheat (measured; n per condition in the table)",
              winback_display(wb))
        png = _guard(failures, "winback figure", fig_bars, winback_groups(wb), out / "winback",
                     "MEASURED on this machine: high vs low affinity vs low with --preheat (and "
                     "its rate counting the preheat's CPU time), relative to high; whiskers ±2σ",
                     RATE_AXIS)
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
                            "each run, median over runs; quanta = count behind them)")
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
    headline = {}
    if len(t2):
        l1 = t2[t2["affinity"].isin(["low-d", "low-i"])]
        headline["l1_cells"] = len(l1)
        headline["l1_significant"] = int((l1["significant"] == True).sum())  # noqa: E712
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
