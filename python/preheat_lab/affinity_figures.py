"""preheat lab affinity: the figures (matplotlib, Agg; each saved as .png and .svg). Every
title says MEASURED; bar whiskers are ±2σ, as in the paper's figures."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from . import labreport, stats
from .affinity_plan import AFFINITY_NAME, AFFINITY_ORDER, MIN_N, STANDS_FOR, WORKLOADS

COLORS = {"high": "#222222", "low-d": "#ffffff", "low-i": "#ffffff", "low-d-l2": "#ffffff",
          "low": "#ffffff", "preheat": "#9ecae1", "cost": "#deebf7", "high_pre": "#3182bd"}
HATCH = {"low-d": "", "low-i": "//", "low-d-l2": "xx", "low": "", "preheat": "", "cost": "..",
         "high_pre": ""}


_num = labreport._num  # the one finite-float parser of the lab's reports
_pct = labreport.signed_pct
_pct_ci = labreport.signed_pct_ci
_plt = labreport.plt
_save = labreport.save_figure


def fig_table2_grid(t2w: pd.DataFrame, w: str, base: Path) -> Path:
    """Rows retention, columns affinity, one panel per quantum; each low cell annotated with
    its % difference vs BV_0 (95% interval; * = significant)."""
    plt = _plt()
    qs = sorted(int(q) for q in t2w["quantum_ms"].unique())
    affs = [a for a in AFFINITY_ORDER if a in set(t2w["affinity"])]
    rets = [r for r in ("high", "low") if r in set(t2w["retention"])]
    vals = stats.clean(100 * t2w["pct"].astype(float))
    vmax = max(5.0, float(np.abs(vals).max()) if len(vals) else 5.0)
    width = 0.8 + 1.9 * len(affs) * len(qs)
    fig, axes = plt.subplots(1, len(qs), figsize=(width, 2.2 + 1.3 * len(rets)), squeeze=False,
                             constrained_layout=True)
    im = None
    for ax, q in zip(axes[0], qs):
        m = np.full((len(rets), len(affs)), np.nan)
        texts = []
        for i, ret in enumerate(rets):
            for j, aff in enumerate(affs):
                r = t2w[(t2w["quantum_ms"] == q) & (t2w["retention"] == ret)
                        & (t2w["affinity"] == aff)]
                if r.empty:
                    continue
                r = r.iloc[0]
                if aff == "high":
                    txt = f"{r['interleaved']}\nreference\nn={int(r['n'])}"
                else:
                    m[i, j] = 100 * pct if (pct := _num(r["pct"])) is not None else np.nan
                    star = "*" if r["significant"] else ""
                    txt = (f"{r['interleaved']}\n{_pct(r['pct'])}{star}\n"
                           f"[{_pct(r['pct_lo'])}, {_pct(r['pct_hi'])}]\nn={int(r['n'])}")
                dark = bool(np.isfinite(m[i, j]) and abs(m[i, j]) > 0.6 * vmax)
                texts.append((j, i, txt, dark))
        im = ax.imshow(m, cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
        for j, i, txt, dark in texts:
            ax.text(j, i, txt, ha="center", va="center", fontsize=6.5,
                    color="white" if dark else "black")
        ax.set_xticks(range(len(affs)))
        ax.set_xticklabels([AFFINITY_NAME[a].replace(" affinity", "\naffinity") for a in affs],
                           fontsize=7)
        ax.set_yticks(range(len(rets)))
        ax.set_yticklabels([f"{r} retention" for r in rets], fontsize=7)
        ax.set_title(f"{q} ms quantum", fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="% difference vs BV_0")
    fig.suptitle(textwrap.fill(
        f"MEASURED on this machine: {w} (stands for {STANDS_FOR.get(w)}), Table 2 — rate vs "
        "BV_0 at the same retention and quantum; % difference of the means, 95% Welch interval "
        f"(/ BV_0's mean); * = the interval excludes 0 (judged with ≥ {MIN_N} runs per cell)",
        int(width * 15)), fontsize=8)
    return _save(fig, base)


def fig_bars(groups: list[dict], base: Path, title: str, ylabel: str) -> Path:
    """Paired bars per group (the paper's Figures 2/4/5 shape): each bar a mean relative to the
    group's reference, whiskers ±2σ (as the paper), a text on top (the % difference)."""
    plt = _plt()
    nb = max((len(g["bars"]) for g in groups), default=1)
    width_in = max(7.0, 1.5 + 0.45 * nb * len(groups) + 0.3 * len(groups))
    fig, ax = plt.subplots(figsize=(width_in, 5.2))
    width = 0.8 / nb
    named = set()
    top = 1.0
    for i, g in enumerate(groups):
        for j, b in enumerate(g["bars"]):
            v = _num(b["value"])
            if v is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            lab = b["name"] if b["name"] not in named else None
            named.add(b["name"])
            ax.bar(x, v, width * 0.9, color=b.get("color", "#fff"), edgecolor="k",
                   hatch=b.get("hatch", ""), label=lab)
            e = _num(b.get("err"))
            if e is not None:
                ax.errorbar(x, v, yerr=e, color="#555", capsize=2, lw=0.9)
            y = v + (e or 0) + 0.01
            top = max(top, y)
            if b.get("text"):
                ax.text(x, y, b["text"], ha="center", va="bottom", fontsize=6.5, rotation=90)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g["label"] for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.18)
    ax.set_xlim(-0.6, max(len(groups), 2.5) - 0.4)
    ax.axhline(1.0, color="#999", lw=0.7, ls=":")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(textwrap.fill(title, int(width_in * 15)), fontsize=8.5)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return _save(fig, base)


