"""preheat lab affinity: what a run will do — the workloads and what they stand for, the
options, the Table 2 cells and Table 3 pairs taken from `preheat affinity topology`, the
conditions (with the win-back runs) and their shuffled rounds, the wall-time estimates and the
budget that fits --cpu-ms, and the plan as text. `affinity` runs it; `affinity_analysis`,
`_figures` and `_report` read its names.

Standard library only: the command line's choices come from here, and `--help` runs without
the lab's third-party packages."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WORKLOADS = ("chase", "stream", "branchy", "gzip", "xz", "sqlite3", "cc")
BUNDLED = ("chase", "stream", "branchy")
#: The paper's SPEC CPU2000 benchmark each workload stands for (the CLI's `stands_for`).
STANDS_FOR = {"chase": "mcf", "stream": "art", "branchy": "gcc / crafty", "gzip": "gzip",
              "xz": "gzip", "sqlite3": "— (no SPEC CPU2000 counterpart)", "cc": "gcc"}
WHAT = {"chase": "bundled kernel: dependent pointer chase over a large working set",
        "stream": "bundled kernel: streaming over arrays, poor temporal reuse",
        "branchy": "bundled kernel: branchy code with a large instruction footprint",
        "gzip": "Debian program on a fixed input", "xz": "Debian program on a fixed input",
        "sqlite3": "Debian program on a fixed input", "cc": "Debian program on a fixed input"}

DEFAULT_QUANTA = (2, 10, 200)
#: --quick: 2 ms only (at --cpu-ms 150 a 200 ms quantum never interleaves a bundled kernel: it
#: finishes within its first quantum).
QUICK_QUANTA = (2,)
QUICK_WORKLOADS = ("chase", "gzip")
DEFAULT_REPS = 5
QUICK_REPS = 2
DEFAULT_CPU_MS = 500
QUICK_CPU_MS = 150
#: The default --cpu-ms is lowered (not below this) when the estimate exceeds BUDGET_S.
MIN_CPU_MS = 150
TABLE3_QUANTUM_MS = 2
WINBACK_QUANTUM_MS = 2
#: The defaults must finish within 30 minutes on a 2-CPU machine.
BUDGET_S = 28 * 60.0
#: Wall time per run (measured with the real CLI on a 2-CPU machine): Table 2 — the workload's
#: CPU time shared with the interleaved vector (× ~2.1) plus ~0.35 s of start-up (processes,
#: buffers, program inputs); Table 3 — 2 copies on 2 CPUs with the interfering one (× ~1.7)
#: plus ~0.3 s. A program's fixed job is ~0.2–0.35 s of CPU time. (Defaults, 970 runs: 18.9 min
#: measured.)
WALL_PER_CPU_S = 2.1
RUN_OVERHEAD_S = 0.35
T3_WALL_PER_CPU_S = 1.7
T3_OVERHEAD_S = 0.3
PROGRAM_CPU_S = 0.35
TOPOLOGY_S = 10.0
UNAVAILABLE = ("not installed", "unavailable")
#: Fewer ok runs than this on either side: no significance verdict (the Welch t-interval is
#: valid for any n ≥ 2, but with 2 it is so wide that a verdict says little).
MIN_N = 3


# ---------------------------------------------------------------------------------------------
# Options


@dataclass
class Options:
    workloads: tuple[str, ...] = WORKLOADS
    quanta: tuple[int, ...] = DEFAULT_QUANTA
    reps: int = DEFAULT_REPS
    cpu_ms: int = DEFAULT_CPU_MS
    cpu_ms_given: bool = False
    seed: int = 1
    quick: bool = False
    from_dir: Path | None = None

    @classmethod
    def make(cls, quick: bool = False, workloads: str | None = None,
             quanta: str | None = None, reps: int | None = None,
             cpu_ms: int | None = None, seed: int | None = None,
             from_dir: Path | None = None) -> Options:
        """The command line's options; ValueError on a bad value. --quick: chase and gzip,
        the 2 ms quantum, 2 repetitions of 150 ms CPU, Table 3 with one pair, win-back for the
        first bundled kernel only."""
        o = cls(quick=quick)
        if quick:
            o.workloads, o.quanta = QUICK_WORKLOADS, QUICK_QUANTA
            o.reps, o.cpu_ms = QUICK_REPS, QUICK_CPU_MS
        if workloads is not None:
            ws = tuple(dict.fromkeys(w.strip().lower() for w in workloads.split(",") if w.strip()))
            bad = [w for w in ws if w not in WORKLOADS]
            if bad or not ws:
                raise ValueError(f"--workloads: unknown or no workload(s) {', '.join(bad)} "
                                 f"(known: {', '.join(WORKLOADS)})")
            o.workloads = ws
        if quanta is not None:
            try:
                qs = tuple(sorted({int(q) for q in quanta.split(",") if q.strip()}))
            except ValueError:
                raise ValueError(
                    f"--quanta: integers in ms, comma separated (not {quanta!r})") from None
            if not qs or min(qs) <= 0:
                raise ValueError("--quanta: at least one positive quantum in ms")
            o.quanta = qs
        if reps is not None:
            if reps < (1 if quick else 5):
                raise ValueError("--reps must be at least 5 (the intervals need them; --quick "
                                 "allows fewer, down to 1)")
            o.reps = reps
        if cpu_ms is not None:
            if cpu_ms < 10:
                raise ValueError("--cpu-ms must be at least 10")
            o.cpu_ms, o.cpu_ms_given = cpu_ms, True
        if seed is not None:
            o.seed = seed
        if from_dir is not None:
            p = Path(from_dir)
            if p.is_dir() and (p / "raw").is_dir() and not (p / "topology.json").exists():
                p = p / "raw"
            if not (p / "topology.json").is_file():
                raise ValueError(f"--from {from_dir}: no topology.json there (give DIR/raw of "
                                 "an earlier `preheat lab affinity` run)")
            o.from_dir = p
        return o

    def to_dict(self) -> dict:
        d = asdict(self)
        d["from_dir"] = str(self.from_dir) if self.from_dir else None
        return d


# ---------------------------------------------------------------------------------------------
# The plan: conditions and interleaved, shuffled rounds


def table2_cells(topo: dict, quanta: Sequence[int]) -> list[dict]:
    """The topology's Table 2 cells at the requested quanta (in the CLI's order)."""
    cells = ((topo or {}).get("table2") or {}).get("cells") or []
    qs = {int(q) for q in quanta}
    return [c for c in cells if isinstance(c, dict) and c.get("id")
            and int(c.get("quantum_ms") or 0) in qs]


def winback_cell(cells: Sequence[dict]) -> dict | None:
    """The strongest low-affinity cell at 2 ms: interleaved BV_L2 at low retention (the
    substitute cell, where L2 is private), else BV_L1D at low retention."""
    at = [c for c in cells if int(c.get("quantum_ms") or 0) == WINBACK_QUANTUM_MS
          and c.get("retention") == "low"]
    for vec in ("BV_L2", "BV_L1D"):
        for c in at:
            if c.get("interleaved") == vec:
                return c
    return None


def high_cell_id(cell: dict) -> str:
    """The matching high-affinity cell: BV_0 at the same retention and quantum."""
    return f"BV_0.{cell.get('retention')}.q{int(cell['quantum_ms'])}"


def table3_pairs(workloads: Sequence[str], quick: bool = False) -> list[tuple[str, str]]:
    """Each workload once as the main benchmark, the next one (cyclic) interfering, as the
    paper's Table 3 rotates its benchmarks; --quick: the first pair only."""
    ws = list(workloads)
    pairs = [(w, ws[(i + 1) % len(ws)]) for i, w in enumerate(ws)]
    return pairs[:1] if quick else pairs


