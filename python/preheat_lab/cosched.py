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

The parts: `cosched_plan` (options, simulated hosts, the simulator's plan, time estimates and
budget), `cosched_run` (running the CLI), `cosched_tables` (the CLI's JSON → tables),
`cosched_figures`, `cosched_report` (rendering); this module runs the command and keeps the
parts' public names importable as `cosched.NAME`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import atomic, cli
from .cli import ToolError
from .cosched_figures import (
    COLORS,
    fig_corun_idle,
    fig_improvement,
    heatmaps,
    measured_bars,
    simulated_bars,
    trees,
)
from .cosched_plan import (
    ALONE_S,
    BARRIERS,
    CELL_OVERHEAD_S,
    KERNELS,
    PARTIAL,
    POLICIES,
    SCENARIOS,
    SIM_BUDGET_S,
    SIM_DEFAULT_DURATION_S,
    SIM_DETECT_SHARE,
    SIM_HOSTS,
    SIM_MIN_DURATION_S,
    SIM_PHASE_GUESS_US,
    SIM_POLICIES,
    SIM_RELEASE_SPEEDUP,
    SIM_S_PER_CPU_SLICE,
    SIM_S_PER_PHASE,
    SIM_START_PER_CPU_S,
    SIM_START_S,
    SIM_TIMEOUT_S,
    Options,
    SimHost,
    _release_build,
    estimate_experiment_s,
    estimate_sims_s,
    fit_budget,
    measured_cells,
    sim_plan,
)
from .cosched_report import INTRO, PAPER, PAPER_OVERALL, paper_table, render
from .cosched_run import experiment_argv, run_experiment, run_simulations
from .cosched_tables import (
    SIM_KEYS,
    alone_us,
    auto_sets_table,
    cells_table,
    load_experiment,
    regroups_text,
    rows_table,
    sim_policy_rows,
    sim_summary,
    sims_table,
    static_sets,
    validation_sentence,
    validation_table,
)
from .progress import minutes

__all__ = [
    "ALONE_S", "BARRIERS", "CELL_OVERHEAD_S", "COLORS", "INTRO", "KERNELS", "PAPER",
    "PAPER_OVERALL", "PARTIAL", "POLICIES", "SCENARIOS", "SIM_BUDGET_S", "SIM_DEFAULT_DURATION_S",
    "SIM_DETECT_SHARE", "SIM_HOSTS", "SIM_KEYS", "SIM_MIN_DURATION_S", "SIM_PHASE_GUESS_US",
    "SIM_POLICIES", "SIM_RELEASE_SPEEDUP", "SIM_START_PER_CPU_S", "SIM_START_S",
    "SIM_S_PER_CPU_SLICE", "SIM_S_PER_PHASE", "SIM_TIMEOUT_S",
    "Options", "SimHost", "alone_us", "auto_sets_table", "cells_table", "estimate_experiment_s",
    "estimate_sims_s", "experiment_argv", "fig_corun_idle", "fig_improvement", "fit_budget",
    "heatmaps", "load_experiment", "measured_bars", "measured_cells", "paper_table",
    "regroups_text", "render", "rows_table", "run", "run_experiment", "run_simulations",
    "sim_plan", "sim_policy_rows", "sim_summary", "simulated_bars", "sims_table", "static_sets",
    "trees", "validation_sentence", "validation_table",
]


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
    print(f"preheat lab cosched: expected duration ~{minutes(est_exp + est_sim)}: "
          + (f"measured experiment ~{minutes(est_exp)} ({measured_cells(o)} runs of "
             f"{o.seconds:g} s + ~{0.5 + o.cell_overhead_s:g} s each"
             + (", QEMU guests booted per run" if o.guests else "")
             + f", calibration ~{o.calibration_s:.0f} s)"
             if measuring else "no measurement" + (f" (rendering {o.from_file})" if o.from_file else ""))
          + f"; {n_sim} simulator runs ≤ {minutes(est_sim)} ("
            + ("release" if _release_build() else "debug") + " build)", flush=True)
    plan: list[dict] = []
    with cli.measuring("cosched", "cosched", int(measuring) + n_sim, state) as m:
        prog = m.prog
        if o.from_file is not None:
            try:
                exp = load_experiment(o.from_file)
                atomic.write_json(raw / "experiment.json", exp)
            except ToolError as e:
                failures.append(f"--from: {e}")
        elif measuring:
            try:
                exp = run_experiment(o, raw, prog)
            except (ToolError, OSError) as e:
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
                                      f"to stay within {minutes(budget)}")
            if scale < 1.0 and plan:
                was = {h.key: h.duration(o.quick) for h in o.sim_hosts}
                now = {r["host"]: (r["duration_s"], r["detect_s"]) for r in plan}
                state["notes"].append(
                    "simulated time shortened to keep the simulations within "
                    f"{minutes(budget)}: " + "; ".join(
                        f"{k}: {d:g} s, first regroup at {t:g} s (instead of {was[k]:g} s)"
                        for k, (d, t) in now.items())
                    + ("" if _release_build() else " — a debug build: a release build "
                       "simulates ~12× faster"))
            if plan and not missing:
                prog.log(f"simulations: {len(plan)} runs, ~{minutes(estimate_sims_s(plan))}")
            if missing:
                why = (f"this preheat build's `cosched simulate` does not accept "
                       f"{', '.join(missing)} (not built yet? rebuild the workspace)")
                failures.append(f"simulate: {why}")
                for rec in plan:
                    rec["status"], rec["reason"] = "not run", why
            else:
                run_simulations(plan, raw / "sim", prog, failures)
    code = m.code
    cli.not_run(plan)
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
