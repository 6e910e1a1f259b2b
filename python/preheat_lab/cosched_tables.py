"""preheat lab cosched: the CLI's JSON → tables — the measured experiment's runs and rows, the
validation of the simulated value against the measured interval, the simulator's runs and their
summary over seeds, partial-auto's detected sets beside partial-static's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from . import cli, labreport, stats
from .cli import ToolError

_num = labreport._num  # the one finite-float parser of the lab's reports


def _sets_text(sets: Iterable[Iterable[object]] | None) -> str:
    return " ".join("{" + ",".join(map(str, s)) + "}" for s in sets or [])


def _regroup_events(regroups: Sequence[object] | None) -> list[tuple[float | None, list]]:
    """(time s or None, sets) per regroup: entries are lists of sets, or {"at_s", "sets"}."""
    out = []
    for g in regroups or []:
        if isinstance(g, dict):
            out.append((_num(g.get("at_s")), g.get("sets") or []))
        else:
            out.append((None, g))
    return out


def regroups_text(regroups: Sequence[object] | None) -> str:
    """`#1 @1.5 s: {0} {1} {2} → #2 @3.0 s: ...` (the time only when the CLI gives it: a regroup
    that kept the sets is not recorded, so the period × the number would be wrong)."""
    parts = []
    for i, (at, sets) in enumerate(_regroup_events(regroups)):
        when = f" @{at:.1f} s" if at is not None else ""
        parts.append(f"#{i + 1}{when}: {_sets_text(sets)}")
    return " → ".join(parts) if parts else "(no regroup)"


def static_sets(scenario: str, vm_vcpus: Sequence[int]) -> list[list[int]]:
    """partial-static's sets in global vCPU indices (VM 0's vCPUs first), as the experiment
    configures them: VM1 split per instance (single: one instance on its first half), every
    other VM one set."""
    n = vm_vcpus[0]
    parts, used = {"single": (1, 2), "double": (2, 2), "quad": (4, 4)}[scenario]
    w = n // used
    sets = [list(range(k * w, (k + 1) * w)) for k in range(parts)]
    at = n
    for m in vm_vcpus[1:]:
        sets.append(list(range(at, at + m)))
        at += m
    return sets


def load_experiment(path: Path) -> dict:
    data = cli.read_json(path)
    if not isinstance(data, dict) or "rows" not in data or "cells" not in data:
        raise ToolError(f"{path}: not a `preheat cosched experiment --json` output "
                        "(no rows/cells)")
    return data


def alone_us(exp: dict | None) -> dict[str, float]:
    """Each kernel's measured alone iteration time, µs: from `calibration` ([{kernel,
    alone_iteration_us, ...}]) or `alone_iteration_us` ([[kernel, µs]] or {kernel: µs})."""
    out = {}
    for item in (exp or {}).get("calibration") or []:
        if isinstance(item, dict) and _num(item.get("alone_iteration_us")):
            out[str(item.get("kernel"))] = float(item["alone_iteration_us"])
    for item in (exp or {}).get("alone_iteration_us") or []:
        if isinstance(item, (list, tuple)) and len(item) == 2 and _num(item[1]):
            out[str(item[0])] = float(item[1])
        elif isinstance(item, dict) and _num(item.get("us")):
            out[str(item.get("kernel"))] = float(item["us"])
    alone = (exp or {}).get("alone_iteration_us")
    if isinstance(alone, dict):
        out = {k: float(v) for k, v in alone.items() if _num(v)}
    return out


def cells_table(exp: dict) -> pd.DataFrame:
    """One row per measured run (kernel × scenario × policy × repetition)."""
    rows = []
    for c in exp.get("cells") or []:
        r = {k: c.get(k) for k in ("kernel", "scenario", "policy", "rep")}
        for i, t in enumerate(c.get("vm_run_time_s") or []):
            r[f"vm{i + 1}_run_time_s"] = _num(t)
        for k in ("total_run_time_s", "corun_fraction", "corun_lower", "idle_cpu_share",
                  "planned_idle_share", "leak_share", "slice_us_p50", "slice_us_p99",
                  "apply_us_p50", "others_share", "steal_share"):
            r[k] = _num(c.get(k))
        r["instance_rates"] = "; ".join(f"vm{int(vm) + 1} {_num(rate) or 0:.1f}/s"
                                        for vm, rate in (c.get("instance_rates") or []))
        r["regroups"] = (regroups_text(c.get("regroups"))
                         if c.get("policy") == "partial-auto" else "")
        r["notes"] = " | ".join(map(str, c.get("notes") or []))
        r["label"] = "measured"
        rows.append(r)
    return pd.DataFrame(rows)


def rows_table(exp: dict) -> pd.DataFrame:
    """The CLI's summary rows (measured improvement with interval, predicted = modeled,
    simulated = the simulator on the same configuration)."""
    df = pd.DataFrame(exp.get("rows") or [])
    if df.empty:
        return df
    for col in ("simulated", "simulated_within_ci", "corun_fraction_median",
                "idle_cpu_share_median", "predicted", "ci_lo", "ci_hi", "foreign_load_runs"):
        if col not in df:
            df[col] = None
    df["label"] = "measured (predicted: modeled; simulated: simulated)"
    return df


def validation_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per measured row: the simulated value for the same configuration beside the measured
    median and 95% interval, and whether it lies inside. `inside` is the CLI's
    simulated_within_ci; `inside_check` recomputes it from the numbers (they must agree)."""
    out = []
    for r in rows.to_dict("records"):
        sim, lo, hi = _num(r.get("simulated")), _num(r.get("ci_lo")), _num(r.get("ci_hi"))
        check = None if sim is None or lo is None or hi is None else bool(lo <= sim <= hi)
        flag = r.get("simulated_within_ci")
        flag = None if flag is None or (isinstance(flag, float) and math.isnan(flag)) else bool(flag)
        inside = flag if flag is not None else check
        out.append({"kernel": r.get("kernel"), "scenario": r.get("scenario"),
                    "policy": r.get("policy"), "n": r.get("n"),
                    "measured_median": _num(r.get("improvement_over_full")),
                    "measured_ci_lo": lo, "measured_ci_hi": hi,
                    "simulated": sim, "predicted": _num(r.get("predicted")),
                    "corun_fraction_median": _num(r.get("corun_fraction_median")),
                    "idle_cpu_share_median": _num(r.get("idle_cpu_share_median")),
                    "foreign_load_runs": int(_num(r.get("foreign_load_runs")) or 0),
                    "inside": inside, "inside_check": check,
                    "verdict": ("no simulated value" if inside is None
                                else "inside" if inside else "outside")})
    return pd.DataFrame(out)


