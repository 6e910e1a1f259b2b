"""preheat lab cosched: partial coscheduling (Busse et al., SAC'15, §4–5) — the paper's
Figures 6/7 measured at this machine's size, simulated at the paper's size and beyond.

Three kinds of numbers, and every figure, table and sentence says which:

* MEASURED — `preheat cosched experiment` on this machine: VM1 has as many vCPUs as the host
  has CPUs, VM2 half; the bundled NPB-style kernels are the VMs' loads; scenarios single and
  double (quad needs ≥ 4 CPUs: the CLI skips it with a note); policies none, full,
  partial-static, partial-auto. Improvement over full = T_full / T_policy − 1, paired within a
  repetition, median over repetitions with a 95% order-statistic interval (the CLI computes
  it; `rows[]`). Co-run fraction and idle CPU share come from the controller (`cells[]`).
* SIMULATED — `preheat cosched simulate`: (1) the experiment's own simulation of the same
  configuration (`rows[].simulated`, and whether it lies in the measured interval), the
  validation; (2) the paper's host (8 CPUs, VMs 8+4) and larger ones (64 CPUs: VMs 64+32, and
  "many VMs" 64+32+16+16) for every kernel × scenario × several seeds (median and range). The
  phase time is the kernel's measured alone iteration time divided by its barriers per
  iteration (mg, is: 2; cg: 1; ep: none, simulated without barriers).
* MODELED — the setup's closed-form prediction (`predicted`; the paper's 33% for double and
  quad, up to 100% for single).

The paper's own results (§5, §7) are quoted beside ours, labeled "the paper's".

Outputs in --out DIR: raw/experiment.json (the CLI's JSON, or a copy of --from), raw/sim/*.json,
cells / rows / validation / auto_sets / sim_runs / sim_summary / paper (.csv, .parquet),
improvement-measured, improvement-simulated-*, corun-idle-measured (.png, .svg),
heatmap-*.png (when the experiment JSON has partial-auto matrices), summary.json, report.html.
"""

from __future__ import annotations

import html
import math
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from . import atomic, cli, comm, labreport, proc, stats, sweep
from .cli import ToolError
from .progress import Progress
from .report import Report

KERNELS = comm.KERNELS
SCENARIOS = ("single", "double", "quad")
POLICIES = ("none", "full", "partial-static", "partial-auto")
PARTIAL = ("partial-static", "partial-auto")
SIM_POLICIES = ("full",) + PARTIAL
#: Barriers per iteration of each bundled kernel (the simulator's phase = iteration / barriers).
BARRIERS = {"mg": 2, "is": 2, "cg": 1, "ep": 0}
COLORS = {"partial-static": "#1f77b4", "partial-auto": "#ff7f0e", "none": "#7f7f7f",
          "full": "#2ca02c"}

#: Per cell of the measured experiment beyond --seconds + 0.5: starting the VMs, resetting,
#: stopping, restoring (measured on a 2-CPU machine: 32 cells of 2 s took 149 s).
CELL_OVERHEAD_S = 1.9
#: Per kernel: the calibration runs (3 alone runs of 1 s) that measure the iteration time.
ALONE_S = 4.0
#: Wall time of `preheat cosched simulate` (debug build, measured on 2 CPUs): per simulated
#: thread phase, per CPU × slice, start-up per run and per host CPU; a release build is ~12×
#: faster.
SIM_S_PER_PHASE = 3e-6
SIM_S_PER_CPU_SLICE = 3e-5
SIM_START_S = 0.1
SIM_START_PER_CPU_S = 0.02
SIM_RELEASE_SPEEDUP = 12.0
#: Wall-time budget of the simulations (default, --quick): beyond it the 64-CPU hosts simulate
#: a shorter time (see fit_budget), so the whole command stays under 30 min (a few with --quick).
SIM_BUDGET_S = {False: 360.0, True: 60.0}
#: No host simulates less than this (100 slices of 10 ms).
SIM_MIN_DURATION_S = 1.0
#: Phase time assumed for the estimate before the kernels' iteration times are measured.
SIM_PHASE_GUESS_US = 1000.0
SIM_TIMEOUT_S = 600.0
#: The simulator's defaults: 20 s simulated, the first partial-auto regroup at 5 s (the paper's
#: daemon period). Hosts with a shorter duration keep this ratio.
SIM_DEFAULT_DURATION_S = 20.0
SIM_DETECT_SHARE = 5.0 / 20.0


