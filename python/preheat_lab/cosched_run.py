"""preheat lab cosched: running the CLI — `preheat cosched experiment` (the measured part) and
the simulator plan's `preheat cosched simulate` runs, one at a time."""

from __future__ import annotations

import time
from pathlib import Path

from . import cli, proc
from .cli import ToolError
from .cosched_plan import (
    POLICIES,
    SIM_TIMEOUT_S,
    Options,
    _minutes,
    estimate_experiment_s,
    measured_cells,
)
from .cosched_tables import load_experiment
from .progress import Progress
from .sweep_grid import cosim_argv


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