def validation_sentence(v: pd.DataFrame) -> str:
    if v.empty:
        return "No measured rows: nothing to validate."
    with_sim = v[v["verdict"] != "no simulated value"]
    k = int((with_sim["verdict"] == "inside").sum())
    s = (f"Of {len(v)} measured row(s), {len(with_sim)} have a simulated value for the same "
         f"configuration; {k} of them lie inside the measured 95% interval and "
         f"{len(with_sim) - k} outside (simulated vs measured).")
    parts = []
    for pol, g in with_sim.groupby("policy", sort=False):
        parts.append(f"{pol}: {int((g['verdict'] == 'inside').sum())}/{len(g)} inside")
    if parts:
        s += " Per policy: " + "; ".join(parts) + "."
    if len(v) > len(with_sim):
        s += f" {len(v) - len(with_sim)} row(s) have no simulated value (the CLI gave none)."
    if "foreign_load_runs" in v:
        loaded = v[v["foreign_load_runs"] > 0]
        if len(loaded):
            s += (f" {len(loaded)} row(s) overlapped load from outside (other processes or the "
                  "hypervisor took > 5% of the machine's CPU time in "
                  f"{int(loaded['foreign_load_runs'].sum())} run(s); measured): those say as much "
                  "about that load as about the policy.")
    bad = v[(v["inside_check"].notna()) & (v["inside"] != v["inside_check"])]
    if len(bad):
        s += (f" WARNING: for {len(bad)} row(s) the CLI's simulated_within_ci disagrees with "
              "the numbers it printed.")
    return s