def _bar(name: str, s: dict, ref: float, text: str = "", key: str = "high") -> dict:
    ok = ref and _num(s["mean"]) is not None
    return {"name": name, "value": s["mean"] / ref if ok else None,
            "err": 2 * s["sd"] / ref if ok and _num(s["sd"]) is not None else None,
            "text": text, "color": COLORS.get(key, "#fff"), "hatch": HATCH.get(key, "")}


def fig2_groups(t2: pd.DataFrame, q: int) -> list[dict]:
    """Low retention at quantum Q: per workload high (BV_0) vs each low cell."""
    groups = []
    d = t2[(t2["retention"] == "low") & (t2["quantum_ms"] == q)]
    for w in [w for w in WORKLOADS if w in set(d["workload"])]:
        g = d[d["workload"] == w]
        hi = g[g["affinity"] == "high"]
        if hi.empty or not _num(hi.iloc[0]["mean"]):
            continue
        h = hi.iloc[0]
        ref = float(h["mean"])
        bars = [_bar("high affinity (BV_0)", {"mean": h["mean"], "sd": h["sd"]}, ref)]
        for aff in ("low-d", "low-i", "low-d-l2"):
            r = g[g["affinity"] == aff]
            if r.empty:
                continue
            r = r.iloc[0]
            bars.append(_bar(f"{AFFINITY_NAME[aff]} ({r['interleaved']})",
                             {"mean": r["mean"], "sd": r["sd"]}, ref,
                             _pct(r["pct"]) + ("*" if r["significant"] else ""), aff))
        groups.append({"label": f"{w}\n({STANDS_FOR.get(w, '').split(' (')[0]})\nn={int(h['n'])}",
                       "bars": bars})
    return groups


def t3_groups(t3: pd.DataFrame, wb: pd.DataFrame) -> list[dict]:
    """Per Table 3 pair: HI_AFF vs LOW_AFF and, where the win-back ran, both with --preheat."""
    groups = []
    for r in t3.itertuples():
        ref = _num(r.high_mean)
        if not ref:
            continue
        bars = [_bar("HI_AFF", {"mean": r.high_mean, "sd": r.high_sd}, ref)]
        w = (wb[(wb["experiment"] == "table3") & (wb["workload"] == r.main)
                & (wb["low_cond"].str.contains(f"+{r.interfering}-", regex=False))]
             if len(wb) else wb)
        x = w.iloc[0] if len(w) else None
        if x is not None:
            bars.append(_bar("HI_AFF + --preheat (beyond the paper)",
                             {"mean": x["high_pre_mean"], "sd": x["high_pre_sd"]}, ref,
                             _pct(x["preheat_alone"]), "high_pre"))
        bars.append(_bar("LOW_AFF", {"mean": r.low_mean, "sd": r.low_sd}, ref,
                         _pct(r.pct) + ("*" if r.significant else ""), "low"))
        if x is not None:
            bars.append(_bar("LOW_AFF + --preheat (beyond the paper)",
                             {"mean": x["low_pre_mean"], "sd": x["low_pre_sd"]}, ref,
                             _pct(x["low_pre_mean"] / ref - 1) if _num(x["low_pre_mean"]) else "",
                             "preheat"))
        groups.append({"label": f"{r.main}\n+{r.interfering}\nn={r.high_n}/{r.low_n}",
                       "bars": bars})
    return groups


