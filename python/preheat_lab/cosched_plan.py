"""preheat lab cosched: what a run will do and what it costs — the kernels, scenarios and
policies, the command's options, the simulated hosts and the simulator's plan (one run per host ×
kernel × scenario × seed), the wall-time estimates of the measured experiment and of the
simulations, and the budget that shortens the simulations to fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import cli
from .cli import ToolError
from .npb import KERNELS
from .sweep_grid import cosim_args

SCENARIOS = ("single", "double", "quad")
POLICIES = ("none", "full", "partial-static", "partial-auto")
PARTIAL = ("partial-static", "partial-auto")
SIM_POLICIES = ("full",) + PARTIAL
#: Barriers per iteration of each bundled kernel (the simulator's phase = iteration / barriers).
BARRIERS = {"mg": 2, "is": 2, "cg": 1, "ep": 0}
#: Per cell of the measured experiment beyond --seconds + 0.5: starting the VMs, resetting,
#: stopping, restoring (measured on a 2-CPU machine: 32 cells of 2 s took 149 s).
CELL_OVERHEAD_S = 1.9
#: Per kernel: the calibration runs (3 alone runs of 1 s) that measure the iteration time.
ALONE_S = 4.0
#: With --guests (QEMU guests, booted for every run): per cell beyond --seconds + 0.5, the boot
#: (~7.5 s from QEMU's start to the controller, two guests at once), the guests' 2.5 s start
#: delay and power-off; per calibration run, one boot of two 1-vCPU guests (~16 s). Measured on
#: a 2-CPU machine with the PVH kernel: 4 cells of 3 s and 3 calibration runs took 103 s.
GUEST_CELL_OVERHEAD_S = 10.0
GUEST_CALIBRATION_RUN_S = 16.0
#: With --guests, per kernel: the boot that calibrates partial-auto's noise floor (a 2-vCPU
#: guest with detection in QEMU, 1 s warm-up, 3 s sampled; the workload runs 7 s).
GUEST_FLOOR_RUN_S = 11.0
#: Kernels a guest can run: its progress is counted in barrier phases, and ep has no barrier.
GUEST_KERNELS = ("mg", "cg", "is")
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
    #: every VM a real QEMU guest (`preheat cosched experiment --guests`)
    guests: bool = False
    #: calibration runs per kernel (`--calibration-runs`; guests: one boot each)
    calibration_runs: int = 3

    @property
    def cell_overhead_s(self) -> float:
        return GUEST_CELL_OVERHEAD_S if self.guests else CELL_OVERHEAD_S

    @property
    def calibration_s(self) -> float:
        if self.guests:
            per_kernel = self.calibration_runs * GUEST_CALIBRATION_RUN_S + GUEST_FLOOR_RUN_S
            return len(self.kernels) * per_kernel
        return len(self.kernels) * ALONE_S

    @classmethod
    def make(cls, quick: bool = False, kernels: str | None = None, reps: int | None = None,
             seconds: float | None = None, sim_seeds: int | None = None,
             measure: bool = True, from_file: Path | None = None,
             guests: bool = False, scenarios: str | None = None) -> Options:
        """The command line's options (`--quick`: mg,ep; single,double; 2 repetitions of 2 s;
        regrouping every 0.7 s; 2 simulator seeds; with `--guests`: QEMU guests, mg,cg, 3
        repetitions of 8 s, so the measured part stays near 20 min with a boot per run; --quick
        mg, 1 repetition of 3 s, since guests come up ~1 s apart, and 1 calibration boot instead
        of 3). ValueError on a bad value."""
        o = cls(quick=quick, measure=measure, from_file=Path(from_file) if from_file else None,
                guests=guests)
        known = GUEST_KERNELS if guests else KERNELS
        if guests:
            o.kernels, o.reps, o.seconds = ("mg", "cg"), 3, 8.0
        if quick:
            o.kernels, o.reps, o.seconds, o.regroup_s, o.sim_seeds = ("mg", "ep"), 2, 2.0, 0.7, 2
            if guests:
                o.kernels, o.reps, o.seconds, o.calibration_runs = ("mg",), 1, 3.0, 1
        if kernels is not None:
            ks = tuple(k.strip() for k in kernels.split(",") if k.strip())
            bad = [k for k in ks if k not in known]
            if bad or not ks:
                raise ValueError(f"--kernels: unknown or no kernel(s) {', '.join(bad)} "
                                 f"(known{' with --guests' if guests else ''}: {', '.join(known)})")
            o.kernels = ks
        if scenarios is not None:
            ss = tuple(x.strip() for x in scenarios.split(",") if x.strip())
            bad = [x for x in ss if x not in ("single", "double")]
            if bad or not ss:
                raise ValueError(f"--scenarios: unknown or no scenario(s) {', '.join(bad)} "
                                 "(known: single, double)")
            o.scenarios = ss
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
    return measured_cells(o) * (o.seconds + 0.5 + o.cell_overhead_s) + o.calibration_s


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
                    args = cosim_args(point) + ["--policy", ",".join(SIM_POLICIES)]
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