@dataclass(frozen=True)
class SimHost:
    key: str
    label: str
    cpus: int
    vms: tuple[int, ...]
    #: simulated seconds (None: the simulator's default); detect_s = SIM_DETECT_SHARE × this
    duration_s: float | None = None

    @property
    def vm_text(self) -> str:
        return "+".join(map(str, self.vms))

    def duration(self, quick: bool, scale: float = 1.0) -> float:
        """Simulated seconds: the host's (a quarter with --quick), × SCALE (fit_budget) but at
        least SIM_MIN_DURATION_S."""
        d = (self.duration_s or SIM_DEFAULT_DURATION_S) / (4 if quick else 1)
        return d if scale >= 1.0 else max(min(d, SIM_MIN_DURATION_S), round(d * scale, 3))


SIM_HOSTS = (
    SimHost("8cpu", "8 CPUs, VMs 8+4 (the paper's host size)", 8, (8, 4)),
    # 5 simulated seconds: a 64-CPU run costs 8× an 8-CPU one per simulated second.
    SimHost("64cpu", "64 CPUs, VMs 64+32", 64, (64, 32), 5.0),
    # VM sizes that pack the host exactly under full coscheduling (32+16+16 = 64): the model
    # predicts no gain for double and quad — a check that the simulator agrees.
    SimHost("64cpu-many", "64 CPUs, VMs 64+32+16+16 (many VMs)", 64, (64, 32, 16, 16), 5.0),
)

#: The paper's findings (§5 Figures 6/7 text and §7), for the report; labeled "the paper's".
PAPER = [
    {"scenario": "single",
     "the paper's expectation": "up to +100% (theoretical: VM1's idle half need not be "
                                "scheduled; lower in practice, an OS thread on an idle vCPU "
                                "forces the whole set)",
     "the paper's static result (Gainestown)": "only BT and EP close to the expectation "
                                               "(contention: load rises from 50% to 100%)",
     "the paper's automatic result": "lower than static (detection time, SPCD overhead); "
                                     "mostly better than full"},
    {"scenario": "double",
     "the paper's expectation": "+33% (full coscheduling wastes half the CPUs while VM2 runs)",
     "the paper's static result (Gainestown)": "no benchmark close to the expectation "
                                               "(far below; housekeeping tasks)",
     "the paper's automatic result": "CG, UA and IS worse than full (t = 1.5 not suited; IS "
                                     "too short for the detection)"},
    {"scenario": "quad",
     "the paper's expectation": "+33%",
     "the paper's static result (Gainestown)": "close to the expectation except LU and MG "
                                               "(cache contention)",
     "the paper's automatic result": "lower than static; mostly better than full"},
]
PAPER_OVERALL = ("the paper's overall result (§7): up to +100% with static partial "
                 "coscheduling and up to +50% with automatic partial coscheduling; the "
                 "Lynnfield machine (SMT on) less predictable than Gainestown")


# ---------------------------------------------------------------------------------------------
# Options


@dataclass
class Options:
    kernels: tuple[str, ...] = KERNELS
    scenarios: tuple[str, ...] = ("single", "double")
    reps: int = 5
    seconds: float = 6.0
    regroup_s: float = 1.5
    slice_ms: float = 10.0
    seed: int = 1
    measure: bool = True
    from_file: Path | None = None
    sim_seeds: int = 5
    sim_hosts: tuple[SimHost, ...] = SIM_HOSTS
    sim_scenarios: tuple[str, ...] = SCENARIOS
    quick: bool = False

    @classmethod
    def make(cls, quick: bool = False, kernels: str | None = None, reps: int | None = None,
             seconds: float | None = None, sim_seeds: int | None = None,
             measure: bool = True, from_file: Path | None = None) -> Options:
        """The command line's options (`--quick`: mg,ep; single,double; 2 repetitions of 2 s;
        regrouping every 0.7 s; 2 simulator seeds). ValueError on a bad value."""
        o = cls(quick=quick, measure=measure, from_file=Path(from_file) if from_file else None)
        if quick:
            o.kernels, o.reps, o.seconds, o.regroup_s, o.sim_seeds = ("mg", "ep"), 2, 2.0, 0.7, 2
        if kernels is not None:
            ks = tuple(k.strip() for k in kernels.split(",") if k.strip())
            bad = [k for k in ks if k not in KERNELS]
            if bad or not ks:
                raise ValueError(f"--kernels: unknown or no kernel(s) {', '.join(bad)} "
                                 f"(known: {', '.join(KERNELS)})")
            o.kernels = ks
        if reps is not None:
            if reps < 1:
                raise ValueError("--reps must be at least 1")
            o.reps = reps
        if seconds is not None:
            if not seconds > 0:
                raise ValueError("--seconds must be positive")
            o.seconds = seconds
        if sim_seeds is not None:
            if sim_seeds < 0:
                raise ValueError("--sim-seeds must be ≥ 0 (0: no simulations)")
            o.sim_seeds = sim_seeds
        if o.from_file is not None and not o.from_file.is_file():
            raise ValueError(f"--from {o.from_file}: no such file")
        return o

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sim_hosts"] = [h.label for h in self.sim_hosts]
        d["from_file"] = str(self.from_file) if self.from_file else None
        return d


