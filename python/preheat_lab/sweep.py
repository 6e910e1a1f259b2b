"""Parameter sweeps: one CLI run at every point of a Cartesian product of parameters.

Targets (`--target`): `demo` (default) runs `preheat demo` on one server (measured); `cosim`
runs `preheat cosched simulate` (the partial-coscheduling host simulator: every number it
gives is SIMULATED). Both go through the same grid, executors and DIR/… layout.

`demo` parameters (`--param NAME=V1,V2,...`, repeatable):

* `lead_us` (`--lead-us`): announcement lead time, µs;
* `keep`, `samples` (`--keep`, `--samples`): the k-of-n working-set filter;
* `gap_merge` (`--gap-merge`): merge runs separated by at most this many unused lines;
* `idle_ms` (`--idle-ms`): idle gap before a cold-idle request;
* `strategies` (`--strategies`): the preheat strategies measured at the point. Values are
  separated by `,` — each value is then ONE strategy (`strategies=wake,lines,wake+lines` gives
  three points) — or by `;` when a value itself lists several (`strategies=wake,lines;all`);
* `sweep_mib`, `post_gap_us` (`--sweep-mib`, `--post-gap-us`): the eviction sweep.

`cosim` parameters (each maps to one `preheat cosched simulate` flag): `slice_ms`
(`--slice-ms`), `switch_us` (`--switch-us`), `phase_us` (`--phase-us`), `phase_cv`
(`--phase-cv`), `detect_s` (`--detect-s`), `duration_s` (`--duration-s`), `cpus` (`--cpus`),
`vm` (VM sizes joined by `+`: `vm=8+4,64+32` gives two points, `--vm 8 --vm 4` and
`--vm 64 --vm 32`), `scenario` (`--scenario`), `seed` (`--seed`), `barrier_us`, `job_phases`,
`auto_overhead`, `cfs_slice_ms` (the same-named flags). A point without `vm` simulates
the paper's host (VMs 8+4); without `cpus`, the host has as many CPUs as the largest VM. Every
point simulates the simulator's default policies; the results (DIR/sweep-cosim/) are one row per
point and policy. The grouping threshold `t` of partial-auto is not a simulator parameter (the
simulator models detection as the delay `detect_s`): `t` exists only in the measured
`preheat cosched experiment --t`, and sweeping it is out of scope here.

Executors: `local` runs points with a process pool (default 1 job: concurrent measurements on
one machine interfere with each other); `ray` runs each point as a Ray task that requests all
CPUs of the node it is pinned to, at most one task per node at a time, so measurements never
overlap on a node. Simulations (`cosim`) use the same executors and the same rules (they
interfere with no measurement, so `--jobs 2` is fine locally when the CPUs are free).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from . import atomic, cli, deps, labreport, proc, stats, table1
from .cosched_tables import sim_policy_rows
from .labreport import cosim_section
from .progress import Progress
from .report import Report
from .sweep_grid import (
    COSIM_DEFAULT_VMS,
    COSIM_DIR,
    COSIM_PARAMS,
    PARAMS,
    TARGET_PARAMS,
    TARGETS,
    ParamTable,
    cosim_args,
    cosim_argv,
    grid,
    parse_param,
    vm_sizes,
)

__all__ = [
    "COSIM_DEFAULT_VMS", "COSIM_DIR", "COSIM_PARAMS", "COSIM_TIMEOUT_S", "PARAMS",
    "TARGET_PARAMS", "TARGETS", "LocalExecutor", "ParamTable", "RayExecutor", "analyze_points",
    "cosim_args", "cosim_argv", "cosim_results", "cosim_section", "grid", "parse_param",
    "plots", "plots_cosim", "point_options", "reanalyze", "run", "run_cosim", "run_point_task",
    "vm_sizes",
]

def point_options(base: table1.DemoOptions, point: dict) -> table1.DemoOptions:
    d = asdict(base)
    d.update(point)
    return table1.DemoOptions(**d)


# ---------------------------------------------------------------------------------------------
# One point (runs in a worker process or a Ray task)


def run_point_task(spec: dict) -> dict:
    """Run one point (`preheat demo`, or `preheat cosched simulate` for target cosim) in a
    temporary directory on this host and return its outputs (so a remote node's files come back
    to the driver)."""
    binary = spec.get("bin")
    if not binary or not os.path.exists(binary):
        binary = cli.preheat_bin()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="preheat-sweep-") as tmp:
        t = Path(tmp)
        if spec.get("target", "demo") == "cosim":
            cmd, stdout = cosim_argv(binary, spec["args"]), t / "p.json"
        else:
            cmd = table1.demo_argv(binary, spec["server"], spec["args"], t / "p.json",
                                   t / "p.jsonl" if spec.get("records") else None)
            stdout = t / "stdout.txt"
        res = {"id": spec["id"], "host": socket.gethostname(), "command": cmd}
        try:
            rc = proc.run_child(cmd, stdout, t / "stderr.txt", timeout=spec["timeout"])
        except proc.ChildTimeout as e:
            rc, res["error"] = -1, str(e)
        res["rc"] = rc
        res["seconds"] = time.monotonic() - t0
        for key, name in (("json", "p.json"), ("records", "p.jsonl"), ("stderr", "stderr.txt")):
            p = t / name
            res[key] = p.read_text(errors="replace") if p.exists() else None
    return res


# ---------------------------------------------------------------------------------------------
# Executors


class LocalExecutor:
    def __init__(self, jobs: int):
        from concurrent.futures import ProcessPoolExecutor

        self.jobs = jobs
        self.ex = ProcessPoolExecutor(max_workers=jobs, initializer=proc.worker_signal_setup)
        self.futs: dict[Any, dict] = {}

    def run(self, specs: list[dict]) -> Iterator[dict]:
        """Yield results as points finish."""
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = list(specs)
        while pending or self.futs:
            while pending and len(self.futs) < self.jobs:
                s = pending.pop(0)
                self.futs[self.ex.submit(run_point_task, s)] = s
            done, _ = wait(list(self.futs), timeout=0.5, return_when=FIRST_COMPLETED)
            for f in done:
                s = self.futs.pop(f)
                try:
                    yield f.result()
                except Exception as e:  # the worker failed outside the demo
                    yield {"id": s["id"], "rc": -1, "error": f"worker failed: {e!r}"}

    def running_ids(self) -> list[str]:
        return [s["id"] for f, s in self.futs.items() if not f.done() and f.running()]

    def stop(self) -> None:
        """Interrupted: cancel queued points, SIGTERM the workers (each terminates its demo's
        process group before exiting)."""
        workers = list((getattr(self.ex, "_processes", None) or {}).values())
        for f in self.futs:
            f.cancel()
        for p in workers:
            try:
                p.terminate()
            except Exception:
                pass
        for p in workers:
            p.join(20)
        try:
            self.ex.shutdown(wait=False, cancel_futures=True)
        except Exception:
            pass

    def close(self) -> None:
        self.ex.shutdown(wait=True)


def _python_root() -> str:
    return str(Path(__file__).resolve().parents[1])


class RayExecutor:
    """One task per node at a time, pinned to the node, requesting all of its CPUs."""

    def __init__(self, address: str | None, jobs: int | None):
        try:
            import ray
        except ImportError:
            deps.exit_missing(["ray"], "sweep --executor ray", extras=("ray",))

        env = {"PYTHONPATH": os.pathsep.join([_python_root()] + ([os.environ["PYTHONPATH"]]
                                                                   if os.environ.get("PYTHONPATH") else []))}
        if os.environ.get("PREHEAT_BIN"):
            env["PREHEAT_BIN"] = os.environ["PREHEAT_BIN"]
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                      logging_level="ERROR", runtime_env={"env_vars": env})
            if address:
                ray.init(address=address, **kw)
            else:
                ray.init(**kw)
        self.nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
        if not self.nodes:
            raise SystemExit("ray: no alive node with CPUs")
        self.jobs = min(jobs or len(self.nodes), len(self.nodes))
        self.remote = ray.remote(run_point_task)
        self.inflight: dict[Any, tuple[dict, dict]] = {}

    def _submit(self, node: dict, spec: dict) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ref = self.remote.options(
            num_cpus=node["Resources"]["CPU"],
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False),
        ).remote(spec)
        self.inflight[ref] = (node, spec)

    def run(self, specs: list[dict]) -> Iterator[dict]:
        ray = self.ray
        pending = list(specs)
        free = list(self.nodes[: self.jobs])
        while pending or self.inflight:
            while pending and free:
                self._submit(free.pop(0), pending.pop(0))
            try:
                done, _ = ray.wait(list(self.inflight), num_returns=1, timeout=0.5)
            except SystemError as e:  # a signal handler's exception, wrapped by Ray's C code
                if isinstance(e.__cause__, BaseException) and isinstance(e.__cause__, KeyboardInterrupt):
                    raise e.__cause__ from None
                raise
            for ref in done:
                node, spec = self.inflight.pop(ref)
                free.append(node)
                try:
                    yield ray.get(ref)
                except Exception as e:
                    yield {"id": spec["id"], "rc": -1, "error": f"ray task failed: {e!r}"}

    def running_ids(self) -> list[str]:
        return [spec["id"] for _, spec in self.inflight.values()]

    def stop(self) -> None:
        for ref in list(self.inflight):
            try:
                self.ray.cancel(ref, force=False)  # KeyboardInterrupt in the task: it stops its demo
            except Exception:
                pass
        if self.inflight:
            try:
                self.ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=20)
            except Exception:
                pass
        self.close()

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()


# ---------------------------------------------------------------------------------------------
# The sweep


def analyze_points(sdir: Path, points: list[dict], topo: dict, boot: int) -> pd.DataFrame:
    rows = []
    raw = sdir / "raw"
    for pt in points:
        if pt.get("status") != "ok":
            continue
        meta, df = table1.load_server(raw, pt["id"])
        if df.empty:
            continue
        t = table1.analyze_server(pt["id"], df, meta, topo, boot)["table"]
        t = t.drop(columns=["server", "server_name"])
        for k, v in pt["params"].items():
            t.insert(0, k, v)
        t.insert(0, "point", pt["id"])
        rows.append(t)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _is_num(vals: Iterable[object]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def plots(sdir: Path, res: pd.DataFrame, params: Sequence[tuple[str, list]], server: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    if res.empty:
        return written
    names = [n for n, _ in params]
    for name, values in params:
        others = [n for n in names if n != name]
        numeric = _is_num(values)
        xpos = {v: (v if numeric else i) for i, v in enumerate(values)}
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 6))
        groups = res.groupby(others, dropna=False) if others else [((), res)]
        markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
        dashes = ["-", "--", ":", "-."]
        for gi, (gkey, g) in enumerate(groups):
            gkey = gkey if isinstance(gkey, tuple) else (gkey,)
            suffix = (" [" + ", ".join(f"{o}={v}" for o, v in zip(others, gkey)) + "]") if others else ""
            for mode, gm in g.groupby("mode", sort=False):
                gm = gm.sort_values(name, key=lambda c: c.map(xpos))
                x = [xpos[v] for v in gm[name]]
                color, _ = table1.mode_style(mode)
                mk, ls = markers[gi % len(markers)], dashes[gi % len(dashes)]
                yerr = [(gm["p50"] - gm["p50_lo"]).clip(lower=0), (gm["p50_hi"] - gm["p50"]).clip(lower=0)]
                a1.errorbar(x, gm["p50"], yerr=yerr, marker=mk, capsize=3, color=color,
                            linestyle=ls, label=f"{mode}{suffix}")
                if mode.startswith("preheat") or mode == "control":
                    yerr2 = [(gm["removed_p50"] - gm["removed_p50_lo"]).clip(lower=0),
                             (gm["removed_p50_hi"] - gm["removed_p50"]).clip(lower=0)]
                    a2.errorbar(x, 100 * gm["removed_p50"], yerr=[100 * yerr2[0], 100 * yerr2[1]],
                                marker=mk, capsize=3, color=color, linestyle=ls,
                                label=f"{mode}{suffix}")
        for ax in (a1, a2):
            ax.set_xlabel(name)
            if not numeric:
                ax.set_xticks(list(range(len(values))))
                ax.set_xticklabels([str(v) for v in values], rotation=20)
            elif name in ("lead_us", "idle_ms") and min(values) > 0 and max(values) / min(values) >= 10:
                from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

                ax.set_xscale("log")
                ax.xaxis.set_major_locator(FixedLocator(sorted(values)))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, alpha=0.3)
        a1.set_ylabel("median response time, µs (95% CI)")
        a1.set_yscale("log")
        a1.set_title(f"{server}: median latency vs {name} (measured)", fontsize=10)
        a2.set_ylabel("share of the cold p50 overhead removed, % (95% CI)")
        a2.axhline(0, color="#999", lw=0.8)
        a2.axhline(100, color="#999", lw=0.8, ls=":")
        a2.set_title(f"{server}: overhead removed vs {name}", fontsize=10)
        from matplotlib.ticker import FuncFormatter

        a1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a1.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "25" else ""))
        handles, labels = a1.get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(4, max(1, len(labels))),
                   frameon=False)
        nrows = math.ceil(len(labels) / min(4, max(1, len(labels))))
        fig.tight_layout(rect=(0, min(0.45, 0.05 + 0.035 * nrows), 1, 1))
        for ext in ("png", "svg"):
            written.append(atomic.savefig(fig, sdir / f"sweep-{name}.{ext}", dpi=110))
        plt.close(fig)
    return written


def run(out: Path, params: Sequence[tuple[str, list]], server: str, base: table1.DemoOptions,
        executor: str = "local", jobs: int | None = None, ray_address: str | None = None,
        boot: int = stats.DEFAULT_BOOT, report: bool = True) -> int:
    out = Path(out)
    sdir = out / "sweep"
    raw = sdir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    pts = grid(params)
    opts_list = [point_options(base, p) for p in pts]
    missing = sorted({f for o in opts_list for f in table1.check_flags(o)})
    if missing:
        raise SystemExit(f"this preheat CLI's demo does not accept {', '.join(missing)}: rebuild it")
    records = cli.supports("demo", "--records")
    points = []
    specs = []
    for i, (p, o) in enumerate(zip(pts, opts_list)):
        pid = f"p{i + 1:03d}"
        points.append({"id": pid, "params": p, "status": "pending", "reason": ""})
        specs.append({"id": pid, "server": server, "args": o.args(), "timeout": o.timeout(),
                      "records": records, "bin": cli.preheat_bin()})
    if executor == "local":
        jobs = jobs or 1
        if jobs > 1:
            print(f"WARNING: {jobs} points run at the same time on this machine: concurrent "
                  "measurements interfere (CPU, caches, memory bandwidth); use --jobs 1 for "
                  "numbers you report", file=sys.stderr)
    topo = cli.topology()
    if not (out / "topology.json").exists():
        atomic.write_json(out / "topology.json", topo)
    state = {"kind": "sweep", "state": "running", "server": server, "executor": executor,
             "jobs": jobs, "ray_address": ray_address,
             "params": {n: v for n, v in params}, "base": asdict(base), "points": points}
    code = _execute(sdir, state, specs, executor, jobs, ray_address)
    _tabulate(sdir, state, topo, boot, empty_csv=True)
    if report:
        labreport.publish(out)
    return code


def _execute(sdir: Path, state: dict, specs: list[dict], executor: str, jobs: int | None,
             ray_address: str | None) -> int:
    """Run SPECS (one per point of STATE["points"], same ids) on the executor, keeping
    sdir/sweep.json and sdir/raw/ID.{json,jsonl,stderr.txt} current; Ctrl-C/SIGTERM stop the
    running points and mark the state partial. Returns the exit code (0, 1: a point failed,
    130/143: interrupted); points never started end as "not run"."""
    raw = sdir / "raw"
    points = state["points"]

    def save() -> None:
        atomic.write_json(sdir / "sweep.json", state)

    save()
    code = 0
    by_id = {p["id"]: p for p in points}
    proc.reset_interrupt_state()
    # Before our signal handlers: ray.init installs its own SIGTERM handler in the driver.
    ex = LocalExecutor(jobs or 1) if executor == "local" else RayExecutor(ray_address, jobs)
    state["jobs"] = ex.jobs
    with proc.interruptible(), Progress(f"sweep ({executor})", len(points)) as prog:
        try:
            prog.task(f"{len(points)} points ({ex.jobs} at a time)", len(points))
            for res in ex.run(specs):
                pt = by_id[res["id"]]
                pt["host"], pt["seconds"] = res.get("host"), res.get("seconds")
                pid = res["id"]
                if res.get("stderr") is not None:
                    atomic.write_text(raw / f"{pid}.stderr.txt", res["stderr"])
                if res.get("records"):
                    atomic.write_text(raw / f"{pid}.jsonl", res["records"])
                if res.get("rc") == 0 and res.get("json"):
                    atomic.write_text(raw / f"{pid}.json", res["json"])
                    pt["status"] = "ok"
                else:
                    pt["status"] = "failed"
                    pt["reason"] = res.get("error") or table1.failure_reason(res.get("stderr") or "", res.get("rc"))
                    code = 1
                save()
                prog.update(sum(1 for p in points if p["status"] != "pending"))
                prog.advance(f"{pid} {pt['params']}: {pt['status']}"
                             + (f" ({pt['reason']})" if pt["reason"] else ""))
            ex.close()
            state["state"] = "complete"
        except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
            code = proc.mark_interrupted(state)
            prog.log(f"sweep: interrupted by {proc.interrupted_by()}: stopping the running points")
            if ex is not None:
                for sid in ex.running_ids():
                    by_id[sid]["status"] = "interrupted"
                    by_id[sid]["reason"] = (f"interrupted by {proc.interrupted_by()} (a point's "
                                            "samples are kept only when it completes)")
                ex.stop()
    for p in points:
        if p["status"] == "pending":
            p["status"] = "not run"
    return code


def _tabulate(sdir: Path, state: dict, topo: dict, boot: int, empty_csv: bool) -> None:
    """sweep.csv/.parquet and the plots from STATE's points and sweep/raw, then sweep.json with
    the figures and the row count (EMPTY_CSV: write sweep.csv even without a row)."""
    params = list((state.get("params") or {}).items())
    res = analyze_points(sdir, state.get("points", []), topo, boot)
    if len(res):
        atomic.write_table(sdir / "sweep", res)
    elif empty_csv:
        atomic.write_csv(sdir / "sweep.csv", res)
    state["figures"] = [p.name for p in plots(sdir, res, params, state.get("server", "?"))]
    state["rows"] = int(len(res))
    atomic.write_json(sdir / "sweep.json", state)


def reanalyze(out: Path, boot: int = stats.DEFAULT_BOOT) -> bool:
    """Rebuild DIR/sweep's table and plots from sweep.json and sweep/raw (for `report`)."""
    sdir = Path(out) / "sweep"
    state = cli.read_json(sdir / "sweep.json")
    if state is None:
        return False
    _tabulate(sdir, state, cli.read_json(Path(out) / "topology.json") or {}, boot,
              empty_csv=False)
    return True


