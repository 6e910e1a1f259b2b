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

The parts: `table1_run` (servers, modes, running the demo), `table1_samples` (loading samples),
`table1_analysis` (the statistics), `table1_figures` (Figure 3); this module runs a whole
experiment and (re)builds its artifacts, and keeps the parts' public names importable as
`table1.NAME`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from . import atomic, cli, labreport, proc, stats
from .cli import failure_reason, read_json
from .progress import Progress
from .table1_analysis import (
    PAPER,
    PAPER_AVERAGE_REMOVED,
    PAPER_LABEL,
    PAPER_NAME,
    analyze_server,
    analyze_server_paper_only,
    cpi_text,
    paper_removed,
    stages_table,
    tail_summary,
    tail_table,
)
from .table1_figures import MODE_STYLE, cdf_axes, figure3, figure_stages, mode_style
from .table1_run import (
    CustomServer,
    DemoOptions,
    InterruptedRun,
    ServerRun,
    check_flags,
    count_lines,
    demo_argv,
    demo_command,
    run_demo,
)
from .table1_samples import (
    BASE_MODES,
    COLD,
    CONTROL,
    DISPLAY,
    LINE_BYTES,
    SAMPLE_COLUMNS,
    SERVERS,
    WARM,
    load_server,
    loads_lines,
    mode_order,
    strategy_modes,
)

__all__ = [
    "BASE_MODES", "COLD", "CONTROL", "DISPLAY", "LINE_BYTES", "MODE_STYLE", "PAPER",
    "PAPER_AVERAGE_REMOVED", "PAPER_LABEL", "PAPER_NAME", "SAMPLE_COLUMNS", "SERVERS", "WARM",
    "DemoOptions", "ServerRun", "analyze", "analyze_server", "analyze_server_paper_only",
    "CustomServer", "cdf_axes", "check_flags", "count_lines", "cpi_text", "demo_argv",
    "demo_command",
    "failure_reason", "figure3", "load_server", "loads_lines", "mode_order", "mode_style",
    "paper_removed",
    "run", "run_demo", "strategy_modes",
]


def analyze(out: Path, boot: int = stats.DEFAULT_BOOT) -> dict:
    """(Re)build every derived artifact from DIR/raw and DIR/runs.json; returns the summary."""
    out = Path(out)
    raw = out / "raw"
    status = read_json(out / "runs.json") or {}
    topo = read_json(out / "topology.json") or {}
    servers = status.get("servers") or sorted(p.stem for p in raw.glob("*.json"))
    frames, metas, tables, decomps, heads, kinds = [], {}, [], [], [], []
    stage_frames, tail_frames = [], []
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
        stage_frames.append(stages_table(s, df, meta))
        tail_frames.append(tail_table(s, df))
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
    stage_t = pd.concat(stage_frames, ignore_index=True) if stage_frames else pd.DataFrame()
    tails = pd.concat(tail_frames, ignore_index=True) if tail_frames else pd.DataFrame()
    atomic.write_csv(out / "stages.csv", stage_t)
    atomic.write_csv(out / "tails.csv", tails)
    figs += figure_stages(out, stage_t)
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
        "stages": stage_t.to_dict(orient="records"),
        "tails": tail_summary(tails) if len(tails) else [],
        "figures": [p.name for p in figs],
        "samples": int(len(samples)),
        "parquet": atomic.parquet_available(),
    }
    atomic.write_json(out / "summary.json", summary)
    return summary


def run(out: Path, servers: Sequence[str], opts: DemoOptions, boot: int = stats.DEFAULT_BOOT,
        report: bool = True, custom: CustomServer | None = None) -> int:
    """Measure every server (or only `custom`, any server given by its command), analyze, write
    the report. Exit code: 0 all fine, 1 some server failed, 130/143 interrupted (the report is
    still written, marked partial)."""
    if custom is not None:
        servers = [custom.name]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    missing = check_flags(opts)
    if missing:
        raise SystemExit(f"this preheat CLI's demo does not accept {', '.join(missing)}: "
                         "rebuild it (cargo build --release --bin preheat) or leave them out")
    atomic.write_json(out / "topology.json", cli.topology())
    status: dict[str, Any] = {"state": "running", "servers": list(servers), "options": asdict(opts),
              "custom": asdict(custom) if custom else None,
              "runs": {s: asdict(ServerRun(s, "not run")) for s in servers},
              "preheat_bin": cli.preheat_bin()}
    atomic.write_json(out / "runs.json", status)
    code = 0
    proc.reset_interrupt_state()
    with proc.interruptible(), Progress("table1", len(servers)) as prog:
        try:
            for s in servers:
                try:
                    r = run_demo(s, opts, raw, prog, custom)
                except InterruptedRun as e:
                    status["runs"][s] = asdict(e.run)
                    raise proc.Interrupted(e.run.reason) from e
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
        labreport.publish(out)
    return code
