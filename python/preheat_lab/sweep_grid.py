"""A sweep's parameters and grid: the names each target (`demo`, `cosim`) accepts with their
CLI flags and value types, parsing `--param NAME=V1,V2,...`, the Cartesian product, and the
`preheat cosched simulate` command line of a point (`sweep` runs them; `cosched_plan` and
`cosched_run` build the simulator's runs with them).

Standard library only: the command line's choices come from here, and `--help` runs without
the lab's third-party packages."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

#: A target's parameters: name → (CLI flag, value type).
ParamTable = dict[str, tuple[str, Callable[[str], Any]]]

PARAMS: ParamTable = {
    "lead_us": ("--lead-us", float),
    "keep": ("--keep", int),
    "samples": ("--samples", int),
    "gap_merge": ("--gap-merge", int),
    "idle_ms": ("--idle-ms", float),
    "strategies": ("--strategies", str),
    "sweep_mib": ("--sweep-mib", int),
    "post_gap_us": ("--post-gap-us", float),
}


def vm_sizes(v: str) -> str:
    """`8+4` (VM sizes, vCPUs): checked and normalised."""
    parts = [x.strip() for x in str(v).split("+")]
    if not parts or not all(x.isdigit() and int(x) > 0 for x in parts):
        raise ValueError(f"{v!r}: expected VM sizes joined by + (8+4)")
    return "+".join(str(int(x)) for x in parts)


#: `preheat cosched simulate` flags (the `cosim` target).
COSIM_PARAMS: ParamTable = {
    "slice_ms": ("--slice-ms", float),
    "switch_us": ("--switch-us", float),
    "phase_us": ("--phase-us", float),
    "phase_cv": ("--phase-cv", float),
    "detect_s": ("--detect-s", float),
    "duration_s": ("--duration-s", float),
    "cpus": ("--cpus", int),
    "vm": ("--vm", vm_sizes),
    "scenario": ("--scenario", str),
    "seed": ("--seed", int),
    "barrier_us": ("--barrier-us", float),
    "job_phases": ("--job-phases", int),
    "auto_overhead": ("--auto-overhead", float),
    "cfs_slice_ms": ("--cfs-slice-ms", float),
}
#: The paper's host, for points that do not give the VMs.
COSIM_DEFAULT_VMS = "8+4"
#: Per target: parameter name → (CLI flag, value type).
TARGET_PARAMS: dict[str, ParamTable] = {"demo": PARAMS, "cosim": COSIM_PARAMS}
TARGETS = tuple(TARGET_PARAMS)


def cosim_args(point: dict) -> list[str]:
    """`preheat cosched simulate` arguments for one point: `vm=8+4` → `--vm 8 --vm 4`; the
    paper's VMs when `vm` is absent, as many CPUs as the largest VM when `cpus` is."""
    p = dict(point)
    p.setdefault("vm", COSIM_DEFAULT_VMS)
    sizes = [int(x) for x in vm_sizes(p["vm"]).split("+")]
    p.setdefault("cpus", max(sizes))
    args: list[str] = []
    for name, v in p.items():
        flag = COSIM_PARAMS[name][0]
        if name == "vm":
            for n in sizes:
                args += [flag, str(n)]
        else:
            args += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
    return args


def cosim_argv(binary: str, args: Sequence[str]) -> list[str]:
    """The full `preheat cosched simulate ... --json` command (its JSON goes to stdout)."""
    return [binary, "cosched", "simulate", *args, "--json"]


def parse_param(spec: str, target: str = "demo") -> tuple[str, list]:
    """`lead_us=20,65,200` → ("lead_us", [20.0, 65.0, 200.0]); the names of TARGET's table."""
    table = TARGET_PARAMS[target]
    if "=" not in spec:
        raise ValueError(f"--param {spec!r}: expected NAME=V1,V2,... (names: {', '.join(table)})")
    name, vals = spec.split("=", 1)
    name = name.strip().replace("-", "_")
    if name not in table:
        raise ValueError(f"--param {name}: unknown {target} parameter (known: {', '.join(table)})")
    sep = ";" if ";" in vals else ","
    raw = [v.strip() for v in vals.split(sep) if v.strip()]
    if not raw:
        raise ValueError(f"--param {name}: no values")
    conv = table[name][1]
    out = []
    for v in raw:
        try:
            x = conv(v)
        except ValueError:
            raise ValueError(f"--param {name}: {v!r} is not a valid {conv.__name__}") from None
        if conv is float and float(x).is_integer():
            x = int(x)
        out.append(x)
    if len(set(map(str, out))) != len(out):
        raise ValueError(f"--param {name}: repeated values")
    return name, out


def grid(params: Sequence[tuple[str, list]]) -> list[dict]:
    names = [n for n, _ in params]
    if len(set(names)) != len(names):
        raise ValueError("a parameter is given twice")
    return [dict(zip(names, combo)) for combo in itertools.product(*[v for _, v in params])]


#: Where the cosim target writes, below --out.
COSIM_DIR = "sweep-cosim"
