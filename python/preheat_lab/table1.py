"""The paper's Table 1 and Figure 3 (Gottschlag & Bellosa, §4.1) on real servers, from the raw
per-request samples of `preheat demo`.

For each server, `preheat demo --server S --rounds N --json --out raw/S.json --records
raw/S.jsonl` records the per-request working set, then runs interleaved rounds: each round
measures every mode once, in shuffled order (warm, cold-idle, cold-sweep, control and every
preheat strategy). This module turns the samples into

* `samples.parquet/.csv`: every per-request sample (server, mode, round, latency_us, ...);
* `table1.csv`: per server and mode, mean and median with 95% CIs, p99 with CI, the share of
  the cold overhead removed (mean- and median-based, paired bootstrap over rounds), working
  set, encoded size, preheat time, GB/s, CPI (n/a without a PMU), sample counts;
* `headline.csv`: the paper's Table 1 rows beside ours (warm / cold / preheated);
* `decomposition.csv`: where cold-start time goes (wake-up/idle vs cache loss), and what each
  strategy removes;
* `figure3*.png/.svg`: response-time CDFs per server, one line per mode, log x;
* `summary.json`: all of it, plus the run's status (complete / interrupted, failed servers).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from . import atomic, cli, proc, stats
from .cli import failure_reason, read_json  # noqa: F401  (failure_reason: part of this API)
from .progress import Progress

SERVERS = ["kv", "memcached", "nginx", "redis", "mariadb"]
BASE_MODES = ["warm", "cold-sweep", "cold-idle", "control"]
COLD = "cold-sweep"  # the paper's "cold": caches flushed before the request
WARM = "warm"
CONTROL = "control"
LINE_BYTES = 64

PAPER_LABEL = "paper (Odroid-XU3, ARM Cortex-A15)"
#: Table 1 of the paper (averages over 100000 requests).
PAPER = {
    "nginx": dict(warm=367.6, cold=498.0, preheated=388.5, cpi_warm=3.63, cpi_cold=5.78,
                  cpi_preheated=4.12, ws_kib=235.8, preheat_us=77.4),
    "memcached": dict(warm=178.8, cold=238.8, preheated=188.5, cpi_warm=3.81, cpi_cold=5.66,
                      cpi_preheated=4.30, ws_kib=142.3, preheat_us=53.0),
    "mariadb": dict(warm=3970.0, cold=4320.0, preheated=4069.0, cpi_warm=2.20, cpi_cold=2.44,
                    cpi_preheated=2.29, ws_kib=621.8, preheat_us=146.4),
}
PAPER_AVERAGE_REMOVED = 0.798  # "on average the overhead is reduced by 79.8%"
PAPER_NAME = {"nginx": "nginx", "memcached": "memcached", "mariadb": "MariaDB"}
DISPLAY = {"kv": "preheat-kv", "memcached": "memcached", "nginx": "nginx", "redis": "redis",
           "mariadb": "MariaDB"}


def paper_removed(server: str) -> float:
    p = PAPER[server]
    return (p["cold"] - p["preheated"]) / (p["cold"] - p["warm"])


# ---------------------------------------------------------------------------------------------
# Running the demo


@dataclass
class DemoOptions:
    """Knobs passed to `preheat demo` (None: the CLI's default, not passed)."""

    rounds: int = 200
    lead_us: Optional[float] = None
    idle_ms: Optional[float] = None
    sweep_mib: Optional[int] = None
    post_gap_us: Optional[float] = None
    strategies: Optional[str] = None
    samples: Optional[int] = None
    keep: Optional[int] = None
    gap_merge: Optional[int] = None
    server_cpu: Optional[int] = None
    timeout_s: Optional[float] = None

    FLAGS = {"lead_us": "--lead-us", "idle_ms": "--idle-ms", "sweep_mib": "--sweep-mib",
             "post_gap_us": "--post-gap-us", "strategies": "--strategies",
             "samples": "--samples", "keep": "--keep", "gap_merge": "--gap-merge",
             "server_cpu": "--server-cpu"}

    def args(self) -> List[str]:
        a = ["--rounds", str(self.rounds)]
        for name, flag in self.FLAGS.items():
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            a += [flag, str(v)]
        return a

    def timeout(self) -> float:
        if self.timeout_s:
            return self.timeout_s
        # Recording + start-up, then rounds × modes with idle gaps and sweeps; MariaDB's
        # requests take milliseconds. Generous: a hung server is the only thing it catches.
        return 300.0 + self.rounds * 3.0

    def modes_per_round(self) -> int:
        strategies = self.strategies or "wake,lines,replay,wake+lines,all"
        return len(BASE_MODES) + len([s for s in strategies.split(",") if s])


def demo_argv(binary: str, server: str, args: Sequence[str], out_json: Path,
              records: Optional[Path]) -> List[str]:
    """`BINARY demo --server S ARGS --json --out OUT_JSON [--records RECORDS]`."""
    cmd = [binary, "demo", "--server", server, *args, "--json", "--out", str(out_json)]
    if records is not None:
        cmd += ["--records", str(records)]
    return cmd


def demo_command(server: str, opts: DemoOptions, out_json: Path, records: Optional[Path]) -> List[str]:
    return demo_argv(cli.preheat_bin(), server, opts.args(), out_json, records)


def check_flags(opts: DemoOptions) -> List[str]:
    """Options this CLI's `demo` does not know (e.g. an older build without --gap-merge)."""
    missing = []
    for name, flag in DemoOptions.FLAGS.items():
        if getattr(opts, name) is not None and not cli.supports("demo", flag):
            missing.append(flag)
    return missing


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


@dataclass
class ServerRun:
    server: str
    status: str  # ok | failed | interrupted | not run
    reason: str = ""
    seconds: float = 0.0
    command: List[str] = field(default_factory=list)


def run_demo(server: str, opts: DemoOptions, raw: Path, prog: Optional[Progress] = None) -> ServerRun:
    """Run one demo; raises `proc.Interrupted` (after stopping the child) when interrupted."""
    import time

    raw.mkdir(parents=True, exist_ok=True)
    out_json = raw / f"{server}.json"
    records = raw / f"{server}.jsonl" if cli.supports("demo", "--records") else None
    for stale in (out_json, raw / f"{server}.jsonl"):
        if stale.exists():  # --records appends: never mix an earlier run's samples in
            stale.unlink()
    cmd = demo_command(server, opts, out_json, records)
    expected = opts.rounds * opts.modes_per_round()
    if prog:
        prog.task(DISPLAY.get(server, server), expected)
    t0 = time.monotonic()
    run = ServerRun(server, "ok", command=cmd)
    try:
        rc = proc.run_child(cmd, raw / f"{server}.stdout.txt", raw / f"{server}.stderr.txt",
                            timeout=opts.timeout(),
                            on_tick=(lambda: prog.update(count_lines(records))) if prog and records else None)
    except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
        run.status, run.reason = "interrupted", f"interrupted by {proc.interrupted_by()}"
        run.seconds = time.monotonic() - t0
        raise _InterruptedRun(run)
    except proc.ChildTimeout as e:
        rc, run.status, run.reason = -1, "failed", str(e)
    run.seconds = time.monotonic() - t0
    if run.status == "ok" and rc != 0:
        err = (raw / f"{server}.stderr.txt").read_text(errors="replace")
        run.status, run.reason = "failed", failure_reason(err, rc)
    if run.status == "ok" and not out_json.exists():
        # An older CLI without --out support: the JSON went to stdout.
        try:
            text = (raw / f"{server}.stdout.txt").read_text()
            json.loads(text)
            atomic.write_text(out_json, text)
        except (OSError, ValueError):
            run.status, run.reason = "failed", "the demo printed no JSON"
    return run


class _InterruptedRun(Exception):
    def __init__(self, run: ServerRun):
        super().__init__(run.reason)
        self.run = run


# ---------------------------------------------------------------------------------------------
# Loading samples


SAMPLE_COLUMNS = ["server", "server_name", "mode", "round", "kind", "latency_us", "lines_done",
                  "lines_total", "preheat_us", "worker_lead_us", "trigger_lead_us",
                  "server_start_us", "sweep_us", "source"]


def load_server(raw: Path, server: str) -> Tuple[dict, pd.DataFrame]:
    """The demo's JSON (meta) and its samples: from raw/S.json when the run completed, else
    from the records file raw/S.jsonl (an interrupted run: meta is then mostly empty)."""
    meta: dict = {}
    rows: List[dict] = []
    source = ""
    j = raw / f"{server}.json"
    if j.exists():
        try:
            meta = json.loads(j.read_text())
            rows = list(meta.pop("samples", []) or [])
            source = "json"
        except ValueError:
            meta, rows = {}, []
    if not rows:
        rec = raw / f"{server}.jsonl"
        if rec.exists():
            for ln in rec.read_text(errors="replace").splitlines():
                ln = ln.strip()
                if not ln:
                    continue
                try:
                    rows.append(json.loads(ln))
                except ValueError:
                    continue  # a torn last line of an interrupted run
            source = "records"
    df = pd.DataFrame(rows)
    if df.empty:
        return meta, pd.DataFrame(columns=SAMPLE_COLUMNS)
    df.insert(0, "server", server)
    df.insert(1, "server_name", meta.get("server") or DISPLAY.get(server, server))
    df["source"] = source
    for c in SAMPLE_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    for c in ("latency_us", "lines_done", "lines_total", "preheat_us", "worker_lead_us",
              "trigger_lead_us", "server_start_us", "sweep_us"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["round"] = pd.to_numeric(df["round"], errors="coerce").fillna(-1).astype(int)
    extra = [c for c in df.columns if c not in SAMPLE_COLUMNS]
    return meta, df[SAMPLE_COLUMNS + extra]


def mode_order(modes: Sequence[str], meta: Optional[dict] = None) -> List[str]:
    """warm, cold-sweep, cold-idle, control, then the strategies in the CLI's order."""
    order = [m for m in BASE_MODES if m in modes]
    cli_rows = [r.get("mode") for r in (meta or {}).get("rows", []) or []]
    rest = [m for m in cli_rows if m in modes and m not in order]
    rest += sorted(m for m in modes if m not in order and m not in rest)
    return order + rest


def loads_lines(mode: str) -> bool:
    """Whether a mode's strategy prefetches the working set (`lines`, or `all`). Only those
    samples enter the preheat-time and GB/s columns: the per-sample lines fields of the other
    strategies are not about their own announcement."""
    if not mode.startswith("preheat:"):
        return False
    parts = mode.split(":", 1)[1].split("+")
    return "lines" in parts or "all" in parts


def strategy_modes(modes: Sequence[str]) -> List[str]:
    return [m for m in modes if m not in BASE_MODES]


# ---------------------------------------------------------------------------------------------
# Analysis


def cpi_text(meta: dict, topo: dict) -> Tuple[str, Optional[dict]]:
    """CPI column: the CLI's numbers when it has a PMU, else why not."""
    cpi = meta.get("cpi")
    pmu = meta.get("pmu", topo.get("pmu"))
    if cpi:
        return "measured", cpi
    if pmu is False:
        return "n/a (no PMU on this machine)", None
    if pmu is True:
        return "n/a (PMU present, but the demo reported no CPI)", None
    return "n/a (the demo reported no CPI)", None


def _cli_row(meta: dict, mode: str) -> dict:
    for r in meta.get("rows", []) or []:
        if r.get("mode") == mode:
            return r
    return {}


def _first(*vals):
    for v in vals:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            return v
    return None


def _removed(mat: np.ndarray, modes: List[str], stat: str, boot: int) -> Dict[str, stats.Derived]:
    """Share of the cold overhead each mode (but warm and cold) removes, paired bootstrap over
    rounds; empty without both baselines."""
    if COLD not in modes or WARM not in modes:
        return {}
    fns = {m: stats.share_fn(COLD, WARM, m) for m in modes if m not in (WARM, COLD)}
    return stats.paired_bootstrap(mat, modes, fns, stat, boot)


def analyze_server(server: str, df: pd.DataFrame, meta: dict, topo: dict,
                   boot: int = stats.DEFAULT_BOOT) -> Dict[str, pd.DataFrame]:
    """Table 1 rows, decomposition rows and the headline (beside the paper) for one server."""
    modes = mode_order(df["mode"].unique().tolist(), meta)
    strategies = strategy_modes(modes)
    cpi_label, cpi_vals = cpi_text(meta, topo)
    mat, rounds = stats.round_matrix(df, modes)
    have_baseline = COLD in modes and WARM in modes

    shares = {st: _removed(mat, modes, st, boot) for st in ("mean", "p50")}

    rows = []
    for m in modes:
        lat = df.loc[df["mode"] == m, "latency_us"]
        s = stats.summarize(lat, boot)
        r = {"server": server, "server_name": DISPLAY.get(server, server), "mode": m,
             "label": meta.get("label", "measured"), "n": s.n,
             "rounds": int(df.loc[df["mode"] == m, "round"].nunique())}
        r.update({k: v for k, v in s.to_dict().items() if k != "n"})
        for st in ("mean", "p50"):
            d = shares.get(st, {}).get(m)
            r[f"removed_{st}"] = d.value if d else (np.nan if m != COLD else 0.0)
            r[f"removed_{st}_lo"] = d.lo if d else np.nan
            r[f"removed_{st}_hi"] = d.hi if d else np.nan
            r[f"removed_{st}_undefined_share"] = d.undefined_share if d else np.nan
        if m == WARM:
            for st in ("mean", "p50"):
                r[f"removed_{st}"] = 1.0 if have_baseline else np.nan
        cr = _cli_row(meta, m)
        r["cli_overhead_removed"] = cr.get("overhead_removed")
        # Profile facts (from the CLI's row for strategies that load lines).
        r["ws_kib"] = cr.get("ws_kib")
        r["runs"] = cr.get("runs")
        r["encoded_bytes"] = cr.get("encoded_bytes")
        sub = df[(df["mode"] == m) & (df["lines_total"].fillna(0) > 0)]
        if len(sub) and loads_lines(m):
            pre = stats.summarize(sub["preheat_us"], boot)
            r.update(preheat_n=pre.n, preheat_us_mean=pre.mean, preheat_us_p50=pre.p50,
                     preheat_us_p50_lo=pre.p50_lo, preheat_us_p50_hi=pre.p50_hi)
            done = sub["lines_done"].fillna(0)
            ok = (sub["preheat_us"] > 0) & (done > 0)
            gbps = done[ok] * LINE_BYTES / sub.loc[ok, "preheat_us"] / 1e3
            r["gb_per_s_p50"] = stats.quantile(gbps, 0.5) if len(gbps) else np.nan
            r["completed_share"] = float((done >= sub["lines_total"]).mean())
            r["lines_total_p50"] = stats.quantile(sub["lines_total"], 0.5)
            if r["ws_kib"] is None:
                r["ws_kib"] = r["lines_total_p50"] * LINE_BYTES / 1024
        else:
            r.update(preheat_n=0, preheat_us_mean=np.nan, preheat_us_p50=np.nan,
                     preheat_us_p50_lo=np.nan, preheat_us_p50_hi=np.nan, gb_per_s_p50=np.nan,
                     completed_share=cr.get("completed_share"), lines_total_p50=np.nan)
        r["cli_gb_per_s"] = cr.get("gb_per_s")
        r["cpi"] = (cpi_vals or {}).get(m) if isinstance(cpi_vals, dict) else None
        r["cpi_note"] = cpi_label
        for k in ("server_start_us_p50", "trigger_lead_us_p50", "worker_lead_us_p50"):
            r[k] = cr.get(k)
        rows.append(r)
    table = pd.DataFrame(rows)

    # Decomposition: where cold-start time goes.
    drows = []
    if have_baseline:
        for st in ("mean", "p50"):
            comps: List[Tuple[str, str, str, str]] = [
                ("cold overhead", "cold-sweep − warm", COLD, WARM)]
            if CONTROL in modes:
                comps += [("wake-up / idle", "control − warm", CONTROL, WARM),
                          ("cache loss", "cold-sweep − control", COLD, CONTROL)]
            if "cold-idle" in modes:
                comps += [("plain idle gap (no sweep)", "cold-idle − warm", "cold-idle", WARM)]
            for sm in strategies:
                comps += [(f"removed by {sm}", f"cold-sweep − {sm}", COLD, sm)]
            fns = {}
            for name, _, a, b in comps:
                fns[name + "|us"] = stats.diff_fn(a, b)
                fns[name + "|share"] = stats.part_share_fn(a, b, COLD, WARM)
            res = stats.paired_bootstrap(mat, modes, fns, st, boot)
            for name, formula, a, b in comps:
                us, sh = res[name + "|us"], res[name + "|share"]
                na = int(np.isfinite(mat[:, modes.index(a)]).sum())
                nb = int(np.isfinite(mat[:, modes.index(b)]).sum())
                drows.append({"server": server, "server_name": DISPLAY.get(server, server),
                              "stat": st, "component": name, "formula": formula,
                              "us": us.value, "us_lo": us.lo, "us_hi": us.hi,
                              "share": sh.value, "share_lo": sh.lo, "share_hi": sh.hi,
                              "share_undefined": sh.undefined_share,
                              "n": f"{a}: {na}, {b}: {nb}", "rounds": len(rounds),
                              "label": "measured"})
    decomp = pd.DataFrame(drows)

    # Headline beside the paper: warm / cold / preheated (= the paper's method: lines) means.
    head = []
    t = table.set_index("mode")
    if have_baseline:
        picks = []
        if "preheat:lines" in t.index:
            picks.append(("preheat:lines", "the paper's preheating (prefetch the working set)"))
        if strategies:
            finite = [m for m in strategies if np.isfinite(t.loc[m, "mean"])]
            best = min(finite, key=lambda m: t.loc[m, "mean"]) if finite else None
            if best and best != "preheat:lines":
                picks.append((best, "best strategy here (lowest mean)"))
        for sm, what in picks:
            lines_mode = sm if np.isfinite(t.loc[sm].get("preheat_us_mean", np.nan)) else (
                "preheat:lines" if "preheat:lines" in t.index else sm)
            head.append({
                "server": server, "server_name": DISPLAY.get(server, server),
                "source": f"measured here ({meta.get('machine', 'this machine')})",
                "preheated_mode": f"{sm}: {what}",
                "warm": t.loc[WARM, "mean"], "cold": t.loc[COLD, "mean"],
                "preheated": t.loc[sm, "mean"],
                "removed": t.loc[sm, "removed_mean"],
                "removed_lo": t.loc[sm, "removed_mean_lo"],
                "removed_hi": t.loc[sm, "removed_mean_hi"],
                "cpi": cpi_label if cpi_vals is None else json.dumps(cpi_vals),
                "ws_kib": _first(t.loc[lines_mode, "ws_kib"]),
                "preheat_us": t.loc[lines_mode].get("preheat_us_mean"),
                "n": f"warm {t.loc[WARM, 'n']}, cold {t.loc[COLD, 'n']}, {sm} {t.loc[sm, 'n']}",
                "label": "measured (mean)"})
    head.append(_paper_row(server))
    # Request kinds (MariaDB's TPC-C-like transaction types: every mode of a round measures the
    # same type): the same table per kind, so a mix of fast and slow types does not hide what
    # happens to each.
    kinds = []
    if "kind" in df.columns and df["kind"].nunique(dropna=True) > 1:
        for kind, dk in df.groupby("kind", sort=True):
            kmodes = [m for m in modes if m in set(dk["mode"])]
            kmat, krounds = stats.round_matrix(dk, kmodes)
            kshare = _removed(kmat, kmodes, "p50", boot)
            for m in kmodes:
                s_ = stats.summarize(dk.loc[dk["mode"] == m, "latency_us"], boot)
                d = kshare.get(m)
                kinds.append({"server": server, "server_name": DISPLAY.get(server, server),
                              "kind": kind, "mode": m, "n": s_.n, "rounds": len(krounds),
                              "mean": s_.mean, "mean_lo": s_.mean_lo, "mean_hi": s_.mean_hi,
                              "p50": s_.p50, "p50_lo": s_.p50_lo, "p50_hi": s_.p50_hi,
                              "removed_p50": d.value if d else (1.0 if m == WARM else 0.0 if m == COLD else np.nan),
                              "removed_p50_lo": d.lo if d else np.nan,
                              "removed_p50_hi": d.hi if d else np.nan,
                              "removed_p50_undefined_share": d.undefined_share if d else np.nan,
                              "label": "measured"})
    return {"table": table, "decomposition": decomp, "headline": pd.DataFrame(head),
            "by_kind": pd.DataFrame(kinds)}


# ---------------------------------------------------------------------------------------------
# Figure 3


MODE_STYLE = {"warm": ("#2c7bb6", "-"), "cold-sweep": ("#d7191c", "-"),
              "cold-idle": ("#fdae61", "--"), "control": ("#888888", "--"),
              "preheat:wake": ("#c51b7d", "-"), "preheat:lines": ("#4d4d4d", "-"),
              "preheat:replay": ("#8c510a", "-"), "preheat:wake+lines": ("#1a9641", "-"),
              "preheat:wake+lines+replay": ("#762a83", "-"), "preheat:all": ("#762a83", "-")}


def _style(mode: str):
    """The same colour for a mode in every plot (strategies outside the usual set: by name)."""
    if mode in MODE_STYLE:
        return MODE_STYLE[mode]
    palette = ["#e08214", "#35978f", "#b2182b", "#2166ac", "#7fbc41", "#542788"]
    return palette[sum(map(ord, mode)) % len(palette)], "-."


def cdf_axes(ax, df: pd.DataFrame, modes: Sequence[str], title: str) -> None:
    for m in modes:
        v = np.sort(stats.clean(df.loc[df["mode"] == m, "latency_us"]))
        if len(v) == 0:
            continue
        y = np.arange(0, len(v) + 1) / len(v)
        color, ls = _style(m)
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


def figure3(out: Path, samples: pd.DataFrame, metas: Dict[str, dict]) -> List[Path]:
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


# ---------------------------------------------------------------------------------------------
# Whole runs


def analyze(out: Path, boot: int = stats.DEFAULT_BOOT) -> dict:
    """(Re)build every derived artifact from DIR/raw and DIR/runs.json; returns the summary."""
    out = Path(out)
    raw = out / "raw"
    status = read_json(out / "runs.json") or {}
    topo = read_json(out / "topology.json") or {}
    servers = status.get("servers") or sorted(p.stem for p in raw.glob("*.json"))
    frames, metas, tables, decomps, heads, kinds = [], {}, [], [], [], []
    per_server = {}
    for s in servers:
        meta, df = load_server(raw, s)
        metas[s] = meta
        run = (status.get("runs") or {}).get(s, {})
        info = {"status": run.get("status", "ok" if len(df) else "no data"),
                "reason": run.get("reason", ""), "samples": int(len(df)),
                "source": df["source"].iloc[0] if len(df) else None,
                "meta": {k: v for k, v in meta.items() if k not in ("rows",)}}
        per_server[s] = info
        if df.empty:
            continue
        frames.append(df)
        a = analyze_server(s, df, meta, topo, boot)
        tables.append(a["table"])
        decomps.append(a["decomposition"])
        heads.append(a["headline"])
        if len(a["by_kind"]):
            kinds.append(a["by_kind"])
    with_rows = {h["server"].iloc[0] for h in heads if len(h)}
    for s in SERVERS:  # paper rows for servers without data (failed or not run)
        if s in PAPER and s in servers and s not in with_rows:
            heads.append(analyze_server_paper_only(s))
    samples = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SAMPLE_COLUMNS)
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    decomp = pd.concat(decomps, ignore_index=True) if decomps else pd.DataFrame()
    head = pd.concat(heads, ignore_index=True) if heads else pd.DataFrame()
    by_kind = pd.concat(kinds, ignore_index=True) if kinds else pd.DataFrame()
    if len(by_kind):
        atomic.write_csv(out / "by_kind.csv", by_kind)
    elif (out / "by_kind.csv").exists():
        (out / "by_kind.csv").unlink()
    if len(samples):
        atomic.write_table(out / "samples", samples)
    for name, df in (("table1", table), ("decomposition", decomp), ("headline", head)):
        atomic.write_csv(out / f"{name}.csv", df)
    figs = figure3(out, samples, metas) if len(samples) else []
    # "On average the overhead is reduced by X%" (the paper averages its three servers).
    avg = {}
    if len(table):
        for m in ("preheat:lines",):
            sel = table[(table["mode"] == m) & table["removed_mean"].notna()]
            if len(sel):
                avg[m] = {"mean_over_servers": float(sel["removed_mean"].mean()),
                          "servers": int(len(sel)), "which": sorted(sel["server"])}
                ps = sel[sel["server"].isin(list(PAPER))]
                if len(ps):
                    avg[m]["mean_over_paper_servers"] = float(ps["removed_mean"].mean())
                    avg[m]["paper_servers"] = sorted(ps["server"])
    summary = {
        "kind": "table1",
        "state": status.get("state", "complete"),
        "interrupted_by": status.get("interrupted_by"),
        "options": status.get("options", {}),
        "servers": per_server,
        "failed": {s: i["reason"] for s, i in per_server.items() if i["status"] == "failed"},
        "average_removed": avg,
        "paper_average_removed": PAPER_AVERAGE_REMOVED,
        "table1": table.to_dict(orient="records"),
        "decomposition": decomp.to_dict(orient="records"),
        "headline": head.to_dict(orient="records"),
        "by_kind": by_kind.to_dict(orient="records"),
        "figures": [p.name for p in figs],
        "samples": int(len(samples)),
        "parquet": atomic.parquet_available(),
    }
    atomic.write_json(out / "summary.json", summary)
    return summary


def _paper_row(server: str) -> dict:
    """The headline row of the paper's Table 1 for SERVER (placeholders when it has none)."""
    p = PAPER.get(server)
    return {
        "server": server, "server_name": DISPLAY.get(server, server), "source": PAPER_LABEL,
        "preheated_mode": "preheated (paper)" if p else "—",
        "warm": p["warm"] if p else None, "cold": p["cold"] if p else None,
        "preheated": p["preheated"] if p else None,
        "removed": paper_removed(server) if p else None, "removed_lo": None, "removed_hi": None,
        "cpi": (f"{p['cpi_warm']} / {p['cpi_cold']} / {p['cpi_preheated']}" if p else "—"),
        "ws_kib": p["ws_kib"] if p else None, "preheat_us": p["preheat_us"] if p else None,
        "n": "100000 requests" if p else "—",
        "label": "paper (averages)" if p else "— (no row in the paper)"}


def analyze_server_paper_only(server: str) -> pd.DataFrame:
    return pd.DataFrame([_paper_row(server)])


def run(out: Path, servers: Sequence[str], opts: DemoOptions, boot: int = stats.DEFAULT_BOOT,
        report: bool = True) -> int:
    """Measure every server, analyze, write the report. Exit code: 0 all fine, 1 some server
    failed, 130/143 interrupted (the report is still written, marked partial)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    missing = check_flags(opts)
    if missing:
        raise SystemExit(f"this preheat CLI's demo does not accept {', '.join(missing)}: "
                         "rebuild it (cargo build --release --bin preheat) or leave them out")
    atomic.write_json(out / "topology.json", cli.topology())
    status = {"state": "running", "servers": list(servers), "options": asdict(opts),
              "runs": {s: asdict(ServerRun(s, "not run")) for s in servers},
              "preheat_bin": cli.preheat_bin()}
    atomic.write_json(out / "runs.json", status)
    code = 0
    proc.reset_interrupt_state()
    with proc.interruptible(), Progress("table1", len(servers)) as prog:
        try:
            for s in servers:
                try:
                    r = run_demo(s, opts, raw, prog)
                except _InterruptedRun as e:
                    status["runs"][s] = asdict(e.run)
                    raise proc.Interrupted(e.run.reason)
                status["runs"][s] = asdict(r)
                atomic.write_json(out / "runs.json", status)
                if r.status == "failed":
                    code = 1
                    prog.advance(f"FAILED: {r.reason}")
                else:
                    prog.advance(f"done in {r.seconds:.1f} s")
            status["state"] = "complete"
        except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
            code = proc.mark_interrupted(status)
            prog.log(f"table1: interrupted by {proc.interrupted_by()}: the servers were stopped; "
                     "writing the report from what was measured so far")
        atomic.write_json(out / "runs.json", status)
    summary = analyze(out, boot)
    for s, why in summary["failed"].items():
        print(f"table1: {s} FAILED: {why}")
    if report:
        from . import labreport

        labreport.publish(out)
    return code
