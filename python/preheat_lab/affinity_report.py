"""preheat lab affinity: report.html and summary.json — the machine and the plan, the runs,
Table 2 and Figure 2, Table 3 and Figures 4/5, the win-back, refill and quanta, the paper's
numbers beside ours; each part guarded (a failing part is reported, the rest renders).

The runs: affinity.py; the statistics and tables: affinity_analysis.py; the figures:
affinity_figures.py. This module keeps the analysis' public names importable as
`affinity_report.NAME`.
"""

from __future__ import annotations

import html
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, TypeVar

import pandas as pd

from . import atomic
from .affinity_analysis import (
    LABEL,
    QUANTUM_TOLERANCE,
    _g,
    _metric,
    cond_stats,
    cond_values,
    interleaving_check,
    pct_diff,
    pct_vs,
    quanta_table,
    refill_table,
    runs_table,
    significant,
    table2_table,
    table3_table,
    verdict,
    winback_groups_of,
    winback_table,
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
from .affinity_plan import (
    BUNDLED,
    MIN_N,
    STANDS_FOR,
    WHAT,
    WORKLOADS,
    matrix_rows,
    substitutions,
)
from .report import Report

__all__ = [
    "INTRO", "LABEL", "NO_PMU", "PAPER_L1", "PAPER_MMP", "PAPER_SIZE", "PAPER_UMP",
    "QUANTUM_TOLERANCE", "RATE_AXIS", "STATS_TEXT", "WINBACK_TEXT",
    "cond_stats", "cond_values", "correspondence", "interleaving_check", "paper_table",
    "pct_diff", "pct_vs", "quanta_table", "refill_table", "render", "runs_table", "significant",
    "table2_table", "table3_table", "verdict", "winback_display", "winback_groups_of",
    "winback_table",
]


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


def _mean_ci(v: object, lo: object, hi: object) -> str:
    return "–" if _num(v) is None else f"{_g(v)} [{_g(lo)}, {_g(hi)}]"


def _cis(df: pd.DataFrame, v: str, lo: str, hi: str, fmt: Callable[..., str] = _pct_ci,
         **kw: Any) -> list:
    """A column's values with their intervals, formatted per row."""
    return [fmt(a, b, c, **kw) for a, b, c in zip(df[v], df[lo], df[hi])]


def _share(v: object, lo: object, hi: object, d: int = 0) -> str:
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


T = TypeVar("T")


def _guard(failures: list[str], what: str, fn: Callable[..., T], *a: Any, **kw: Any) -> T | None:
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

    def table(name: str, df: pd.DataFrame, caption: str,
              display: pd.DataFrame | None = None) -> None:
        atomic.write_table(out / name, df)
        tables.append((f"{name}.csv", caption))
        if display is not None or len(df):
            body.table(display if display is not None else df, caption)

    def figure(png: Path | None, title: str) -> None:
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
    void = (runs[runs["void_attempt"].fillna("").astype(str) != ""]
            if len(runs) and "void_attempt" in runs else runs.iloc[0:0])
    for r in void.itertuples():
        body.note(f"REPEATED {r.run_id}: its first attempt was void ({r.void_attempt}); the "
                  f"repetition is {r.status}, and only it counts", "warn")
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
