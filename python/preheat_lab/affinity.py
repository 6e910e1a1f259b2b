"""preheat lab affinity: cache affinity on this machine (Kazempour, Fedorova, Alagheband,
"Performance Implications of Cache Affinity on Multicore Processors", Euro-Par 2008), through
`preheat affinity` (the JSON contract: docs/affinity-json.md).

1. `preheat affinity topology --json --verify` gives the plan: this machine's caches, the base
   vectors sized from them, the Table 2 cells (retention × affinity × quantum, with the
   substitutions where this machine differs from the paper's) and whether Table 3 is feasible.
2. The run list: (a) Table 2: every workload × every cell; (b) Table 3: each workload once as
   the main benchmark with the next one (cyclic) interfering, affinity high and low, 2 ms;
   (c) win-back (beyond the paper), for the bundled kernels: Table 2 — the strongest low cell
   at 2 ms (interleaved BV_L2 at low retention where the CLI offers it, else BV_L1D) and its
   high cell (BV_0, same row and quantum), each also with `--preheat`; Table 3 — high and low
   affinity, each also with `--preheat`. The preheat also restores what the interfering
   workload evicted, so "fully recovered" is measured against the high-affinity case *with the
   same preheat*, not without it. Every condition runs once per round, rounds × --reps, in a
   seeded shuffled order per round (so drifts of the machine hit all conditions alike).
3. Each run is one `preheat affinity run --json`; a workload the CLI reports as not installed
   / unavailable is skipped (printed `SKIP ...` and in the report); a failing run is recorded
   with its reason and the rest goes on (exit code 1 at the end).

The plan (options, conditions, rounds, estimates): affinity_plan.py; statistics and tables:
affinity_analysis.py; figures: affinity_figures.py; the report: affinity_report.py; this module
runs the command and keeps the plan's names importable as `affinity.NAME`. Every number is
labeled measured (this machine, with its sample count) or "the paper's".

Outputs in --out DIR: raw/ (topology.json, plan.json, one CLI JSON per run, stderr of failed
runs), runs / table2 / table3 / winback / quanta / refill / paper (.csv, .parquet with pyarrow),
the figures (.png, .svg), summary.json, report.html. `--from DIR/raw` re-renders without
measuring.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import affinity_report, atomic, cli
from .affinity_plan import (
    AFFINITY_NAME,
    AFFINITY_ORDER,
    BUDGET_S,
    BUNDLED,
    DEFAULT_CPU_MS,
    DEFAULT_QUANTA,
    DEFAULT_REPS,
    MIN_CPU_MS,
    MIN_N,
    MIN_QUANTA,
    PROGRAM_CPU_S,
    QUICK_CPU_MS,
    QUICK_QUANTA,
    QUICK_REPS,
    QUICK_WORKLOADS,
    RUN_OVERHEAD_S,
    STANDS_FOR,
    T3_OVERHEAD_S,
    T3_WALL_PER_CPU_S,
    TABLE3_QUANTUM_MS,
    TOPOLOGY_S,
    UNAVAILABLE,
    WALL_PER_CPU_S,
    WHAT,
    WINBACK_QUANTUM_MS,
    WORKLOADS,
    Options,
    _t2_cond,
    _t3_cond,
    build_conditions,
    build_plan,
    cell_cpu_ms,
    estimate_s,
    fit_cpu_ms,
    high_cell_id,
    matrix_rows,
    run_estimate_s,
    substitutions,
    t2_cond_id,
    t3_cond_id,
    table2_cells,
    table3_pairs,
    topology_text,
    winback_cell,
)
from .cli import ToolError
from .progress import Progress, minutes, time_left

__all__ = [
    "AFFINITY_NAME", "AFFINITY_ORDER", "BUDGET_S", "BUNDLED", "DEFAULT_CPU_MS", "DEFAULT_QUANTA",
    "DEFAULT_REPS", "MIN_CPU_MS", "MIN_N", "MIN_QUANTA", "PROGRAM_CPU_S", "QUICK_CPU_MS",
    "QUICK_QUANTA", "QUICK_REPS", "QUICK_WORKLOADS", "RUN_OVERHEAD_S", "STANDS_FOR",
    "T3_OVERHEAD_S", "T3_WALL_PER_CPU_S", "TABLE3_QUANTUM_MS", "TOPOLOGY_S", "UNAVAILABLE", "VOID",
    "WALL_PER_CPU_S", "WHAT", "WINBACK_QUANTUM_MS", "WORKLOADS", "build_conditions",
    "build_plan", "cell_cpu_ms", "estimate_s", "fit_cpu_ms", "high_cell_id", "is_affinity_dir",
    "load_raw", "matrix_rows", "measure", "Options", "plan_json", "rerender", "run",
    "run_estimate_s", "run_one", "substitutions", "_t2_cond", "t2_cond_id", "t3_cond_id",
    "table2_cells", "table3_pairs", "topology", "topology_text", "winback_cell",
]

# ---------------------------------------------------------------------------------------------
# Talking to the CLI


#: What `preheat lab affinity` runs of the binary.
COMMANDS = (("affinity", "run"), ("affinity", "topology"))


def topology(o: Options, raw: Path, b: str) -> dict:
    """`preheat affinity topology --json --verify [--quanta ...]` → raw/topology.json."""
    cmd = [b, "affinity", "topology", "--json", "--verify"]
    if cli.supports(("affinity", "topology"), "--quanta"):
        cmd += ["--quanta", ",".join(map(str, o.quanta))]
    out = raw / "topology.json"
    data = cli.run_to_files(cmd, out, raw / "topology.stderr.txt", timeout=600,
                            expect=f"table2 (see {out})", tidy=True,
                            valid=lambda d: isinstance(d.get("table2"), dict)).check()
    data.setdefault("command", " ".join(cmd[1:]))
    return data


def _unavailable_workload(cond: dict, stderr: str) -> str:
    """Which workload the CLI reported missing: the interfering one when only it is named."""
    low = stderr.lower()
    w2 = cond.get("interfering")
    if w2 and w2 != cond["workload"] and w2 in low and cond["workload"] not in low:
        return w2
    return cond["workload"]


#: A run the CLI declared void (the controller did not interleave as asked): repeated once.
VOID = "not interleaved"


def run_one(rec: dict, cond: dict, b: str, raw: Path, cpu_ms: int) -> tuple[str | None, str]:
    """One `preheat affinity run --json`: raw/RUN_ID.json (+ .stderr.txt when it failed).
    Returns (unavailable workload or None, failure reason or '')."""
    rec["command"] = " ".join(["preheat", *cond["args"]])
    run = cli.run_to_files([b, *cond["args"]], raw / f"{rec['run_id']}.json",
                           raw / f"{rec['run_id']}.stderr.txt",
                           timeout=max(120.0, 20 * run_estimate_s(cond, cpu_ms)),
                           expect='a numeric "rate"', tidy=True,
                           valid=lambda d: isinstance(d.get("rate"), (int, float)))
    rec["seconds"] = round(run.seconds, 3)
    if run.rc > 0 and any(k in run.stderr.lower() for k in UNAVAILABLE):
        return _unavailable_workload(cond, run.stderr), run.reason
    if not run.ok:
        return None, run.reason
    rec["data"] = run.data
    return None, ""


def measure(plan: list[dict], conds: dict[str, dict], b: str, raw: Path, o: Options,
            state: dict, prog: Progress) -> None:
    """Run the plan round by round; skipped workloads and failures go to STATE."""
    unavailable: dict[str, str] = state.setdefault("unavailable", {})
    skipped_pairs = set()
    failures: list[str] = state["failures"]
    rounds = max((r["round"] for r in plan), default=0)
    t_all, done = time.monotonic(), 0
    for r in range(1, rounds + 1):
        recs = [x for x in plan if x["round"] == r]
        prog.task(f"round {r}/{rounds} ({len(recs)} runs)", len(recs))
        for i, rec in enumerate(recs, 1):
            cond = conds[rec["cond"]]
            gone = [w for w in (cond["workload"], cond.get("interfering")) if w in unavailable]
            if gone:
                rec["status"] = "skipped"
                rec["reason"] = f"{gone[0]} unavailable: {unavailable[gone[0]]}"
                pair = (cond["workload"], cond["interfering"])
                if cond["experiment"] == "table3" and pair not in skipped_pairs:
                    skipped_pairs.add(pair)
                    if cond["workload"] not in unavailable:
                        prog.log(f"SKIP table3 {cond['workload']}+{cond['interfering']}: "
                                 f"{gone[0]} unavailable")
                prog.update(i)
                continue
            missing, why = run_one(rec, cond, b, raw, o.cpu_ms)
            if not missing and VOID in why:
                # The instrument failed, not the workload (e.g. the hypervisor did not run the
                # controller's vCPU): the attempt is kept (its stderr and reason, in runs.csv and
                # the report) and the run is repeated once.
                rec["void_attempt"] = why
                err = raw / f"{rec['run_id']}.stderr.txt"
                if err.exists():
                    err.rename(raw / f"{rec['run_id']}.void.stderr.txt")
                prog.log(f"VOID {rec['run_id']}: {why}; repeating it once")
                missing, why = run_one(rec, cond, b, raw, o.cpu_ms)
            done += 1
            if missing:
                unavailable[missing] = why
                rec["status"], rec["reason"] = "skipped", f"{missing} unavailable: {why}"
                prog.log(f"SKIP {missing}: the CLI reports it unavailable ({why}); its runs are "
                         "skipped")
            elif why:
                rec["status"], rec["reason"] = "failed", why
                failures.append(f"{rec['run_id']}: {why}")
                prog.log(f"FAILED {rec['run_id']}: {why}")
            else:
                rec["status"] = "ok"
            prog.update(i)
        atomic.write_json(raw / "plan.json", plan_json(plan, conds, o, state))
        left = sum(x["status"] == "pending" for x in plan)
        prog.advance(f"{sum(x['status'] == 'ok' for x in recs)}/{len(recs)} ok"
                     + time_left(t_all, done, left))


def plan_json(plan: Sequence[dict], conds: dict[str, dict], o: Options, state: dict) -> dict:
    return {"kind": "affinity", "options": o.to_dict(), "state": state.get("state"),
            "conditions": list(conds.values()),
            "runs": [{k: v for k, v in r.items() if k != "data"} for r in plan],
            "unavailable": state.get("unavailable", {})}


# ---------------------------------------------------------------------------------------------
# Re-rendering from raw/


def _cond_from_id(cid: str, topo: dict, cpu_ms: int) -> dict | None:
    """A condition rebuilt from its id (for a raw/ without plan.json)."""
    pre = cid.endswith("-preheat")
    base = cid[: -len("-preheat")] if pre else cid
    parts = base.split("-")
    if parts[0] == "t2" and len(parts) == 3:
        cell = next((c for c in ((topo.get("table2") or {}).get("cells") or [])
                     if c.get("id") == parts[2]), None)
        if cell:
            return _t2_cond(parts[1], cell, pre, cpu_ms, "winback" if pre else "table2")
    if parts[0] == "t3" and len(parts) == 4 and "+" in parts[1]:
        w, w2 = parts[1].split("+", 1)
        return _t3_cond(w, w2, parts[2], pre, cpu_ms, "winback" if pre else "table3")
    return None


def load_raw(rdir: Path) -> tuple[dict, dict[str, dict], list[dict], dict]:
    """(topology, conditions by id, plan with each ok run's data, the saved state) from a
    raw/ directory; without plan.json the runs are rebuilt from the run files' names."""
    rdir = Path(rdir)
    topo = cli.read_json(rdir / "topology.json") or {}
    pj = cli.read_json(rdir / "plan.json") or {}
    conds = {c["cond"]: c for c in pj.get("conditions") or [] if isinstance(c, dict)}
    plan = [dict(r) for r in pj.get("runs") or []]
    if not plan:
        cpu_ms = int((pj.get("options") or {}).get("cpu_ms") or DEFAULT_CPU_MS)
        for f in sorted(rdir.glob("r*-*-*.json")):
            rid = f.stem
            head, order, cid = rid.split("-", 2)
            cond = conds.get(cid) or _cond_from_id(cid, topo, cpu_ms)
            if cond is None:
                continue
            conds[cid] = cond
            plan.append({"run_id": rid, "round": int(head[1:]), "order": int(order),
                         "cond": cid, "status": "ok"})
    for rec in plan:
        if rec.get("status") == "ok":
            data = cli.read_json(rdir / f"{rec['run_id']}.json")
            if isinstance(data, dict) and isinstance(data.get("rate"), (int, float)):
                rec["data"] = data
            else:
                rec["status"], rec["reason"] = "failed", "raw JSON missing or without a rate"
    return topo, conds, plan, pj


def rerender(rdir: Path, out: Path) -> int:
    """`--from DIR/raw`: tables, figures and the report again, without measuring."""
    rdir, out = Path(rdir), Path(out)
    topo, conds, plan, pj = load_raw(rdir)
    if (out / "raw").resolve() != rdir.resolve():
        shutil.copytree(rdir, out / "raw", dirs_exist_ok=True)
    opts = pj.get("options") or {}
    state = {"kind": "affinity", "state": pj.get("state") or "complete", "options": opts,
             "failures": [f"{r['run_id']}: {r.get('reason')}" for r in plan
                          if r.get("status") == "failed"],
             "notes": [f"re-rendered from {rdir} (no new measurement)"],
             "unavailable": pj.get("unavailable") or {}, "rendered_from": str(rdir)}
    affinity_report.render(out, topo, conds, plan, state)
    print(f"wrote {out / 'report.html'}")
    return 0


def is_affinity_dir(out: Path) -> bool:
    s = cli.read_json(Path(out) / "summary.json")
    return isinstance(s, dict) and s.get("kind") == "affinity"


# ---------------------------------------------------------------------------------------------
# The command


def run(out: Path | None, o: Options) -> int:
    if o.from_dir is not None:
        return rerender(o.from_dir, Path(out) if out else o.from_dir.parent)
    if out is None:
        raise ValueError("affinity: an output directory is required (unless --from DIR/raw)")
    out = Path(out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    state: dict = {"kind": "affinity", "state": "running", "options": o.to_dict(),
                   "failures": [], "notes": [], "unavailable": {}}
    try:
        b = cli.require(*COMMANDS)
        print("preheat lab affinity: asking the CLI for the plan (preheat affinity topology "
              "--json --verify) ...", flush=True)
        topo = topology(o, raw, b)
    except (ToolError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(topology_text(topo, o.quanta), flush=True)
    notes = state["notes"]
    conds_list = build_conditions(topo, o, notes)
    fitted = fit_cpu_ms(conds_list, o)
    if fitted != o.cpu_ms:
        notes.append(f"--cpu-ms {fitted} instead of {o.cpu_ms} to stay within "
                     f"{minutes(BUDGET_S)} (give --cpu-ms to override)")
        o.cpu_ms = fitted
        conds_list = build_conditions(topo, o, [])
    state["options"] = o.to_dict()
    conds = {c["cond"]: c for c in conds_list}
    plan = build_plan(conds_list, o.reps, o.seed)
    est = estimate_s(conds_list, o.reps, o.cpu_ms)
    n_b = sum(c["workload"] in BUNDLED for c in conds_list) * o.reps
    print(f"plan: {len(conds_list)} conditions × {o.reps} rounds = {len(plan)} runs "
          f"({n_b} of bundled kernels at --cpu-ms {o.cpu_ms}, "
          f"~{o.cpu_ms / 1000 * WALL_PER_CPU_S + RUN_OVERHEAD_S:.2f} s "
          f"each in Table 2; {len(plan) - n_b} of programs, ~"
          f"{RUN_OVERHEAD_S + WALL_PER_CPU_S * PROGRAM_CPU_S:.1f} s each); expected duration "
          f"~{minutes(est)}", flush=True)
    if est > BUDGET_S:
        notes.append(f"the estimate ~{minutes(est)} exceeds {minutes(BUDGET_S)}: fewer "
                     "--workloads, --quanta or --reps (or --quick) would shorten it")
    for n in notes:
        print(f"note: {n}")
    state["estimate_s"] = round(est, 1)
    atomic.write_json(raw / "plan.json", plan_json(plan, conds, o, state))
    t0 = time.monotonic()
    with cli.measuring("affinity", "affinity rounds", o.reps, state) as m:
        measure(plan, conds, b, raw, o, state, m.prog)
    code = m.code
    cli.not_run(plan)
    state["seconds"] = round(time.monotonic() - t0, 1)
    atomic.write_json(raw / "plan.json", plan_json(plan, conds, o, state))
    for w, why in state["unavailable"].items():
        n = sum(r["status"] == "skipped" and r.get("reason", "").startswith(f"{w} ") for r in plan)
        print(f"SKIP {w}: {why} ({n} runs skipped)")
    affinity_report.render(out, topo, conds, plan, state)
    print(f"wrote {out / 'report.html'} (took {minutes(state['seconds'])}, estimated "
          f"{minutes(est)})")
    failed = [r for r in plan if r["status"] == "failed"]
    if failed:
        print(f"failed: {len(failed)} run(s); the first: {failed[0]['run_id']}: "
              f"{failed[0].get('reason')}", file=sys.stderr)
    if code == 0 and (failed or state["failures"]):
        code = 1
    return code
