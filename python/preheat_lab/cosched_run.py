"""preheat lab cosched: running the CLI — `preheat cosched experiment` (the measured part) and
the simulator plan's `preheat cosched simulate` runs, one at a time."""

from __future__ import annotations

import time
from pathlib import Path

from . import cli
from .cosched_plan import (
    POLICIES,
    SIM_TIMEOUT_S,
    Options,
    estimate_experiment_s,
    measured_cells,
)
from .cosched_tables import load_experiment
from .progress import Progress, minutes, time_left
from .sweep_grid import cosim_argv


def experiment_argv(o: Options) -> list[str]:
    return [cli.preheat_bin(), "cosched", "experiment", "--json",
            "--kernels", ",".join(o.kernels), "--scenarios", ",".join(o.scenarios),
            "--policies", ",".join(POLICIES), "--reps", str(o.reps), "--seconds", f"{o.seconds:g}",
            "--slice-ms", f"{o.slice_ms:g}", "--regroup-s", f"{o.regroup_s:g}",
            "--seed", str(o.seed), "--calibration-runs", str(o.calibration_runs)] + (
                ["--guests"] if o.guests else [])


def run_experiment(o: Options, raw: Path, prog: Progress) -> dict:
    """`preheat cosched experiment --json` (stdout → raw/experiment.json); progress = elapsed
    time against the estimate."""
    cli.require(("cosched", "experiment"))
    est = estimate_experiment_s(o)
    prog.task(f"measured experiment ({measured_cells(o)} runs, ~{minutes(est)})", int(est))
    t0 = time.monotonic()
    run = cli.run_to_files(experiment_argv(o), raw / "experiment.json",
                           raw / "experiment.stderr.txt", timeout=2 * est + 300,
                           on_tick=lambda: prog.update(int(time.monotonic() - t0)))
    run.check()
    data = load_experiment(raw / "experiment.json")
    data.setdefault("regroup_s", o.regroup_s)
    prog.advance(f"{run.seconds:.0f} s (estimated {est:.0f} s)")
    return data


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
        cmd = cosim_argv(binary, rec["args"])
        rec["command"] = " ".join(cmd)
        run = cli.run_to_files(cmd, raw / f"{rec['id']}.json", raw / f"{rec['id']}.stderr.txt",
                               timeout=SIM_TIMEOUT_S, expect='"policies"',
                               valid=lambda d: d.get("policies"))
        rec["seconds"] = round(run.seconds, 3)
        if run.ok:
            rec["status"], rec["data"] = "ok", run.data
        else:
            rec["status"], rec["reason"] = "failed", run.reason
            reasons.setdefault(run.reason, []).append(rec["id"])
        prog.advance(rec["status"] + (f" ({run.reason})" if run.reason else "")
                     + time_left(t_all, i + 1, len(plan) - i - 1))
    for why, ids in reasons.items():
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        failures.append(f"simulate: {len(ids)} run(s) failed ({', '.join(ids[:3])}{more}): {why}")
