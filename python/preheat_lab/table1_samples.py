"""Table 1's samples: the per-request samples of `preheat demo` loaded from a run's raw/
directory (the JSON of a complete run, or the records of
an interrupted one)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .table1_run import BASE_MODES, COLD, CONN_PRIMED, CONTROL, DISPLAY, HOT, SERVERS, WARM

__all__ = ["BASE_MODES", "COLD", "CONTROL", "DISPLAY", "HOT", "LINE_BYTES", "SAMPLE_COLUMNS",
           "SERVERS", "WARM", "floor_mode", "load_server", "loads_lines", "mode_order",
           "strategy_modes"]

LINE_BYTES = 64

SAMPLE_COLUMNS = ["server", "server_name", "mode", "round", "kind", "latency_us", "lines_done",
                  "lines_total", "preheat_us", "worker_lead_us", "trigger_lead_us",
                  "server_start_us", "sweep_us", "source"]


def load_server(raw: Path, server: str) -> tuple[dict, pd.DataFrame]:
    """The demo's JSON (meta) and its samples: from raw/S.json when the run completed, else
    from the records file raw/S.jsonl (an interrupted run: meta is then mostly empty)."""
    meta: dict = {}
    rows: list[dict] = []
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


def floor_mode(modes: Sequence[str], meta: dict | None = None) -> str:
    """The floor shares are computed against: hot when measured and, where the CLI checked it
    (`floor_check` in its JSON: warm − hot per round above 0), shown to be below warm; else warm.
    The check is the CLI's, read here, not computed a second time."""
    check = (meta or {}).get("floor_check")
    if HOT in modes and (check is None or check.get("verified", False)):
        return HOT
    return WARM


def mode_order(modes: Sequence[str], meta: dict | None = None) -> list[str]:
    """hot, warm, cold-sweep, cold-idle, control, then the strategies in the CLI's order."""
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


def strategy_modes(modes: Sequence[str]) -> list[str]:
    """The preheating strategies among `modes` (not the baselines, not the diagnostic row)."""
    return [m for m in modes if m not in BASE_MODES and m != CONN_PRIMED]