# ---------------------------------------------------------------------------------------------
# Target cosim: `preheat cosched simulate` (SIMULATED)

COSIM_TIMEOUT_S = 600.0


def run_cosim(out: Path, params: Sequence[tuple[str, list]], executor: str = "local",
              jobs: int | None = None, ray_address: str | None = None,
              report: bool = True) -> int:
    """`preheat cosched simulate` at every point of the grid (same executors as the demo
    sweep); DIR/sweep-cosim/: sweep.json, raw/ID.json, sweep.csv/.parquet (one row per point
    and policy), sweep-NAME.png/svg; DIR/report.html."""
    out = Path(out)
    sdir = out / COSIM_DIR
    (sdir / "raw").mkdir(parents=True, exist_ok=True)
    points, specs = [], []
    for i, p in enumerate(grid(params)):
        pid = f"p{i + 1:03d}"
        points.append({"id": pid, "params": p, "status": "pending", "reason": ""})
        specs.append({"id": pid, "target": "cosim", "args": cosim_args(p),
                      "timeout": COSIM_TIMEOUT_S, "bin": cli.preheat_bin()})
    if executor == "local":
        jobs = jobs or 1
    state = {"kind": "sweep", "target": "cosim", "label": "simulated", "state": "running",
             "executor": executor, "jobs": jobs, "ray_address": ray_address,
             "params": dict(params), "points": points}
    code = _execute(sdir, state, specs, executor, jobs, ray_address)
    _tabulate_cosim(sdir, state)
    if report:
        rep = Report("preheat lab sweep: the partial-coscheduling simulator (SIMULATED)")
        cosim_section(rep, out)
        print(f"wrote {rep.write(out / 'report.html')}")
    return code