def measured_cells(o: Options) -> int:
    return len(o.kernels) * len(o.scenarios) * len(POLICIES) * o.reps


def estimate_experiment_s(o: Options) -> float:
    return measured_cells(o) * (o.seconds + 0.5 + CELL_OVERHEAD_S) + len(o.kernels) * ALONE_S


def _release_build() -> bool:
    try:
        return "release" in Path(cli.preheat_bin()).parts
    except ToolError:
        return False


def estimate_sims_s(plan: Sequence[dict], release: bool | None = None) -> float:
    """The simulator's cost: the thread phases it simulates (threads × time / phase) and the
    slices it plans (CPUs × time / slice)."""
    t = 0.0
    for r in plan:
        threads = sum(int(x) for x in str(r["vms"]).split("+"))
        d = r["duration_s"]
        t += (SIM_START_S + SIM_START_PER_CPU_S * r["cpus"] + SIM_S_PER_PHASE * threads * d * 1e6 / (r["phase_us"] or SIM_PHASE_GUESS_US)
              + SIM_S_PER_CPU_SLICE * r["cpus"] * d * 1e3 / r["slice_ms"])
    release = _release_build() if release is None else release
    return t / SIM_RELEASE_SPEEDUP if release else t


def fit_budget(o: Options, alone: dict[str, float], no_sync: bool, budget: float,
               release: bool | None = None) -> tuple[float, int]:
    """(scale, seeds) that bring the estimated wall time of the simulations within BUDGET
    seconds: first every host's simulated time × scale (partial-auto's first regroup scales
    along, so its share of the run stays the same; no host below SIM_MIN_DURATION_S), then,
    if that is not enough, fewer seeds (at least 2; 1 with --quick)."""
    release = _release_build() if release is None else release
    seeds = o.sim_seeds

    def est(scale: float, n: int = seeds) -> float:
        return estimate_sims_s(sim_plan(o, alone, no_sync, scale, n), release)

    if est(1.0) <= budget:
        return 1.0, seeds
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if est(mid) <= budget else (lo, mid)
    scale = max(lo, 1e-3)
    floor = 1 if o.quick else 2
    while seeds > floor and est(scale, seeds) > budget:
        seeds -= 1
    return scale, seeds


def _minutes(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


# ---------------------------------------------------------------------------------------------
# Small helpers


_num = labreport._num  # the one finite-float parser of the lab's reports


def _pct(v, signed: bool = True, d: int = 0) -> str:
    return labreport.signed_pct(v, d=d, signed=signed)


def _pct_ci(v, lo, hi, d: int = 0) -> str:
    return labreport.signed_pct_ci(v, lo, hi, d=d)


_plt = labreport.plt
_save = labreport.save_figure


def _sets_text(sets) -> str:
    return " ".join("{" + ",".join(map(str, s)) + "}" for s in sets or [])


def _regroup_events(regroups) -> list[tuple[float | None, list]]:
    """(time s or None, sets) per regroup: entries are lists of sets, or {"at_s", "sets"}."""
    out = []
    for g in regroups or []:
        if isinstance(g, dict):
            out.append((_num(g.get("at_s")), g.get("sets") or []))
        else:
            out.append((None, g))
    return out


def regroups_text(regroups) -> str:
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


# ---------------------------------------------------------------------------------------------
# The CLI's JSON → tables


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
                  "apply_us_p50"):
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
                "idle_cpu_share_median", "predicted", "ci_lo", "ci_hi"):
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


