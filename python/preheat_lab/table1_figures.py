"""Figure 3 of the paper for our servers: response-time CDFs per server, one line per mode."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from . import atomic, stats
from .table1_samples import COLD, DISPLAY, WARM, mode_order

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MODE_STYLE = {"warm": ("#2c7bb6", "-"), "cold-sweep": ("#d7191c", "-"),
              "cold-idle": ("#fdae61", "--"), "control": ("#888888", "--"),
              "preheat:wake": ("#c51b7d", "-"), "preheat:lines": ("#4d4d4d", "-"),
              "preheat:replay": ("#8c510a", "-"), "preheat:wake+lines": ("#1a9641", "-"),
              "preheat:wake+lines+replay": ("#762a83", "-"), "preheat:all": ("#762a83", "-")}


def mode_style(mode: str) -> tuple[str, str]:
    """The same colour for a mode in every plot (strategies outside the usual set: by name)."""
    if mode in MODE_STYLE:
        return MODE_STYLE[mode]
    palette = ["#e08214", "#35978f", "#b2182b", "#2166ac", "#7fbc41", "#542788"]
    return palette[sum(map(ord, mode)) % len(palette)], "-."


def cdf_axes(ax: Axes, df: pd.DataFrame, modes: Sequence[str], title: str) -> None:
    for m in modes:
        v = np.sort(stats.clean(df.loc[df["mode"] == m, "latency_us"]))
        if len(v) == 0:
            continue
        y = np.arange(0, len(v) + 1) / len(v)
        color, ls = mode_style(m)
        ax.step(np.concatenate([[v[0]], v]), y, where="post", color=color, linestyle=ls,
                label=f"{m} (n={len(v)})", linewidth=1.5 if m in (WARM, COLD) else 1.1)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("response time, µs (log scale)")
    ax.set_ylabel("cumulative share of requests")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def figure3(out: Path, samples: pd.DataFrame, metas: dict[str, dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    servers = list(samples["server"].unique())
    per_server = {}
    for s in servers:
        d = samples[samples["server"] == s]
        per_server[s] = d, mode_order(d["mode"].unique().tolist(), metas.get(s))
    for s, (d, modes) in per_server.items():
        fig, ax = plt.subplots(figsize=(9, 4.5))
        cdf_axes(ax, d, modes, f"{DISPLAY.get(s, s)}: response time CDF (measured)")
        fig.tight_layout()
        for ext in ("png", "svg"):
            written.append(atomic.savefig(fig, out / f"figure3-{s}.{ext}", dpi=110))
        plt.close(fig)
    if servers:
        ncol = min(2, len(servers))
        nrow = math.ceil(len(servers) / ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(8.5 * ncol, 4.2 * nrow), squeeze=False)
        for ax, s in zip(axes.flat, servers):
            d, modes = per_server[s]
            cdf_axes(ax, d, modes, f"{DISPLAY.get(s, s)} (measured)")
        for ax in list(axes.flat)[len(servers):]:
            ax.axis("off")
        fig.suptitle("Figure 3 equivalent: cumulative response-time distribution per mode")
        fig.tight_layout()
        for ext in ("png", "svg"):
            written.append(atomic.savefig(fig, out / f"figure3.{ext}", dpi=110))
        plt.close(fig)
    return written


def figure_stages(out: Path, stages: pd.DataFrame) -> list[Path]:
    """Per server, a stacked bar per mode: the p50 of the start stage (send → server thread runs)
    and of the serve stage (→ reply read); the hot floor's and cold-sweep's bars frame the rest."""
    if stages.empty:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(stages["server"].unique())
    fig, axes = plt.subplots(len(servers), 1, figsize=(9, 3.2 * len(servers)), squeeze=False)
    for ax, s in zip(axes.flat, servers):
        g = stages[(stages["server"] == s) & stages["start_p50"].notna()]
        y = np.arange(len(g))
        ax.barh(y, g["start_p50"], color="#d7191c", label="start: send → server thread runs")
        ax.barh(y, g["serve_p50"], left=g["start_p50"], color="#2c7bb6",
                label="serve: server thread → reply read")
        ax.set_yticks(y, [f"{m} (n={n})" for m, n in zip(g["mode"], g["n_stages"])],
                      fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("µs (p50 of each stage; measured)")
        ax.set_title(f"{DISPLAY.get(s, s)}: where the response time goes, per mode", fontsize=10)
        ax.grid(True, axis="x", alpha=0.25)
        ax.legend(fontsize=7, loc="lower right", frameon=False)
    fig.tight_layout()
    written = [atomic.savefig(fig, out / f"stages.{ext}", dpi=110) for ext in ("png", "svg")]
    plt.close(fig)
    return written