def winback_groups(wb: pd.DataFrame) -> list[dict]:
    """Per win-back comparison: high, high + preheat, low, low + preheat (and its rate counting
    the preheat's CPU time), relative to high without preheat."""
    groups = []
    for r in wb.itertuples():
        ref = _num(r.high_mean)
        if not ref:
            continue
        rec = ((_pct(r.recovered, 0).lstrip("+") + " recovered")
               if _num(r.recovered) is not None else "recovered: undefined")
        bars = [_bar("high affinity", {"mean": r.high_mean, "sd": r.high_sd}, ref),
                _bar("high + --preheat", {"mean": r.high_pre_mean, "sd": r.high_pre_sd}, ref,
                     _pct(r.preheat_alone), "high_pre"),
                _bar("low affinity", {"mean": r.low_mean, "sd": r.low_sd}, ref, _pct(r.loss),
                     "low"),
                _bar("low + --preheat", {"mean": r.low_pre_mean, "sd": r.low_pre_sd}, ref, rec,
                     "preheat"),
                _bar("low + --preheat, rate counting the preheat's CPU time",
                     {"mean": r.low_pre_cost_mean, "sd": r.low_pre_cost_sd}, ref, "", "cost")]
        tag = "T2" if r.experiment == "table2" else "T3"
        n = f"{r.high_n}/{r.high_pre_n}/{r.low_n}/{r.low_pre_n}"
        groups.append({"label": f"{r.workload}\n{tag}\nn={n}", "bars": bars})
    return groups


def fig_refill(rf: pd.DataFrame, base: Path) -> Path | None:
    plt = _plt()
    ws = [w for w in WORKLOADS if w in set(rf["workload"])]
    if not ws:
        return None
    width = max(7.0, 1 + 4.6 * len(ws))
    fig, axes = plt.subplots(1, len(ws), figsize=(width, 4.4), squeeze=False, sharey=True)
    for ax, w in zip(axes[0], ws):
        g = rf[(rf["workload"] == w) & (~rf["preheat"])]
        for (vec, ret), h in g.groupby(["interleaved", "retention"], sort=True):
            x = (h["from_us"] + h["to_us"].fillna(2 * h["from_us"])) / 2  # open last bin
            ax.plot(x.clip(lower=1), h["rate_rel"], marker=".", ls="-" if ret == "low" else "--",
                    label=f"{vec}, {ret} retention (runs {int(h['runs'].max())})")
        ax.set_xscale("log")
        ax.axhline(1.0, color="#999", lw=0.7)
        ax.set_xlabel("time since the main workload resumed, µs (bin middle)")
        ax.set_title(f"{w} (stands for {STANDS_FOR.get(w)})", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5)
    axes[0][0].set_ylabel("progress rate relative to the steady rate")
    fig.suptitle(textwrap.fill("MEASURED on this machine: refill profile — progress rate after "
                               "each resume, per interleaved vector (mean over runs and quanta; "
                               "dashed: high retention)", int(width * 14)), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return _save(fig, base)


def fig_quanta(qt: pd.DataFrame, base: Path) -> Path | None:
    """Achieved / requested quantum (p50 and p99 of each run, median over runs) per mechanism
    and role, against the requested quantum."""
    plt = _plt()
    if qt.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="achieved = requested")
    groups = list(qt.groupby(["mechanism", "role"], sort=True))
    for k, ((mech, role), g) in enumerate(groups):
        col = f"C{k}"
        x = g["requested_ms"] * (1 + 0.04 * (k - (len(groups) - 1) / 2))  # side by side
        ax.plot(x, g["p50_ms_median_over_runs"] / g["requested_ms"], "o", color=col,
                label=f"{mech}, {role}: p50 (median over runs)")
        ax.plot(x, g["p99_ms_median_over_runs"] / g["requested_ms"], "^", color=col, mfc="none",
                label=f"{mech}, {role}: p99 (median over runs)")
    ax.set_xscale("log")
    ax.set_xlabel("requested quantum, ms")
    ax.set_ylabel("achieved / requested quantum")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("MEASURED on this machine: quanta achieved vs requested (runs per point: "
                 f"{int(qt['runs'].min())}–{int(qt['runs'].max())})", fontsize=9)
    fig.tight_layout()
    return _save(fig, base)