def t2_cond_id(w: str, cell_id: str, preheat: bool) -> str:
    return f"t2-{w}-{cell_id}" + ("-preheat" if preheat else "")


def t3_cond_id(w: str, w2: str, affinity: str, preheat: bool) -> str:
    return f"t3-{w}+{w2}-{affinity}-q{TABLE3_QUANTUM_MS}" + ("-preheat" if preheat else "")


#: A bundled kernel runs at least this many main quanta (its --cpu-ms is raised for long quanta:
#: at 200 ms, 500 ms of CPU would be two or three quanta, mostly boundaries). The programs run
#: their fixed jobs (~0.2-0.35 s of CPU), so at 200 ms they are interleaved once or twice at most:
#: the report flags those runs.
MIN_QUANTA = 5


def cell_cpu_ms(w: str, quantum_ms: float, cpu_ms: int) -> int:
    """The --cpu-ms of a bundled kernel in a cell with this quantum."""
    return max(cpu_ms, int(MIN_QUANTA * quantum_ms)) if w in BUNDLED else cpu_ms


def _cpu_args(w: str, cpu_ms: int) -> list[str]:
    # --cpu-ms is the bundled kernels' length; the programs run their fixed inputs.
    return ["--cpu-ms", str(cpu_ms)] if w in BUNDLED else []


