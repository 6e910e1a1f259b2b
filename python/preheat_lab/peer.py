"""Peer check: is our load generator's warm latency and throughput what an established client
measures on the same server at the same offered load?

For each server, `preheat serve --server S --cpu <last CPU> --json` starts it pinned, with its
data set (no agent), and prints one ready line `{"server","port","pid","protocol","key"}`. Then,
closed loop with the same number of client threads AND connections on both sides, both clients
pinned the same way (`taskset -c <the other CPUs>`), so neither side gets a CPU the other lacks:

* ours, the main row: `preheat load --mode closed --connections C --threads T --duration-s S
  --wait epoll ...`: T event-loop threads that wait for readiness in `epoll_wait` and then read,
  the waiting mechanism the peers use, for any C (one connection on one thread included; the
  run's JSON must say `client_loop: event-loop`, or the run counts as failed);
* ours, extra rows, labeled as such: `--wait block` (with T == C one thread per connection
  blocking in `read` on its socket, no epoll; with T < C the same event loop as epoll) and
  `--wait spin` (busy-polling: no client wakeup in the latency);
* the peer: memcaslap `-T T -c C` (memcached), redis-benchmark (redis; single-threaded, so ours
  runs `--threads 1` there), wrk `-t T -c C` (nginx).

The pinning is recorded in peer.json (`notes[server].pinning`) and in the report text.

The report puts both side by side (throughput, mean latency, p50/p99 where the peer prints them)
with the ratio ours/peer and whether it is within 5%, for every row of ours (comparison rows carry
`wait`, `extra` and `kind`). The verdict is computed from the main (epoll) row only, never
assumed: it can say "differs". Every raw output is kept in DIR/peer/raw/ for audit.

The parts: `peer_parsers` (the outputs), `peer_compare` (measurements and the verdict),
`peer_clients` (the server and both clients); this module runs the check and keeps the parts'
public names importable as `peer.NAME`.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from . import atomic, labreport, proc
from .peer_clients import (
    EXPLAIN,
    EXTRA_WAITS,
    MAIN_WAIT,
    PARSERS,
    PEER_SERVERS,
    PEER_TOOLS,
    Served,
    ServeError,
    client_label,
    cpu_plan,
    ours_command,
    peer_command,
    peer_threads,
    peer_tool,
    pinned,
    row_kind,
    run_ours,
    run_peer,
    value_length,
)
from .peer_compare import TOLERANCE, Measurement, compare, ratio, verdict
from .peer_parsers import (
    PeerParseError,
    parse_memcaslap,
    parse_ours,
    parse_redis_benchmark,
    parse_wrk,
)
from .progress import Progress

__all__ = [
    "EXPLAIN", "EXTRA_WAITS", "MAIN_WAIT", "PARSERS", "PEER_SERVERS", "PEER_TOOLS", "TOLERANCE",
    "Measurement", "PeerOptions", "PeerParseError", "ServeError", "Served", "client_label",
    "compare", "cpu_plan", "ours_command", "parse_memcaslap", "parse_ours",
    "parse_redis_benchmark", "parse_wrk", "peer_command", "peer_threads", "peer_tool", "pinned",
    "ratio", "row_kind", "run", "run_ours", "run_peer", "value_length", "verdict",
]


@dataclass
class PeerOptions:
    connections: int = 4
    seconds: float = 10.0
    repeats: int = 1
    # None: the last CPU we may use (with ≥ 2 CPUs); the clients get the others.
    server_cpu: int | None = None
    tolerance: float = TOLERANCE
    # Client threads on both sides (redis-benchmark: always 1).
    threads: int = 1
    # Pin the server and both clients (see cpu_plan).
    pin: bool = True


def run(out: Path, servers: Sequence[str], opts: PeerOptions, report: bool = True) -> int:
    out = Path(out)
    pdir = out / "peer"
    raw = pdir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"kind": "peer", "state": "running", "options": asdict(opts), "servers": list(servers),
             "failed": {}, "measurements": [], "comparisons": [], "verdicts": {}, "notes": {},
             "rows": {"main": client_label(MAIN_WAIT),
                      "extra": [client_label(w) for w in EXTRA_WAITS],
                      "order": "per repeat: ours --wait epoll, the peer, "
                               + ", ".join(f"ours --wait {w}" for w in EXTRA_WAITS),
                      "verdict": "from the main row only (throughput and mean within the "
                                 "tolerance)"}}
    code = 0
    proc.reset_interrupt_state()

    def save() -> None:
        atomic.write_json(pdir / "peer.json", state)
        atomic.write_csv(pdir / "peer.csv", pd.DataFrame(state["measurements"]))
        atomic.write_csv(pdir / "comparison.csv", pd.DataFrame(state["comparisons"]))

    with proc.interruptible(), Progress("peer", len(servers)) as prog:
        try:
            for s in servers:
                prog.task(s, (2 + len(EXTRA_WAITS)) * opts.repeats)
                if s not in PEER_TOOLS:
                    state["failed"][s] = f"no established client configured for {s} (peers: {', '.join(PEER_TOOLS)})"
                    code = 1
                    prog.advance("FAILED: " + state["failed"][s])
                    continue
                if not peer_tool(s):
                    state["failed"][s] = f"{PEER_TOOLS[s]} is not installed (Debian: " + \
                        {"memcached": "libmemcached-tools", "redis": "redis-tools", "nginx": "wrk"}[s] + ")"
                    code = 1
                    prog.advance("FAILED: " + state["failed"][s])
                    continue
                try:
                    server_cpu, client_cpus = cpu_plan(opts.server_cpu, opts.pin)
                    threads = min(peer_threads(s, opts.threads), opts.connections)
                    with Served(s, raw, server_cpu) as srv:
                        pinning = (f"server pinned to CPU {server_cpu} (preheat serve --cpu); "
                                   if server_cpu is not None else "server not pinned; ")
                        pinning += (f"both clients pinned to CPU(s) "
                                    f"{','.join(map(str, client_cpus))} (taskset -c)"
                                    if client_cpus and shutil.which("taskset")
                                    else "clients not pinned")
                        state["notes"][s] = {"serve": srv.info, "pinning": pinning,
                                             "server_cpu": server_cpu, "client_cpus": client_cpus,
                                             "threads": threads}
                        done = 0
                        for i in range(opts.repeats):
                            # Order per repeat: ours (main, epoll), the peer, ours (extras).
                            ours = run_ours(srv.info, opts.connections, opts.seconds, MAIN_WAIT,
                                            raw, f"{s}-ours-{MAIN_WAIT}-{i + 1}", threads,
                                            client_cpus)
                            done += 1
                            prog.update(done)
                            peer = run_peer(s, srv.info, opts.connections, opts.seconds, raw,
                                            f"{s}-peer-{i + 1}", ours.throughput_rps, threads,
                                            client_cpus)
                            done += 1
                            prog.update(done)
                            extras = []
                            for w in EXTRA_WAITS:
                                extras.append(run_ours(srv.info, opts.connections, opts.seconds, w,
                                                       raw, f"{s}-ours-{w}-{i + 1}", threads,
                                                       client_cpus))
                                done += 1
                                prog.update(done)
                            for m in (ours, peer, *extras):
                                row = {"server": s, "repeat": i + 1, **m.to_dict(),
                                       "littles_law_rps": (m.connections * 1e6 / m.mean_us
                                                           if m.mean_us else None)}
                                state["measurements"].append(row)
                            for m in (ours, *extras):
                                state["comparisons"] += [
                                    dict(r, repeat=i + 1, extra=m.wait != MAIN_WAIT,
                                         wait=m.wait, kind=row_kind(m.wait))
                                    for r in compare(s, m, peer, opts.tolerance)]
                            state["notes"][s]["peer"] = (
                                f"{peer.note}. Ours: --threads {threads} --connections "
                                f"{opts.connections}; main row --wait epoll (epoll_wait then "
                                f"read, the peers' mechanism; client_loop {ours.client_loop}), "
                                f"extra rows --wait block and --wait spin. Pinning: {pinning}. "
                                + EXPLAIN.get(s, ""))
                            save()
                    main = [r for r in state["comparisons"] if r["server"] == s and not r["extra"]]
                    state["verdicts"][s] = verdict(main)
                    prog.advance(state["verdicts"][s])
                except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
                    raise
                except (ServeError, RuntimeError, PeerParseError, proc.ChildTimeout, OSError) as e:
                    state["failed"][s] = str(e)
                    code = 1
                    prog.advance(f"FAILED: {e}")
                save()
            state["state"] = "complete"
        except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
            code = proc.mark_interrupted(state)
            prog.log(f"peer: interrupted by {proc.interrupted_by()}; servers stopped, writing "
                     "what was measured")
    save()
    for s, why in state["failed"].items():
        print(f"peer: {s} FAILED: {why}")
    for s, v in state["verdicts"].items():
        print(f"peer: {s}: {v}")
    if report:
        labreport.publish(out)
    return code
