"""preheat lab: experiments around the `preheat` CLI, with tables, plots and an HTML report.

  table1    the paper's Table 1 and Figure 3 on real servers (preheat demo per server)
  peer      our load generator vs memcaslap / redis-benchmark / wrk on the same server
  sweep     preheat demo (or, --target cosim, the coscheduling simulator) over a parameter grid
  report    rebuild DIR/report.html from what DIR holds
  sleeping  the sleeping-CPUs experiments (Zhu et al.)
  comm      communication detection on the bundled kernels (or given reports): heatmaps, sets
  cosched   partial coscheduling (SAC'15 §4-5): measured here, simulated at 8 and 64 CPUs
  affinity  cache affinity (Kazempour et al.): Table 2 cells, Table 3 pairs, --preheat win-back

All commands write into --out DIR (atomically: temp file + rename) and DIR/report.html. A server
that fails is reported with its reason and the run goes on (exit code 1 at the end); Ctrl-C or
SIGTERM stops the running child (SIGTERM to its process group) and writes a partial report
(exit code 130 / 143). The `preheat` binary: $PREHEAT_BIN, else release, debug in Cargo's
target directory ($CARGO_TARGET_DIR or target/), else PATH (build: cargo build --release).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import affinity_plan, cosched_plan
from .cli import ToolError
from .deps import needed_for
from .npb import KERNELS
from .peer_clients import PEER_SERVERS
from .sleeping_plan import EXPERIMENT_NAMES
from .sweep_grid import COSIM_PARAMS, PARAMS, TARGETS, grid, parse_param
from .table1_run import SERVERS, CustomServer, DemoOptions

QUICK_ROUNDS = 5


def _number(kind: type, low: float, inclusive: bool) -> Callable[[str], Any]:
    """An argparse type: a `kind` number at least (or above) `low`, else a clear error."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if v < low or (v == low and not inclusive):
            raise argparse.ArgumentTypeError(f"{text}: must be {'at least' if inclusive else 'above'} {low:g}")
        return v
    return parse


_positive_int = _number(int, 1, True)
_nonneg_int = _number(int, 0, True)
_positive_float = _number(float, 0, False)
_nonneg_float = _number(float, 0, True)


