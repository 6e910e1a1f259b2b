"""preheat lab cosched: the figures — improvement over full coscheduling per scenario and kernel
(the paper's Figures 6/7 shape, measured and simulated), co-run fraction and idle CPU share per
policy, partial-auto's communication matrices as heatmaps and their dependency trees."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pandas as pd

from . import atomic, cli, comm, labreport, stats
from .cli import ToolError
from .cosched_plan import KERNELS, PARTIAL, POLICIES, SCENARIOS
from .cosched_tables import _num, _regroup_events
from .npb import STANDS_IN_FOR

COLORS = {"partial-static": "#1f77b4", "partial-auto": "#ff7f0e", "none": "#7f7f7f",
          "full": "#2ca02c"}


_plt = labreport.plt
_save = labreport.save_figure


def fig_improvement(df: pd.DataFrame, base: Path, title: str, whisker: str,
                    marker: bool) -> Path:
    """Figures 6/7's shape: per scenario, grouped bars per kernel of the improvement over full
    for partial-static and partial-auto (columns value, lo, hi, predicted[, simulated]); the
    predicted value dashed; the simulated value (MARKER) as a diamond beside each bar."""
    plt = _plt()
    scen = [s for s in SCENARIOS if s in set(df["scenario"])] + sorted(
        set(df["scenario"]) - set(SCENARIOS))
    pols = [p for p in PARTIAL if p in set(df["policy"])]
    fig, axes = plt.subplots(1, len(scen), figsize=(1.5 + 4.2 * len(scen), 4.8), sharey=True,
                             squeeze=False)
    width = 0.8 / max(1, len(pols))
    labeled = set()

    def lab(name: str) -> str | None:
        if name in labeled:
            return None
        labeled.add(name)
        return name

    for ax, s in zip(axes[0], scen):
        d = df[df["scenario"] == s]
        ks = [k for k in KERNELS if k in set(d["kernel"])] + sorted(set(d["kernel"]) - set(KERNELS))
        preds = stats.clean(d["predicted"] if "predicted" in d else [])
        one_pred = len(preds) and len({round(float(p), 6) for p in preds}) == 1
        if one_pred:
            ax.axhline(100 * float(preds[0]), color="k", ls="--", lw=1.2,
                       label=lab("predicted (modeled)"))
        for j, pol in enumerate(pols):
            for i, k in enumerate(ks):
                r = d[(d["kernel"] == k) & (d["policy"] == pol)]
                if r.empty:
                    continue
                r = r.iloc[0]
                x = i - 0.4 + width * (j + 0.5)
                v = _num(r["value"])
                if v is None:
                    continue
                ax.bar(x, 100 * v, width * 0.85, color=COLORS[pol], label=lab(pol))
                lo, hi = _num(r.get("lo")), _num(r.get("hi"))
                if lo is not None and hi is not None:
                    ax.errorbar(x, 100 * v, yerr=[[100 * max(v - lo, 0)], [100 * max(hi - v, 0)]],
                                color="k", capsize=3, lw=1, label=lab(whisker))
                p = _num(r.get("predicted"))
                if p is not None and not one_pred:
                    ax.hlines(100 * p, x - width / 2, x + width / 2, colors="k", linestyles="--",
                              lw=1.2, label=lab("predicted (modeled)"))
                sim = _num(r.get("simulated"))
                if marker and sim is not None:
                    ax.plot(x + width * 0.32, 100 * sim, marker="D", ms=6,
                            color="#d62728", mec="k", ls="none",
                            label=lab("simulated, same configuration"))
        ax.axhline(0, color="#999", lw=0.8)
        ax.set_xticks(range(len(ks)))
        ax.set_xticklabels([f"{k}\n({(STANDS_IN_FOR.get(k) or k).split(' (')[0]})" for k in ks],
                           fontsize=8)
        ax.set_title(s, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("improvement over full coscheduling, %")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lb in zip(*ax.get_legend_handles_labels()):
            if lb not in labels:
                handles.append(h)
                labels.append(lb)
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8,
               frameon=False)
    fig.suptitle(textwrap.fill(title, int(28 * (1.5 + 4.2 * len(scen)) / 2.2)), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.92))
    return _save(fig, base)


def measured_bars(rows: pd.DataFrame) -> pd.DataFrame:
    d = rows[rows["policy"].isin(PARTIAL)]
    return pd.DataFrame({"kernel": d["kernel"], "scenario": d["scenario"], "policy": d["policy"],
                         "value": d["improvement_over_full"], "lo": d["ci_lo"],
                         "hi": d["ci_hi"], "predicted": d["predicted"],
                         "simulated": d["simulated"]})


def simulated_bars(summary: pd.DataFrame) -> pd.DataFrame:
    d = summary[summary["policy"].isin(PARTIAL)]
    return pd.DataFrame({"kernel": d["kernel"], "scenario": d["scenario"], "policy": d["policy"],
                         "value": d["median"], "lo": d["min"], "hi": d["max"],
                         "predicted": d["predicted"]})


def fig_corun_idle(cells: pd.DataFrame, base: Path, title: str) -> Path:
    """Per policy and scenario: co-run fraction and idle CPU share (bars: median over the runs
    of all kernels; whiskers: its 95% order-statistic interval; dots: the runs; x: planned)."""
    plt = _plt()
    pols = [p for p in POLICIES if p in set(cells["policy"])]
    scen = [s for s in SCENARIOS if s in set(cells["scenario"])]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    width = 0.8 / max(1, len(scen))
    shades = ["#4c72b0", "#dd8452", "#55a868"]
    for ax, col, ylab in ((axes[0], "corun_fraction", "co-run fraction of the chosen sets"),
                          (axes[1], "idle_cpu_share", "idle CPU share")):
        for j, s in enumerate(scen):
            named = False
            for i, pol in enumerate(pols):
                g = cells[(cells["policy"] == pol) & (cells["scenario"] == s)]
                vals = sorted(stats.clean(g[col])) if col in g else []
                x = i - 0.4 + width * (j + 0.5)
                if vals:
                    med, lo, hi = stats.quantile_ci(vals, 0.5)
                    ax.bar(x, med, width * 0.85, color=shades[j % 3], alpha=0.8,
                           label=None if named else s)
                    named = True
                    ax.errorbar(x, med, yerr=[[max(med - lo, 0)], [max(hi - med, 0)]], color="k",
                                capsize=3, lw=1)
                    ax.plot([x] * len(vals), vals, "k.", ms=3, alpha=0.6)
                if col == "idle_cpu_share" and "planned_idle_share" in g and pol != "none":
                    pl = stats.clean(g["planned_idle_share"])
                    if len(pl):
                        ax.plot(x, stats.quantile(pl, 0.5), "rx", ms=8,
                                label="planned idle share" if (i == 0 and j == 0) else None)
        ax.set_xticks(range(len(pols)))
        ax.set_xticklabels(pols, fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(ylab)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, title="scenario", title_fontsize=8, loc="upper left",
                  framealpha=0.9)
    axes[0].set_title("co-run fraction (none where no set has 2+ running vCPUs: policy none, "
                      "single-vCPU sets)", fontsize=9)
    axes[1].set_title("idle CPU share", fontsize=9)
    fig.suptitle(textwrap.fill(title, 120), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return _save(fig, base)


def heatmaps(exp: dict, out: Path) -> list[tuple[Path, str]]:
    """partial-auto cells with `matrices` (one per VM, vCPU order, or null): the last matrix
    of each VM with the last detected sets outlined (comm's heatmap), first repetition only."""
    vm = exp.get("vm_vcpus") or []
    done, figs = set(), []
    for c in exp.get("cells") or []:
        mats = c.get("matrices")
        if c.get("policy") != "partial-auto" or not mats:
            continue
        key = (c.get("kernel"), c.get("scenario"))
        if key in done:
            continue
        done.add(key)
        ev = _regroup_events(c.get("regroups"))
        last = ev[-1][1] if ev else []
        offset = 0
        for vi, m in enumerate(mats):
            n = len(m) if isinstance(m, list) else 0
            size = vm[vi] if vi < len(vm) else n
            if n:
                local = [[x - offset for x in s if offset <= x < offset + n] for s in last]
                local = [s for s in local if s]
                seen = {x for s in local for x in s}
                local += [[i] for i in range(n) if i not in seen]
                title = (f"MEASURED: {key[0]} {key[1]}, rep {int(c.get('rep', 0)) + 1}: VM{vi + 1}'s "
                         "last communication matrix,\ndetected sets (red)")
                png = out / f"heatmap-{key[0]}-{key[1]}-vm{vi + 1}.png"
                comm.heatmap({"matrix": m, "labels": [f"vCPU {offset + i}" for i in range(n)]},
                             local, title, png)
                figs.append((png, title.replace("\n", " ")))
            offset += size
    return figs


def trees(exp: dict, out: Path) -> list[tuple[str, str]]:
    """The dependency tree (eq. 1) and sets of every partial-auto matrix with ≥ 2 vCPUs, as
    `preheat groups` prints it (first repetition per kernel and scenario)."""
    done, res = set(), []
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for c in exp.get("cells") or []:
        key = (c.get("kernel"), c.get("scenario"))
        if c.get("policy") != "partial-auto" or not c.get("matrices") or key in done:
            continue
        done.add(key)
        for vi, m in enumerate(c["matrices"]):
            if not isinstance(m, list) or len(m) < 2:
                continue
            f = raw / f"matrix-{key[0]}-{key[1]}-vm{vi + 1}.json"
            atomic.write_json(f, {"matrix": m})
            p = subprocess.run([cli.preheat_bin(), "groups", str(f), "--t", str(exp.get("t", 1.5))],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise ToolError(f"preheat groups {f}: {p.stderr.strip()[-300:]}")
            res.append((f"MEASURED: {key[0]} {key[1]}, VM{vi + 1}: tree and sets of its last "
                        "communication matrix (eq. 1)", p.stdout))
    return res