def cosim_results(sdir: Path, points: list[dict]) -> pd.DataFrame:
    """One row per point and policy from sdir/raw/ID.json (what `preheat cosched simulate
    --json` printed)."""
    rows = []
    for pt in points:
        if pt.get("status") != "ok":
            continue
        data = cli.read_json(sdir / "raw" / f"{pt['id']}.json")
        for r in sim_policy_rows(data or {}):
            rows.append({"point": pt["id"], **pt["params"], **r})
    return pd.DataFrame(rows)


def plots_cosim(sdir: Path, res: pd.DataFrame, params: Sequence[tuple[str, list]]) -> list[Path]:
    """Per swept parameter: the simulated improvement over full per policy (solid) and the
    setup's predicted improvement (dotted), one line per combination of the other parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    if res.empty or "improvement_over_full" not in res:
        return written
    names = [n for n, _ in params]
    colors = {"partial-static": "#1f77b4", "partial-auto": "#ff7f0e", "none": "#7f7f7f",
              "full": "#2ca02c"}
    for name, values in params:
        others = [n for n in names if n != name]
        numeric = _is_num(values)
        xpos = {v: (v if numeric else i) for i, v in enumerate(values)}
        fig, ax = plt.subplots(figsize=(9, 5.5))
        groups = res.groupby(others, dropna=False) if others else [((), res)]
        markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
        for gi, (gkey, g) in enumerate(groups):
            gkey = gkey if isinstance(gkey, tuple) else (gkey,)
            suffix = (" [" + ", ".join(f"{o}={v}" for o, v in zip(others, gkey)) + "]") if others else ""
            for pol, gp in g.groupby("policy", sort=False):
                if pol == "full":
                    continue  # the baseline: 0 by definition
                gp = gp.sort_values(name, key=lambda c: c.map(xpos))
                x = [xpos[v] for v in gp[name]]
                c = colors.get(pol)
                ax.plot(x, 100 * gp["improvement_over_full"], marker=markers[gi % len(markers)],
                        ls=("-", "--", "-.")[gi % 3], color=c, label=f"{pol}{suffix} (simulated)")
                if "predicted_improvement" in gp and gp["predicted_improvement"].notna().any():
                    ax.plot(x, 100 * gp["predicted_improvement"], ls=":", color=c, lw=1,
                            label=f"{pol}{suffix} (predicted, modeled)")
        ax.axhline(0, color="#999", lw=0.8)
        ax.set_xlabel(name)
        if not numeric:
            ax.set_xticks(list(range(len(values))))
            ax.set_xticklabels([str(v) for v in values], rotation=20)
        ax.set_ylabel("improvement over full coscheduling, %")
        ax.grid(True, alpha=0.3)
        ax.set_title(f"SIMULATED: improvement over full vs {name}", fontsize=10)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        for ext in ("png", "svg"):
            written.append(atomic.savefig(fig, sdir / f"sweep-{name}.{ext}", dpi=110))
        plt.close(fig)
    return written


def _tabulate_cosim(sdir: Path, state: dict) -> None:
    res = cosim_results(sdir, state.get("points", []))
    if len(res):
        atomic.write_table(sdir / "sweep", res)
    else:
        atomic.write_csv(sdir / "sweep.csv", res)
    params = list((state.get("params") or {}).items())
    state["figures"] = [p.name for p in plots_cosim(sdir, res, params)]
    state["rows"] = len(res)
    atomic.write_json(sdir / "sweep.json", state)