def _servers(text: str, allowed: Sequence[str]) -> list[str]:
    out = [s.strip().lower() for s in text.split(",") if s.strip()]
    bad = [s for s in out if s not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown server(s) {', '.join(bad)} (known: {', '.join(allowed)})")
    return out


def _demo_args(p: argparse.ArgumentParser, rounds_default: int) -> None:
    g = p.add_argument_group("preheat demo options (default: the CLI's own)")
    g.add_argument("--rounds", type=_positive_int, default=None,
                   help=f"interleaved rounds per server (default {rounds_default}; --quick: {QUICK_ROUNDS})")
    g.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds, for tests and smoke runs")
    g.add_argument("--lead-us", type=_positive_float, help="announcement lead time, µs (Fastpass: 65)")
    g.add_argument("--idle-ms", type=_nonneg_float, help="idle gap before a cold-idle request, ms")
    g.add_argument("--sweep-mib", type=_positive_int, help="eviction sweep size, MiB")
    g.add_argument("--post-gap-us", type=_nonneg_float, help="gap after the sweep, µs")
    g.add_argument("--strategies", help="strategies, comma separated (each may combine with +)")
    g.add_argument("--samples", type=_positive_int, help="recording samples (n of k-of-n)")
    g.add_argument("--keep", type=_positive_int, help="keep lines seen in at least this many samples (k)")
    g.add_argument("--gap-merge", type=_nonneg_int, help="merge runs separated by at most this many lines")
    g.add_argument("--server-cpu", type=_nonneg_int, help="server CPU (default: the last)")
    g.add_argument("--syscall-stages", action="store_true",
                   help="also split every response at the server's own system calls (to read, "
                        "compute, reply: stages.csv); root, ~0.6 µs per traced call")
    g.add_argument("--connection-row", action="store_true",
                   help="also measure the demo's conn-primed row (one request on the measured "
                        "connection after going cold, then auto's announcement; not a strategy): "
                        "decomposition.csv gets auto − conn-primed, what the connection costs")
    g.add_argument("--timeout-s", type=_positive_float, help="per-demo time limit (default: 300 s + 3 s/round)")
    g.add_argument("--bootstrap", type=_positive_int, default=None,
                   help="bootstrap resamples for CIs (default 2000)")


def _demo_options(a: argparse.Namespace, rounds_default: int) -> DemoOptions:
    rounds = a.rounds if a.rounds is not None else (QUICK_ROUNDS if a.quick else rounds_default)
    return DemoOptions(rounds=rounds, lead_us=a.lead_us, idle_ms=a.idle_ms, sweep_mib=a.sweep_mib,
                       post_gap_us=a.post_gap_us, strategies=a.strategies, samples=a.samples,
                       keep=a.keep, gap_merge=a.gap_merge, server_cpu=a.server_cpu,
                       timeout_s=a.timeout_s, syscall_stages=a.syscall_stages,
                       connection_row=a.connection_row)


def _boot(a: argparse.Namespace, default: int) -> int:
    """--bootstrap, else 500 with --quick, else DEFAULT (stats.DEFAULT_BOOT: passed in, since
    stats needs numpy and this runs before the experiment's modules are imported)."""
    if a.bootstrap is not None:
        return a.bootstrap
    return 500 if a.quick else default


def _custom_server(parser: argparse.ArgumentParser,
                   a: argparse.Namespace) -> CustomServer | None:
    """The server given by its command after `--` (None: catalog servers); usage errors exit."""
    command = list(a.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        if a.port is not None or a.request is not None or a.name is not None:
            parser.error("--port/--request/--name describe a server given by its command: "
                         "add -- CMD ARGS...")
        return None
    if a.servers is not None:
        parser.error("give either --servers (catalog servers) or a server's command after --")
    if a.port is None or a.request is None:
        parser.error("a server given by its command needs --port and --request")
    return CustomServer(command=command, port=a.port, request=a.request, protocol=a.protocol,
                        name=a.name or "")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line (standard library only) and each command's parser by name."""
    ap = argparse.ArgumentParser(prog="python -m preheat_lab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    t1 = sub.add_parser(
        "table1", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="Table 1 and Figure 3 on real servers",
        description="For each server: preheat demo --server S --rounds N --json --out "
                    "DIR/raw/S.json --records DIR/raw/S.jsonl; then from the raw per-request "
                    "samples: samples.parquet/.csv, table1.csv (mean and median with 95% CIs, "
                    "p99, share of the cold overhead removed, working set, preheat time, GB/s, "
                    "CPI), headline.csv (beside the paper's Table 1), decomposition.csv (where "
                    "cold-start time goes), figure3*.png/svg (CDFs), summary.json, report.html.")
    t1.add_argument("--out", type=Path, default=Path("results/table1"),
                    help="output directory (raw/, tables, figures, report.html) (default results/table1)")
    t1.add_argument("--servers", type=lambda s: _servers(s, SERVERS), default=None,
                    help=f"comma list (default: {','.join(SERVERS)})")
    g = t1.add_argument_group(
        "any server", "instead of catalog servers, one server given by its command after --, as "
                      "`preheat demo --port P --protocol X --request R -- CMD` takes it")
    g.add_argument("--port", type=_positive_int, help="the port the server listens on")
    g.add_argument("--protocol", choices=["http", "memcached", "redis", "raw"], default="http",
                   help="its protocol (default http)")
    g.add_argument("--request", help="the request to measure: an HTTP path, a key, raw bytes")
    g.add_argument("--name", help="the name of its rows (default: the command's program name)")
    g.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- CMD ARGS...: the server's command line")
    _demo_args(t1, 200)

    pe = sub.add_parser(
        "peer", help="our load generator vs an established client on the same server",
        description="preheat serve --server S --json, then closed loop with the same threads and "
                    "connections: preheat load --wait epoll (the main row: epoll_wait then read, "
                    "as the peers do), the peer (memcaslap / redis-benchmark / wrk), then the "
                    "extra rows preheat load --wait block and --wait spin. Reports throughput, "
                    "mean (p50/p99 where the peer prints them), ours/peer and whether within 5%; "
                    "the verdict uses the main row only; DIR/peer/.")
    pe.add_argument("--out", type=Path, default=Path("results/peer"),
                    help="output directory (results in DIR/peer/, report in DIR/report.html) (default results/peer)")
    pe.add_argument("--servers", type=lambda s: _servers(s, PEER_SERVERS), default=list(PEER_SERVERS),
                    help=f"comma list of {','.join(PEER_SERVERS)}")
    pe.add_argument("--seconds", type=_positive_float, default=10.0, help="duration of each run (default 10)")
    pe.add_argument("--connections", type=_positive_int, default=4, help="connections on both sides (default 4)")
    pe.add_argument("--repeats", type=_positive_int, default=1, help="repeat ours-epoll/peer/ours-block/ours-spin (default 1)")
    pe.add_argument("--server-cpu", type=_nonneg_int,
                    help="pin the server to this CPU (default: the last CPU; both clients get the others)")
    pe.add_argument("--threads", type=_positive_int, default=1,
                    help="client threads on both sides (default 1; redis-benchmark is always 1)")
    pe.add_argument("--no-pin", action="store_true",
                    help="do not pin the server and the clients (default: pinned, recorded in the report)")
    pe.add_argument("--tolerance", type=_positive_float, default=0.05, help="agreement band (default 0.05)")
    pe.add_argument("--quick", action="store_true", help="2-second runs")

    sw = sub.add_parser(
        "sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="preheat demo (or the coscheduling simulator) over a grid of parameters",
        description="Cartesian product of --param NAME=V1,V2,... (repeatable); each point is one "
                    "preheat demo. Names: " + ", ".join(PARAMS) + ". For strategies each "
                    "comma-separated value is one strategy; separate values with ';' when a value "
                    "lists several (strategies='wake,lines;all'). Writes DIR/sweep/: sweep.csv/"
                    ".parquet (one row per point and mode), sweep-NAME.png/svg, sweep.json.\n\n"
                    "--target cosim: each point is one preheat cosched simulate (SIMULATED). "
                    "Names: " + ", ".join(COSIM_PARAMS) + " (vm=8+4,64+32: VM sizes joined by "
                    "+). Writes DIR/sweep-cosim/ (one row per point and policy).")
    sw.add_argument("--target", choices=TARGETS, default="demo",
                    help="what each point runs (default demo; cosim: preheat cosched simulate)")
    sw.add_argument("--out", type=Path, default=Path("results/sweep"),
                    help="output directory (results in DIR/sweep/, report in DIR/report.html) (default results/sweep)")
    sw.add_argument("--param", action="append", required=True, metavar="NAME=V1,V2,...",
                    help="a swept parameter and its values (repeat for a grid)")
    sw.add_argument("--server", default="kv", choices=SERVERS)
    sw.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local: process pool; ray: Ray tasks, one per node at a time, each "
                         "requesting all CPUs of its node")
    sw.add_argument("--jobs", type=_positive_int, default=None,
                    help="points at a time (local default 1: concurrent measurements interfere; "
                         "ray default: one per node)")
    sw.add_argument("--ray-address", default=None, help="ray.init(address=...) (default: a local cluster)")
    _demo_args(sw, 100)

    rp = sub.add_parser("report", help="rebuild DIR/report.html (re-analyzing DIR/raw if present)")
    rp.add_argument("--out", type=Path, required=True, help="a directory a lab command wrote")
    rp.add_argument("--bootstrap", type=_positive_int, default=None, help="bootstrap resamples (default 2000)")
    rp.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)

    cm = sub.add_parser(
        "comm", help="communication detection: heatmaps and coscheduling sets",
        description="For each bundled kernel: preheat comm (reset after start-up, report while "
                    "it runs) and preheat groups; heatmaps with the detected sets, the true sets "
                    "beside them, comm.csv/.parquet, *.groups.json, report.html in --out. "
                    "--from renders existing `preheat comm --out` files of any program.")
    cm.add_argument("--out", type=Path, default=Path("results/comm"), help="output directory (default results/comm)")
    cm.add_argument("--kernels", default=",".join(KERNELS),
                    help="comma list of mg,cg,is,ep (empty: none)")
    cm.add_argument("--from", dest="from_files", type=Path, nargs="*", default=[],
                    help="existing preheat comm reports to render")
    cm.add_argument("--seconds", type=_positive_float, default=4.0, help="kernel run time (default 4)")
    cm.add_argument("--quick", action="store_true", help="2-second runs of mg only")

    cs = sub.add_parser(
        "cosched", help="partial coscheduling: measured here, simulated at 8 and 64 CPUs",
        description="preheat cosched experiment (MEASURED at this machine's size; skipped with "
                    "--no-measure, replaced by --from FILE.json) and preheat cosched simulate "
                    "(SIMULATED: 8 CPUs with VMs 8+4, 64 CPUs with 64+32 and 64+32+16+16; every "
                    "kernel, scenario and --sim-seeds seeds): figures in the shape of the paper's "
                    "Figures 6/7, co-run and idle shares, partial-auto's sets, the simulated-vs-"
                    "measured validation, the paper's findings beside ours; tables, report.html.")
    cs.add_argument("--out", type=Path, default=Path("results/cosched"), help="output directory (default results/cosched)")
    cs.add_argument("--quick", action="store_true",
                    help="mg,ep; single,double; 2 reps of 2 s; regroup 0.7 s; 2 seeds (minutes)")
    cs.add_argument("--kernels", help="comma list of mg,cg,is,ep (default all; --quick: mg,ep)")
    cs.add_argument("--scenarios", help="comma list of single,double (default both)")
    cs.add_argument("--reps", type=_positive_int, help="repetitions per cell (default 5; --quick: 2)")
    cs.add_argument("--seconds", type=_positive_float, help="seconds per run (default 6; --quick: 2)")
    cs.add_argument("--from", dest="from_file", type=Path,
                    help="render this `preheat cosched experiment --json` output instead of measuring")
    cs.add_argument("--no-measure", action="store_true", help="simulations only")
    cs.add_argument("--guests", action="store_true",
                    help="every VM a real QEMU guest (preheat cosched experiment --guests; "
                         "kernels mg,cg,is; guests booted per run; --quick: mg, 3 s runs)")
    cs.add_argument("--sim-seeds", type=_nonneg_int, help="simulator seeds per configuration "
                                                  "(default 5; --quick: 2; 0: no simulations)")

    af = sub.add_parser(
        "affinity", help="cache affinity (Kazempour et al.): Table 2, Table 3, --preheat win-back",
        description="preheat affinity topology --json --verify gives the plan (this machine's "
                    "Table 2 cells, with substitutions); then every workload × cell, the Table 3 "
                    "pairs (each workload main once, the next interfering; high/low affinity, "
                    "2 ms) and the win-back runs (bundled kernels at 2 ms: the strongest low cell and "
                    "Table 3, each low and high, with and without --preheat), each once per round "
                    "in a seeded shuffled order, --reps rounds; one `preheat affinity run --json` "
                    "per run (MEASURED). Means with Student-t 95% intervals, % difference vs the "
                    "BV_0 cell with a Welch interval (significant only if it excludes 0), recovered "
                    "share (low+preheat - low) / (high+preheat - low) with Fieller's interval, "
                    "quanta achieved, refill profiles; the paper's numbers beside ours; tables, "
                    "figures, report.html in --out.")
    af.add_argument("--out", type=Path, help="output directory (required unless --from: then "
                                             "the directory holding raw/)")
    af.add_argument("--quick", action="store_true",
                    help="chase + gzip, quantum 2 ms, 2 reps of 150 ms CPU, one Table 3 pair, "
                         "win-back for chase (about 1 min)")
    af.add_argument("--workloads", help="comma list of chase,stream,branchy,gzip,xz,sqlite3,cc "
                                        "(default all; --quick: chase,gzip)")
    af.add_argument("--quanta", help="quanta in ms, comma list (default 2,10,200; --quick: 2)")
    af.add_argument("--reps", type=_positive_int, help="rounds: every condition once per round "
                                             "(default 5, at least 5 unless --quick; --quick: 2)")
    af.add_argument("--cpu-ms", type=_positive_int, help="CPU time per bundled-kernel run, ms (default 500, "
                                               "lowered to fit 28 min; --quick: 150)")
    af.add_argument("--seed", type=int, help="seed of the shuffled order (default 1)")
    af.add_argument("--from", dest="from_dir", type=Path,
                    help="re-render DIR/raw of an earlier run without measuring")

    sp = sub.add_parser("sleeping", help="the sleeping-CPUs experiments (plots + HTML report)")
    sp.add_argument("--out", type=Path, default=Path("results/sleeping"))
    sp.add_argument("--quick", action="store_true", help="tiny runs (for tests)")
    sp.add_argument("--only", default="", help=f"comma list of {','.join(EXPERIMENT_NAMES)}")

    return ap, sub.choices