def _t2_cond(w: str, cell: dict, preheat: bool, cpu_ms: int, purpose: str) -> dict:
    args = ["affinity", "run", "--json", "--workload", w, "--interleave", str(cell["interleaved"])]
    if cell.get("concurrent"):
        args += ["--concurrent", str(cell["concurrent"])]
    cpu = cell_cpu_ms(w, float(cell["quantum_ms"]), cpu_ms)
    args += ["--quantum-ms", str(int(cell["quantum_ms"]))] + _cpu_args(w, cpu)
    if preheat:
        args.append("--preheat")
    return {"cond": t2_cond_id(w, cell["id"], preheat), "experiment": "table2",
            "purpose": purpose, "workload": w, "interfering": None, "cell_id": cell["id"],
            "interleaved": cell.get("interleaved"), "concurrent": cell.get("concurrent"),
            "concurrent_cpu": cell.get("concurrent_cpu"), "affinity": cell.get("affinity"),
            "retention": cell.get("retention"), "quantum_ms": int(cell["quantum_ms"]),
            "preheat": preheat, "paper_cell": cell.get("paper_cell"),
            "substitute": cell.get("substitute"), "args": args}


def _t3_cond(w: str, w2: str, affinity: str, preheat: bool, cpu_ms: int, purpose: str) -> dict:
    args = ["affinity", "run", "--json", "--experiment", "table3", "--workload", w,
            "--interfering", w2, "--affinity", affinity, "--quantum-ms",
            str(TABLE3_QUANTUM_MS)] + _cpu_args(w, cpu_ms)
    if preheat:
        args.append("--preheat")
    return {"cond": t3_cond_id(w, w2, affinity, preheat), "experiment": "table3",
            "purpose": purpose, "workload": w, "interfering": w2,
            "cell_id": f"table3.{affinity}.q{TABLE3_QUANTUM_MS}", "interleaved": None,
            "concurrent": None, "concurrent_cpu": None, "affinity": affinity,
            "retention": None, "quantum_ms": TABLE3_QUANTUM_MS, "preheat": preheat,
            "paper_cell": f"Table 3, {affinity} affinity", "substitute": None, "args": args}