def sim_policy_rows(data: dict) -> list[dict]:
    """One row per policy of a `preheat cosched simulate --json` output (tolerant of extra and
    missing fields)."""
    rows = []
    for p in (data or {}).get("policies") or []:
        if not isinstance(p, dict):
            continue
        r = {"policy": p.get("policy"), "label": data.get("label", "simulated")}
        for k in ("improvement_over_full", "predicted_improvement", "total_run_time_s",
                  "idle_cpu_share", "corun_fraction"):
            r[k] = _num(p.get(k))
        for i, vm in enumerate(p.get("vms") or []):
            if isinstance(vm, dict):
                r[f"vm{i + 1}_run_time_s"] = _num(vm.get("run_time_s"))
        rows.append(r)
    return rows


SIM_KEYS = ("host", "host_label", "cpus", "vms", "kernel", "scenario", "seed", "phase_us",
            "phase_source", "sync", "duration_s", "detect_s")


def sims_table(records: Sequence[dict]) -> pd.DataFrame:
    """One row per simulator run and policy."""
    rows = []
    for rec in records:
        if rec.get("status") != "ok":
            continue
        for r in sim_policy_rows(rec.get("data") or {}):
            rows.append({**{k: rec.get(k) for k in SIM_KEYS}, **r})
    return pd.DataFrame(rows)


def sim_summary(sims: pd.DataFrame) -> pd.DataFrame:
    """Per host × kernel × scenario × policy: median and range over seeds (simulated)."""
    if sims.empty:
        return pd.DataFrame()
    keys = ["host", "host_label", "cpus", "vms", "kernel", "scenario", "policy"]
    out = []
    for key, g in sims.groupby(keys, sort=False, dropna=False):
        imp = stats.clean(g["improvement_over_full"])
        out.append({**dict(zip(keys, key)), "seeds": int(g["seed"].nunique()),
                    "median": stats.quantile(imp, 0.5),
                    "min": float(imp.min()) if len(imp) else math.nan,
                    "max": float(imp.max()) if len(imp) else math.nan,
                    "predicted": stats.quantile(stats.clean(g["predicted_improvement"]), 0.5),
                    "idle_cpu_share_median": stats.quantile(stats.clean(g["idle_cpu_share"]), 0.5),
                    "corun_fraction_median": stats.quantile(stats.clean(g["corun_fraction"]), 0.5),
                    "phase_us": g["phase_us"].iloc[0], "sync": g["sync"].iloc[0],
                    "duration_s": g["duration_s"].iloc[0], "detect_s": g["detect_s"].iloc[0],
                    "label": "simulated (predicted: modeled)"})
    return pd.DataFrame(out)


def auto_sets_table(exp: dict) -> pd.DataFrame:
    """partial-auto: the sets detected at each regroup, per measured run, beside
    partial-static's sets."""
    vm = exp.get("vm_vcpus") or [exp.get("cpus", 2), max(1, exp.get("cpus", 2) // 2)]
    rows = []
    for c in exp.get("cells") or []:
        if c.get("policy") != "partial-auto":
            continue
        ev = _regroup_events(c.get("regroups"))
        try:
            st = _sets_text(static_sets(c.get("scenario"), vm))
        except (KeyError, IndexError, TypeError):
            st = "?"
        rows.append({"kernel": c.get("kernel"), "scenario": c.get("scenario"),
                     "rep": c.get("rep"), "regroups": len(ev),
                     "detected sets over time": regroups_text(c.get("regroups")),
                     "last detected": _sets_text(ev[-1][1]) if ev else "–",
                     "partial-static's sets": st, "label": "measured"})
    return pd.DataFrame(rows)