def main(argv: list[str] | None = None) -> int:
    ap, commands = build_parser()
    a = ap.parse_args(argv)
    return _run(ap, commands["table1"], a)


def _run(ap: argparse.ArgumentParser, t1: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """Check the arguments, then run the command. The command line is checked with the
    standard library only; the experiment modules (and with them numpy, pandas, matplotlib)
    are imported here, and only here, each inside `needed_for`, which ends the run with one
    line saying how to install a missing package."""
    if a.cmd == "comm":
        kernels = [k for k in a.kernels.split(",") if k]
        bad = [k for k in kernels if k not in KERNELS]
        if bad:
            ap.error(f"unknown kernel(s) {', '.join(bad)} (known: {', '.join(KERNELS)})")
        if a.quick:
            kernels, a.seconds = ["mg"], 2.5
        with needed_for(a.cmd):
            from . import comm
        return comm.run(a.out, kernels, a.from_files, seconds=a.seconds)
    if a.cmd == "cosched":
        try:
            o = cosched_plan.Options.make(a.quick, a.kernels, a.reps, a.seconds, a.sim_seeds,
                                          not a.no_measure, a.from_file, a.guests,
                                          scenarios=a.scenarios)
        except ValueError as e:
            ap.error(str(e))
        with needed_for(a.cmd):
            from . import cosched
        return cosched.run(a.out, o)
    if a.cmd == "affinity":
        try:
            ao = affinity_plan.Options.make(a.quick, a.workloads, a.quanta, a.reps, a.cpu_ms,
                                            a.seed, a.from_dir)
        except ValueError as e:
            ap.error(str(e))
        if a.out is None and ao.from_dir is None:
            ap.error("affinity: --out DIR is required (unless --from DIR/raw)")
        with needed_for(a.cmd):
            from . import affinity
        return affinity.run(a.out, ao)
    if a.cmd == "sleeping":
        only = [x for x in a.only.split(",") if x] or None
        with needed_for(a.cmd):
            from . import sleeping
        res = sleeping.run_all(a.out, quick=a.quick, only=only)
        failed = [p.stem for p in a.out.glob("*.error.txt")]
        print(f"wrote {a.out / 'report.html'} ({len(res)} experiments"
              + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
        return 1 if failed else 0

    try:
        if a.cmd == "table1":
            custom = _custom_server(t1, a)
            servers = a.servers if a.servers is not None else list(SERVERS)
            with needed_for(a.cmd):
                from . import stats, table1
            return table1.run(a.out, servers, _demo_options(a, 200),
                              boot=_boot(a, stats.DEFAULT_BOOT), custom=custom)
        if a.cmd == "peer":
            with needed_for(a.cmd):
                from . import peer
            opts = peer.PeerOptions(connections=a.connections,
                                    seconds=2.0 if a.quick and a.seconds == 10.0 else a.seconds,
                                    repeats=a.repeats, server_cpu=a.server_cpu,
                                    tolerance=a.tolerance, threads=a.threads, pin=not a.no_pin)
            return peer.run(a.out, a.servers, opts)
        if a.cmd == "sweep":
            try:
                params = [parse_param(p, a.target) for p in a.param]
                grid(params)
            except ValueError as e:
                ap.error(str(e))
            with needed_for(a.cmd, ray=a.executor == "ray"):
                from . import stats, sweep
            if a.target == "cosim":
                return sweep.run_cosim(a.out, params, a.executor, a.jobs, a.ray_address)
            return sweep.run(a.out, params, a.server, _demo_options(a, 100), a.executor, a.jobs,
                             a.ray_address, boot=_boot(a, stats.DEFAULT_BOOT))
        if a.cmd == "report":
            with needed_for(a.cmd):
                from . import affinity, labreport, stats, sweep, table1
            boot = a.bootstrap if a.bootstrap is not None else stats.DEFAULT_BOOT
            if affinity.is_affinity_dir(a.out):  # its raw/ is not Table 1's
                return affinity.rerender(a.out / "raw", a.out)
            if (a.out / "raw").is_dir():
                table1.analyze(a.out, boot)
            sweep.reanalyze(a.out, boot)
            labreport.publish(a.out)
            return 0
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