def build_conditions(topo: dict, o: Options, notes: list[str] | None = None) -> list[dict]:
    """Every condition once: Table 2 (workload × cell), Table 3 (pairs × high/low at 2 ms) and
    the win-back conditions (`--preheat` on the strongest low Table 2 cell and on its BV_0
    cell; on Table 3 high and low; bundled main workloads only, --quick: the first). NOTES
    collects what could not be planned."""
    notes = notes if notes is not None else []
    cells = table2_cells(topo, o.quanta)
    if not cells:
        qs = ", ".join(map(str, o.quanta))
        notes.append(f"the topology has no Table 2 cell at quanta {qs} ms")
    conds = [_t2_cond(w, c, False, o.cpu_ms, "table2") for w in o.workloads for c in cells]
    t3 = (topo or {}).get("table3") or {}
    pairs: list[tuple[str, str]] = []
    if t3.get("feasible"):
        pairs = table3_pairs(o.workloads, o.quick)
        for w, w2 in pairs:
            for aff in ("high", "low"):
                conds.append(_t3_cond(w, w2, aff, False, o.cpu_ms, "table3"))
    else:
        notes.append("Table 3 is not feasible on this machine (the CLI: "
                     + ("; ".join(map(str, t3.get("notes") or [])) or "no reason given")
                     + "): not run")
    bundled = [w for w in o.workloads if w in BUNDLED][: 1 if o.quick else None]
    low = winback_cell(cells)
    if bundled and low is None:
        notes.append(f"win-back: no low-retention BV_L2 or BV_L1D cell at {WINBACK_QUANTUM_MS} ms "
                     "(--quanta without 2?): not run")
    ids = {c["id"] for c in cells}
    if low is not None and high_cell_id(low) not in ids:
        notes.append(f"win-back: the matching high cell {high_cell_id(low)} is missing: not run")
        low = None
    high = next((c for c in cells if low is not None and c["id"] == high_cell_id(low)), None)
    for w in bundled:
        if low is not None and high is not None:
            conds.append(_t2_cond(w, low, True, o.cpu_ms, "winback"))
            conds.append(_t2_cond(w, high, True, o.cpu_ms, "winback"))
        for m, w2 in pairs:
            if m == w:
                for aff in ("high", "low"):
                    conds.append(_t3_cond(w, w2, aff, True, o.cpu_ms, "winback"))
    return conds


def build_plan(conds: Sequence[dict], reps: int, seed: int) -> list[dict]:
    """Round r (1..reps) runs every condition once, in an order shuffled with a generator
    seeded by (seed, r): the same seed gives the same plan."""
    plan = []
    for r in range(1, reps + 1):
        order = [c["cond"] for c in conds]
        random.Random(seed * 1_000_003 + r).shuffle(order)
        for i, cid in enumerate(order, 1):
            plan.append({"run_id": f"r{r:02d}-{i:03d}-{cid}", "round": r, "order": i,
                         "cond": cid, "status": "pending"})
    return plan


def run_estimate_s(cond: dict, cpu_ms: int) -> float:
    q = float(cond.get("quantum_ms") or 0)
    cpu = cell_cpu_ms(cond["workload"], q, cpu_ms) / 1000 if cond["workload"] in BUNDLED \
        else PROGRAM_CPU_S
    if cond["experiment"] == "table3":
        return T3_OVERHEAD_S + T3_WALL_PER_CPU_S * cpu
    return RUN_OVERHEAD_S + WALL_PER_CPU_S * cpu


def estimate_s(conds: Sequence[dict], reps: int, cpu_ms: int) -> float:
    return TOPOLOGY_S + reps * sum(run_estimate_s(c, cpu_ms) for c in conds)


def fit_cpu_ms(conds: Sequence[dict], o: Options) -> int:
    """The default --cpu-ms, lowered (to no less than MIN_CPU_MS) when the estimate exceeds
    BUDGET_S; a given --cpu-ms is kept."""
    if o.cpu_ms_given or o.quick or estimate_s(conds, o.reps, o.cpu_ms) <= BUDGET_S:
        return o.cpu_ms
    bundled_runs = o.reps * sum(c["workload"] in BUNDLED for c in conds)
    if not bundled_runs:
        return o.cpu_ms
    fixed = estimate_s(conds, o.reps, 0)
    per_ms = (estimate_s(conds, o.reps, 1000) - fixed) / 1000  # seconds per ms of --cpu-ms
    room = BUDGET_S - fixed  # what the CPU time of the kernels may take
    return int(max(MIN_CPU_MS, min(o.cpu_ms, room / per_ms)))


def _kib(b: Any) -> str:
    try:
        b = int(b)
    except (TypeError, ValueError):
        return "?"
    return f"{b // 1048576} MiB" if b >= 1048576 and b % 1048576 == 0 else f"{b / 1024:g} KiB"