# ---------------------------------------------------------------------------------------------
# Figures


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

    def lab(name):
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
        ax.set_xticklabels([f"{k}\n({(comm.STANDS_IN_FOR.get(k) or k).split(' (')[0]})" for k in ks],
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


# ---------------------------------------------------------------------------------------------
# Running the CLI


def experiment_argv(o: Options) -> list[str]:
    return [cli.preheat_bin(), "cosched", "experiment", "--json",
            "--kernels", ",".join(o.kernels), "--scenarios", ",".join(o.scenarios),
            "--policies", ",".join(POLICIES), "--reps", str(o.reps), "--seconds", f"{o.seconds:g}",
            "--slice-ms", f"{o.slice_ms:g}", "--regroup-s", f"{o.regroup_s:g}",
            "--seed", str(o.seed)]


def run_experiment(o: Options, raw: Path, prog: Progress) -> dict:
    """`preheat cosched experiment --json` (stdout → raw/experiment.json); progress = elapsed
    time against the estimate."""
    if not cli.help_text("cosched", "experiment"):
        raise ToolError(f"{cli.preheat_bin()} has no `cosched experiment` (build the workspace: "
                        "cargo build --release)")
    est = estimate_experiment_s(o)
    prog.task(f"measured experiment ({measured_cells(o)} runs, ~{_minutes(est)})", int(est))
    cmd = experiment_argv(o)
    out_json, err = raw / "experiment.json", raw / "experiment.stderr.txt"
    t0 = time.monotonic()
    rc = proc.run_child(cmd, out_json, err, timeout=2 * est + 300,
                        on_tick=lambda: prog.update(int(time.monotonic() - t0)))
    took = time.monotonic() - t0
    if rc != 0:
        raise ToolError(f"{' '.join(cmd)}: " + cli.failure_reason(
            err.read_text(errors="replace") if err.exists() else "", rc))
    data = load_experiment(out_json)
    data.setdefault("regroup_s", o.regroup_s)
    prog.advance(f"{took:.0f} s (estimated {est:.0f} s)")
    return data


def sim_plan(o: Options, alone: dict[str, float], no_sync: bool, scale: float = 1.0,
             seeds: int | None = None) -> list[dict]:
    """One simulator run per host × kernel × scenario × seed (SCALE, SEEDS: see fit_budget;
    default: the options' seeds)."""
    plan: list[dict] = []
    seeds = o.sim_seeds if seeds is None else seeds
    if seeds <= 0:
        return plan
    for h in o.sim_hosts:
        dur = h.duration(o.quick, scale)
        for k in o.kernels:
            it = alone.get(k)
            sync = BARRIERS.get(k, 1) > 0
            phase = it / max(BARRIERS.get(k, 1), 1) if it else None
            for s in o.sim_scenarios:
                for seed in range(1, seeds + 1):
                    point = {"cpus": h.cpus, "vm": h.vm_text, "scenario": s, "seed": seed,
                             "slice_ms": o.slice_ms, "duration_s": dur,
                             "detect_s": round(dur * SIM_DETECT_SHARE, 4)}
                    if phase:
                        point["phase_us"] = round(phase, 3)
                    args = sweep.cosim_args(point) + ["--policy", ",".join(SIM_POLICIES)]
                    if not sync and no_sync:
                        args.append("--no-sync")
                    plan.append({
                        "id": f"{h.key}-{k}-{s}-s{seed}", "host": h.key, "host_label": h.label,
                        "cpus": h.cpus, "vms": h.vm_text, "kernel": k, "scenario": s,
                        "seed": seed, "phase_us": round(phase, 3) if phase else None,
                        "duration_s": dur, "detect_s": point["detect_s"],
                        "slice_ms": o.slice_ms,
                        "phase_source": ("measured alone iteration / barriers" if phase
                                         else "simulator default (no measured iteration time)"),
                        "sync": sync or not no_sync, "args": args, "status": "pending"})
    return plan


def run_simulations(plan: list[dict], raw: Path, prog: Progress, failures: list[str]) -> None:
    """Run the plan one at a time (raw/ID.json, raw/ID.stderr.txt); failures with the same
    reason are reported once."""
    if not plan:
        return
    reasons: dict[str, list[str]] = {}
    binary = cli.preheat_bin()
    t_all = time.monotonic()
    for i, rec in enumerate(plan):
        prog.task(f"simulate {rec['id']}", 1)
        cmd = sweep.cosim_argv(binary, rec["args"])
        rec["command"] = " ".join(cmd)
        out, err = raw / f"{rec['id']}.json", raw / f"{rec['id']}.stderr.txt"
        t0 = time.monotonic()
        try:
            rc = proc.run_child(cmd, out, err, timeout=SIM_TIMEOUT_S)
        except proc.ChildTimeout as e:
            rc, why = -1, str(e)
        else:
            why = "" if rc == 0 else cli.failure_reason(
                err.read_text(errors="replace") if err.exists() else "", rc)
        rec["seconds"] = round(time.monotonic() - t0, 3)
        data = cli.read_json(out) if rc == 0 else None
        if rc == 0 and not (isinstance(data, dict) and data.get("policies")):
            why = "printed no JSON with \"policies\""
        if why:
            rec["status"], rec["reason"] = "failed", why
            reasons.setdefault(why, []).append(rec["id"])
        else:
            rec["status"], rec["data"] = "ok", data
        left = len(plan) - i - 1
        eta = (time.monotonic() - t_all) / (i + 1) * left
        prog.advance(rec["status"] + (f" ({why})" if why else "")
                     + (f"; ~{_minutes(eta)} left" if left else ""))
    for why, ids in reasons.items():
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        failures.append(f"simulate: {len(ids)} run(s) failed ({', '.join(ids[:3])}{more}): {why}")


# ---------------------------------------------------------------------------------------------
# Rendering


def _guard(failures: list[str], what: str, fn: Callable, *a, **kw):
    """Run one rendering part; a failure is reported (HTML, exit code 1), the rest renders."""
    try:
        return fn(*a, **kw)
    except Exception as e:
        failures.append(f"render {what}: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        return None


def _validation_display(v: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "kernel": v["kernel"], "scenario": v["scenario"], "policy": v["policy"], "n": v["n"],
        "measured median [95% interval]": [_pct_ci(a, b, c, 1) for a, b, c in
                                           zip(v["measured_median"], v["measured_ci_lo"],
                                               v["measured_ci_hi"])],
        "simulated, same configuration": v["simulated"].map(lambda x: _pct(x, d=1)),
        "simulated within the measured interval": v["verdict"].map(
            {"inside": "yes (inside)", "outside": "NO (outside)",
             "no simulated value": "–"}),
        "predicted (modeled)": v["predicted"].map(_pct),
        "co-run fraction (measured median)": v["corun_fraction_median"].map(
            lambda x: _pct(x, False)),
        "idle CPU share (measured median)": v["idle_cpu_share_median"].map(
            lambda x: _pct(x, False))})


def _sim_display(s: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel × scenario: each policy's simulated median [min, max over seeds] and
    idle CPU share."""
    out = []
    for (k, sc), g in s.groupby(["kernel", "scenario"], sort=False):
        by = {r["policy"]: r for r in g.to_dict("records")}
        r0 = g.iloc[0]
        row = {"kernel": k, "scenario": sc, "seeds": int(g["seeds"].max())}
        for pol in PARTIAL:
            r = by.get(pol)
            row[f"{pol} (median [min, max])"] = (_pct_ci(r["median"], r["min"], r["max"])
                                                 if r else "–")
        pr = by.get("partial-static", r0)
        row["predicted (modeled)"] = _pct(pr["predicted"])
        for pol in SIM_POLICIES:
            r = by.get(pol)
            row[f"idle CPU share, {pol}"] = _pct(r["idle_cpu_share_median"], False) if r else "–"
        row["phase µs"] = f"{r0['phase_us']:.0f}" if _num(r0["phase_us"]) else "default"
        row["barriers"] = "yes" if r0["sync"] else "none"
        out.append(row)
    return pd.DataFrame(out)


def paper_table(rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The paper's findings per scenario beside ours (measured at this size, simulated at 8
    CPUs): partial-static's median over kernels with the range over kernels."""
    out = []
    for p in PAPER:
        s = p["scenario"]
        r = dict(p)
        for pol in PARTIAL:
            short = pol.split("-")[1]
            m = rows[(rows["scenario"] == s) & (rows["policy"] == pol)] if len(rows) else rows
            vals = stats.clean(m["improvement_over_full"] if len(m) else [])
            r[f"ours, {short}, measured (median over kernels [min, max])"] = (
                _pct_ci(stats.quantile(vals, 0.5), min(vals), max(vals)) if len(vals)
                else "not measured here")
            g = (summary[(summary["host"] == "8cpu") & (summary["scenario"] == s)
                         & (summary["policy"] == pol)] if len(summary) else summary)
            sv = stats.clean(g["median"] if len(g) else [])
            r[f"ours, {short}, simulated at 8 CPUs"] = (
                _pct_ci(stats.quantile(sv, 0.5), min(sv), max(sv)) if len(sv) else "–")
        pr = stats.clean(rows[rows["scenario"] == s]["predicted"] if len(rows) else [])
        if not len(pr) and len(summary):
            pr = stats.clean(summary[(summary["host"] == "8cpu") & (summary["scenario"] == s)
                                     & (summary["policy"] == "partial-static")]["predicted"])
        r["ours, predicted (modeled)"] = _pct(stats.quantile(pr, 0.5)) if len(pr) else "–"
        out.append(r)
    return pd.DataFrame(out)


INTRO = (
    "Busse et al., Partial Coscheduling of Virtual Machines Based on Memory Access Patterns "
    "(SAC'15), §4–5: two VMs, VM1 as large as the host and VM2 half of it; VM2 runs one "
    "parallel instance on all its vCPUs, VM1 one on half (single), two on halves (double) or "
    "four on quarters (quad). Full coscheduling runs each VM as one set, so while VM2 runs half "
    "the host idles; partial coscheduling runs sets that match the load (static: known; auto: "
    "detected from shared-page communication, t = 1.5). The metric (the paper's): VM2's run "
    "time plus the mean run time of VM1's instances for a fixed job; improvement over full = "
    "T_full / T_policy − 1. Labels: MEASURED = `preheat cosched experiment` on this machine "
    "(user-space coscheduler on a stock kernel; the bundled NPB-style kernels as loads); "
    "SIMULATED = `preheat cosched simulate` (discrete-event host model; phase time from the "
    "measured alone iteration time); MODELED = the setup's closed-form prediction; the "
    "paper's = quoted from the paper, not comparable in absolute terms (KVM guests, a "
    "coscheduling kernel, NPB class B, 8 CPUs).")


def render(out: Path, exp: dict | None, records: Sequence[dict], state: dict,
           opts: Options | None = None) -> dict:
    """Tables, figures, summary.json and report.html from an experiment JSON (or None) and the
    simulator runs. Returns {"figures": [(png, title)], "tables": [...], "validation": ...}.
    Failures of a part go to state["failures"] (and the report); the rest still renders."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    failures = state.setdefault("failures", [])
    figures: list[tuple[Path, str]] = []
    tables: list[tuple[str, str]] = []
    rep = Report("preheat lab cosched: partial coscheduling — measured, simulated, modeled")
    rep.text(INTRO)
    if state.get("state") not in (None, "complete"):
        rep.note(f"cosched: {str(state['state']).upper()} (interrupted by "
                 f"{state.get('interrupted_by')}) — below is what finished before.", "warn")
    for n in state.get("notes") or []:
        rep.note(f"note: {n}")
    body = Report("")  # sections after the failure notes (failures found while rendering)

    def table(name: str, df: pd.DataFrame, caption: str, display: pd.DataFrame | None = None):
        atomic.write_table(out / name, df)
        tables.append((f"{name}.csv", caption))
        body.table(display if display is not None else df, caption)

    def figure(png: Path | None, title: str):
        if png is not None:
            figures.append((png, title))
            body.image(png, title, png.with_suffix(".svg"))

    rows = pd.DataFrame()
    summary = pd.DataFrame()
    validation = {}
    if exp:
        cpus = exp.get("cpus", "?")
        vm = "+".join(map(str, exp.get("vm_vcpus") or []))
        where = f"{cpus} CPUs, VMs {vm}"
        body.heading(f"Measured on this machine ({where})")
        body.text(f"`preheat cosched experiment`: {exp.get('reps')} repetition(s) per cell, "
                  f"{exp.get('seconds')} s runs, {exp.get('slice_ms')} ms slices, repetitions "
                  "interleaved and shuffled. Whiskers: 95% order-statistic interval of the "
                  "median over repetitions (measured).")
        for n in exp.get("notes") or []:
            body.note(f"experiment note: {n}")
        rows = _guard(failures, "rows", rows_table, exp)
        rows = rows if rows is not None else pd.DataFrame()
        cells = _guard(failures, "cells", cells_table, exp)
        cells = cells if cells is not None else pd.DataFrame()
        if len(rows):
            png = _guard(failures, "figure (a)", fig_improvement, measured_bars(rows),
                         out / "improvement-measured",
                         f"MEASURED at {where}: improvement over full coscheduling (bars: "
                         "median, whiskers: 95% interval; dashed: predicted, modeled; "
                         "diamond: SIMULATED, same configuration)", "95% interval (measured)",
                         True)
            figure(png, f"MEASURED improvement over full at {where} (the paper's Figures 6/7 "
                        "shape), predicted (modeled) dashed, simulated diamonds")
            body.heading("Validation: simulated vs measured, same configuration", 3)
            v = validation_table(rows)
            sentence = validation_sentence(v)
            validation = {"rows": len(v), "with_simulated": int((v["verdict"] != "no simulated value").sum()),
                          "inside": int((v["verdict"] == "inside").sum()),
                          "outside": int((v["verdict"] == "outside").sum()), "sentence": sentence}
            body.text(sentence)
            cap = (f"measured median and 95% interval beside the SIMULATED value for the same "
                   f"configuration ({where}); predicted = modeled")
            table("validation", v, cap, _validation_display(v))
            atomic.write_table(out / "rows", rows)
            cap = ("the experiment's rows as the CLI gave them (measured; predicted: modeled; "
                   "simulated: simulated)")
            tables.append(("rows.csv", cap))
        if len(cells):
            png = _guard(failures, "figure (c)", fig_corun_idle, cells, out / "corun-idle-measured",
                         f"MEASURED at {where}: co-run fraction and idle CPU share per policy "
                         "(bars: median over runs, whiskers: 95% interval, dots: runs, x: planned)")
            figure(png, f"MEASURED co-run fraction and idle CPU share per policy ({where})")
            auto = _guard(failures, "auto sets", auto_sets_table, exp)
            if auto is not None and len(auto):
                body.heading("partial-auto: the detected sets over time (measured)", 3)
                regroup = _num(exp.get("regroup_s"))
                body.text("vCPUs in global indices (VM1's first). Each regroup re-evaluates the "
                          "communication matrix (SPCD, reset after start-up) with eq. 1, "
                          "t = 1.5" + (f", every {regroup:g} s" if regroup else "")
                          + "; the paper re-evaluated every 5 s.")
                table("auto_sets", auto, "partial-auto: sets detected per measured run beside "
                                         "partial-static's sets (measured)")
            table("cells", cells, "every measured run (measured)")
        for png, title in (_guard(failures, "heatmaps", heatmaps, exp, out) or []):
            figure(png, title)
        for title, text in (_guard(failures, "trees", trees, exp, out) or []):
            body.heading(title, 4)
            body.html(f"<pre>{html.escape(text)}</pre>")
    elif state.get("experiment_status"):
        body.note(f"measured experiment: {state['experiment_status']}", "warn")

    sims = _guard(failures, "simulator runs", sims_table, records)
    if sims is not None and len(sims):
        summary = sim_summary(sims)
        atomic.write_table(out / "sim_runs", sims)
        tables.append(("sim_runs.csv", "every simulator run and policy (simulated)"))
        body.heading("Simulated at the paper's size and beyond")
        p0 = next((r.get("data", {}).get("params") for r in records if r.get("status") == "ok"), None)
        body.text("`preheat cosched simulate` per host × kernel × scenario × seed (policies "
                  "full, partial-static, partial-auto); bars: median over seeds, whiskers: "
                  "min–max over seeds (SIMULATED); dashed: predicted (modeled). Phase time = "
                  "the kernel's measured alone iteration time / barriers per iteration "
                  "(mg, is: 2; cg: 1; ep: no barriers, --no-sync); the slice is the measured "
                  "experiment's. Each host simulates a fixed time with partial-auto's first "
                  "regroup at a quarter of it (the simulator's default: 20 s and 5 s, the "
                  "paper's daemon period; the 64-CPU hosts 5 s and 1.25 s, to bound the cost). "
                  "The other parameters are the simulator's defaults"
                  + (f" (the first run's: {p0})" if p0 else "") + ".")
        for h in (opts.sim_hosts if opts else SIM_HOSTS):
            g = summary[summary["host"] == h.key]
            if g.empty:
                continue
            nseeds = int(g["seeds"].max())
            png = _guard(failures, f"figure (b) {h.key}", fig_improvement, simulated_bars(g),
                         out / f"improvement-simulated-{h.key}",
                         f"SIMULATED: {h.label} — improvement over full (median, whiskers: "
                         f"min–max over {nseeds} seed(s); dashed: predicted, modeled)",
                         f"min–max over {nseeds} seed(s) (simulated)", False)
            figure(png, f"SIMULATED improvement over full, {h.label}")
            when = (f"{g['duration_s'].iloc[0]:g} s simulated, first regroup at "
                    f"{g['detect_s'].iloc[0]:g} s")
            table(f"sim_summary-{h.key}", g, f"SIMULATED: {h.label}, {when} (median and range "
                                             f"over seeds; predicted: modeled)", _sim_display(g))
        atomic.write_table(out / "sim_summary", summary)
        tables.append(("sim_summary.csv", "simulated summary (all hosts)"))

    body.heading("The paper's findings beside ours")
    body.text(PAPER_OVERALL + ".")
    pt = _guard(failures, "paper table", paper_table, rows, summary)
    if pt is not None:
        table("paper", pt, "the paper's expectations and results (Gainestown, Figure 6) beside "
                           "ours (measured at this size; simulated at 8 CPUs; predicted: modeled)")
    ours = []
    for pol in PARTIAL:
        if len(rows):
            v = stats.clean(rows[rows["policy"] == pol]["improvement_over_full"])
            if len(v):
                ours.append(f"{pol} up to {_pct(max(v))} (measured)")
        if len(summary):
            v = stats.clean(summary[(summary["host"] == "8cpu") & (summary["policy"] == pol)]["median"])
            if len(v):
                ours.append(f"{pol} up to {_pct(max(v))} (simulated, 8 CPUs)")
    if ours:
        body.text("Ours, the largest improvement over full: " + "; ".join(ours) + ".")

    for f in failures:
        rep.note(f, "fail")
    rep.parts.extend(body.parts)
    if tables or figures:
        links = [t for t, _ in tables] + [p.name for p, _ in figures]
        rep.heading("Files")
        rep.html("<p class='note'>" + ", ".join(
            f"<a href='{html.escape(f)}'>{html.escape(f)}</a>" for f in links)
            + "; raw CLI outputs under raw/.</p>")
    summary_json = {**state, "figures": [{"file": p.name, "title": t} for p, t in figures],
                    "tables": [{"file": f, "title": t} for f, t in tables],
                    "validation": validation}
    atomic.write_json(out / "summary.json", summary_json)
    rep.write(out / "report.html")
    return {"figures": figures, "tables": tables, "validation": validation}


# ---------------------------------------------------------------------------------------------
# The command


def run(out: Path, o: Options) -> int:
    out = Path(out)
    raw = out / "raw"
    (raw / "sim").mkdir(parents=True, exist_ok=True)
    state: dict = {"kind": "cosched", "state": "running", "options": o.to_dict(),
                   "failures": [], "notes": []}
    failures = state["failures"]
    exp: dict | None = None
    measuring = o.measure and o.from_file is None
    est_exp = estimate_experiment_s(o) if measuring else 0.0
    guess = sim_plan(o, {}, True)
    budget = SIM_BUDGET_S[o.quick]
    n_sim, est_sim = len(guess), min(estimate_sims_s(guess), budget)
    print(f"preheat lab cosched: expected duration ~{_minutes(est_exp + est_sim)}: "
          + (f"measured experiment ~{_minutes(est_exp)} ({measured_cells(o)} runs of "
             f"{o.seconds:g} s + ~{0.5 + CELL_OVERHEAD_S:g} s each, calibration "
             f"~{len(o.kernels) * ALONE_S:.0f} s)"
             if measuring else "no measurement" + (f" (rendering {o.from_file})" if o.from_file else ""))
          + f"; {n_sim} simulator runs ≤ {_minutes(est_sim)} ("
            + ("release" if _release_build() else "debug") + " build)", flush=True)
    code = 0
    plan: list[dict] = []
    proc.reset_interrupt_state()
    with proc.interruptible(), Progress("cosched", int(measuring) + n_sim) as prog:
        try:
            if o.from_file is not None:
                try:
                    exp = load_experiment(o.from_file)
                    atomic.write_json(raw / "experiment.json", exp)
                except ToolError as e:
                    failures.append(f"--from: {e}")
            elif measuring:
                try:
                    exp = run_experiment(o, raw, prog)
                except (ToolError, proc.ChildTimeout, OSError) as e:
                    failures.append(f"measured experiment: {e}")
                    state["experiment_status"] = "FAILED (see above)"
                    prog.advance("failed")
            else:
                state["experiment_status"] = "not run (--no-measure)"
            if n_sim:
                try:
                    h = cli.help_text("cosched", "simulate")
                except ToolError as e:
                    h = ""
                    failures.append(f"simulate: {e}")
                sim = ("cosched", "simulate")
                missing = [f for f in ("--cpus", "--vm", "--scenario", "--policy", "--json")
                           if not cli.supports(sim, f)]
                no_sync = cli.supports(sim, "--no-sync")
                if h and not no_sync:
                    state["notes"].append("the simulator has no option for instances without "
                                          "barriers (--no-sync): ep is simulated with barriers")
                alone = alone_us(exp)
                scale, seeds = fit_budget(o, alone, no_sync, budget)
                plan = sim_plan(o, alone, no_sync, scale, seeds)
                if seeds < o.sim_seeds:
                    state["notes"].append(f"{seeds} simulator seed(s) instead of {o.sim_seeds} "
                                          f"to stay within {_minutes(budget)}")
                if scale < 1.0 and plan:
                    was = {h.key: h.duration(o.quick) for h in o.sim_hosts}
                    now = {r["host"]: (r["duration_s"], r["detect_s"]) for r in plan}
                    state["notes"].append(
                        "simulated time shortened to keep the simulations within "
                        f"{_minutes(budget)}: " + "; ".join(
                            f"{k}: {d:g} s, first regroup at {t:g} s (instead of {was[k]:g} s)"
                            for k, (d, t) in now.items())
                        + ("" if _release_build() else " — a debug build: a release build "
                           "simulates ~12× faster"))
                if plan and not missing:
                    prog.log(f"simulations: {len(plan)} runs, ~{_minutes(estimate_sims_s(plan))}")
                if missing:
                    why = (f"this preheat build's `cosched simulate` does not accept "
                           f"{', '.join(missing)} (not built yet? rebuild the workspace)")
                    failures.append(f"simulate: {why}")
                    for rec in plan:
                        rec["status"], rec["reason"] = "not run", why
                else:
                    run_simulations(plan, raw / "sim", prog, failures)
            state["state"] = "complete"
        except KeyboardInterrupt:  # proc.Interrupted
            code = proc.mark_interrupted(state)
            prog.log(f"cosched: interrupted by {proc.interrupted_by()}: writing what finished")
    for rec in plan:
        if rec["status"] == "pending":
            rec["status"] = "not run"
    state["simulations"] = [{k: v for k, v in r.items() if k not in ("data", "args")} for r in plan]
    for n in state["notes"]:
        print(f"note: {n}")
    res = render(out, exp, plan, state, o)
    print(f"wrote {out / 'report.html'}")
    if res["validation"]:
        print(res["validation"]["sentence"])
    for f in failures:
        print(f"failed: {f}", file=sys.stderr)
    if code == 0 and failures:
        code = 1
    return code