AFFINITY_ORDER = ("low-d", "low-i", "low-d-l2", "high")
AFFINITY_NAME = {"low-d": "low L1 D-cache affinity", "low-i": "low L1 I-cache affinity",
                 "low-d-l2": "low L1D+L2 affinity (substitute)", "high": "high affinity"}


def matrix_rows(topo: dict, quanta: Sequence[int]) -> list[dict]:
    """The Table 2 matrix as this machine runs it: rows retention, columns affinity; each entry
    the interleaved (+ concurrent) vectors and the quanta."""
    cells = table2_cells(topo, quanta)
    rows = []
    for ret in ("high", "low"):
        row = {"retention": f"{ret} retention"}
        for aff in AFFINITY_ORDER:
            cs = [c for c in cells if c.get("retention") == ret and c.get("affinity") == aff]
            if not cs:
                continue
            c0 = cs[0]
            txt = str(c0.get("interleaved"))
            if c0.get("concurrent"):
                txt += f" + {c0['concurrent']} on CPU {c0.get('concurrent_cpu')}"
            txt += " @ " + ",".join(str(int(c["quantum_ms"])) for c in cs) + " ms"
            row[AFFINITY_NAME[aff]] = txt
        rows.append(row)
    return rows


def substitutions(topo: dict) -> list[str]:
    cells = ((topo or {}).get("table2") or {}).get("cells") or []
    return list(dict.fromkeys(str(c["substitute"]) for c in cells if c.get("substitute")))


def topology_text(topo: dict, quanta: Sequence[int]) -> str:
    """What the plan is built on, printed before measuring."""
    t2 = topo.get("table2") or {}
    t3 = topo.get("table3") or {}
    cpus = ",".join(map(str, topo.get("cpus") or []))
    lines = [(f"preheat affinity topology (measured on this machine; source {topo.get('source')}, "
              f"CPUs {cpus}, main CPU {topo.get('main_cpu')})")]
    caches = []
    for c in topo.get("caches") or []:
        sh = c.get("shared_cpus") or []
        caches.append(f"{c.get('name')} {_kib(c.get('bytes'))} "
                      + ("(private)" if len(sh) <= 1
                         else f"(shared with CPUs {','.join(map(str, sh))})"))
    lines.append("  caches of the main CPU: " + "; ".join(caches))
    lines.append("  base vectors: " + "; ".join(
        f"{v.get('name')} {_kib(v.get('bytes'))}" + (f" → {v['target']}" if v.get("target") else "")
        for v in topo.get("vectors") or []))
    lines.append(f"  Table 2 matrix (low retention destroys {t2.get('retention_level')} from "
                 f"CPU {t2.get('concurrent_cpu')}; the paper's exact cells: "
                 f"{'yes' if t2.get('paper_exact') else 'no'}):")
    for r in matrix_rows(topo, quanta):
        lines.append(f"    {r['retention']:>15}: " + " | ".join(
            f"{k}: {v}" for k, v in r.items() if k != "retention"))
    for s in substitutions(topo):
        lines.append(f"  substitution: {s}")
    for n in t2.get("notes") or []:
        lines.append(f"  note: {n}")
    if t3:
        lines.append(f"  Table 3: {'feasible' if t3.get('feasible') else 'NOT feasible'} on CPUs "
                     f"{','.join(map(str, t3.get('cpus') or []))} ({t3.get('main_copies')} main "
                     f"copies + {t3.get('interfering')} interfering); a move loses "
                     f"{', '.join(t3.get('lost_on_move') or []) or '–'}, keeps "
                     f"{', '.join(t3.get('kept_on_move') or []) or '–'}")
        for n in t3.get("notes") or []:
            lines.append(f"  Table 3 note: {n}")
    for e in topo.get("eviction") or []:
        share = e.get("share")
        lines.append(f"  eviction check ({e.get('kind', 'measured')}): {e.get('vector')} evicts "
                     + (f"{100 * share:.0f}%" if isinstance(share, (int, float)) else "?")
                     + f" of {e.get('level')} (n={e.get('samples')})")
    lines.append(f"  metric: {topo.get('metric')}")
    return "\n".join(lines)
