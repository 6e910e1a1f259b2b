"""Running `preheat demo` for one server of Table 1: the servers and modes, its options, its
command line, and one run with its outcome (ok, failed with the reason, interrupted).

Standard library only: the command line's choices come from here, and `--help` runs without
the lab's third-party packages."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import atomic, cli, proc
from .cli import failure_reason
from .progress import Progress

SERVERS = ["kv", "memcached", "nginx", "redis", "mariadb"]
BASE_MODES = ["hot", "warm", "cold-sweep", "cold-idle", "control"]
COLD = "cold-sweep"  # the paper's "cold": caches flushed before the request
WARM = "warm"
#: The physical floor: warm caches and the server's CPU kept out of idle (`preheat demo`'s hot
#: mode). Shares removed are against it when it was measured, else against warm.
HOT = "hot"
CONTROL = "control"
#: `preheat demo --connection-row`'s diagnostic row (a request on the measured connection after
#: going cold, then auto's announcement): not a strategy, compared with `preheat:auto` only.
CONN_PRIMED = "conn-primed"
AUTO = "preheat:auto"

DISPLAY = {"kv": "preheat-kv", "memcached": "memcached", "nginx": "nginx", "redis": "redis",
           "mariadb": "MariaDB"}


@dataclass
class DemoOptions:
    """Knobs passed to `preheat demo` (None: the CLI's default, not passed)."""

    rounds: int = 200
    lead_us: float | None = None
    idle_ms: float | None = None
    sweep_mib: int | None = None
    post_gap_us: float | None = None
    strategies: str | None = None
    samples: int | None = None
    keep: int | None = None
    gap_merge: int | None = None
    server_cpu: int | None = None
    timeout_s: float | None = None
    #: `--syscall-stages`: split each response at the server's system calls (root).
    syscall_stages: bool = False
    #: `--connection-row`: the diagnostic row of what the request's connection costs.
    connection_row: bool = False

    FLAGS = {"lead_us": "--lead-us", "idle_ms": "--idle-ms", "sweep_mib": "--sweep-mib",
             "post_gap_us": "--post-gap-us", "strategies": "--strategies",
             "samples": "--samples", "keep": "--keep", "gap_merge": "--gap-merge",
             "server_cpu": "--server-cpu"}

    def args(self) -> list[str]:
        a = ["--rounds", str(self.rounds)]
        for name, flag in self.FLAGS.items():
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            a += [flag, str(v)]
        if self.syscall_stages:
            a.append("--syscall-stages")
        if self.connection_row:
            a.append("--connection-row")
        return a

    def timeout(self) -> float:
        if self.timeout_s:
            return self.timeout_s
        # Recording + start-up, then rounds × modes with idle gaps and sweeps; MariaDB's
        # requests take milliseconds. Generous: a hung server is the only thing it catches.
        return 300.0 + self.rounds * 3.0

    def modes_per_round(self) -> int:
        strategies = self.strategies or "wake,lines,replay,wake+lines,all"
        return (len(BASE_MODES) + len([s for s in strategies.split(",") if s])
                + int(self.connection_row))


@dataclass
class CustomServer:
    """Any server given by its command, as `preheat demo --port P --protocol X --request R --
    CMD` takes it; `name` labels its rows (default: the command's program name)."""

    command: list[str]
    port: int
    request: str
    protocol: str = "http"
    name: str = ""

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("a custom server needs its command")
        if not self.name:
            self.name = Path(self.command[0]).name

    def demo_args(self) -> list[str]:
        return ["--port", str(self.port), "--protocol", self.protocol, "--request", self.request]


def demo_argv(binary: str, server: str, args: Sequence[str], out_json: Path,
              records: Path | None, custom: CustomServer | None = None) -> list[str]:
    """`BINARY demo --server S ARGS --json --out OUT_JSON [--records RECORDS]`; for a custom
    server `BINARY demo --port P --protocol X --request R ARGS ... -- CMD`."""
    which = custom.demo_args() if custom else ["--server", server]
    cmd = [binary, "demo", *which, *args, "--json", "--out", str(out_json)]
    if records is not None:
        cmd += ["--records", str(records)]
    if custom:
        cmd += ["--", *custom.command]
    return cmd


def demo_command(server: str, opts: DemoOptions, out_json: Path, records: Path | None,
                 custom: CustomServer | None = None) -> list[str]:
    return demo_argv(cli.preheat_bin(), server, opts.args(), out_json, records, custom)


def check_flags(opts: DemoOptions) -> list[str]:
    """Options this CLI's `demo` does not know (e.g. an older build without --gap-merge)."""
    missing = []
    for name, flag in DemoOptions.FLAGS.items():
        if getattr(opts, name) is not None and not cli.supports("demo", flag):
            missing.append(flag)
    for on, flag in ((opts.syscall_stages, "--syscall-stages"),
                     (opts.connection_row, "--connection-row")):
        if on and not cli.supports("demo", flag):
            missing.append(flag)
    return missing


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


@dataclass
class ServerRun:
    server: str
    status: str  # ok | failed | interrupted | not run
    reason: str = ""
    seconds: float = 0.0
    command: list[str] = field(default_factory=list)


def run_demo(server: str, opts: DemoOptions, raw: Path, prog: Progress | None = None,
             custom: CustomServer | None = None) -> ServerRun:
    """Run one demo (of `custom` when given: `server` is then its name); raises
    `InterruptedRun` (after stopping the child) when interrupted."""
    raw.mkdir(parents=True, exist_ok=True)
    out_json = raw / f"{server}.json"
    records = raw / f"{server}.jsonl" if cli.supports("demo", "--records") else None
    for stale in (out_json, raw / f"{server}.jsonl"):
        if stale.exists():  # --records appends: never mix an earlier run's samples in
            stale.unlink()
    cmd = demo_command(server, opts, out_json, records, custom)
    expected = opts.rounds * opts.modes_per_round()
    if prog:
        prog.task(DISPLAY.get(server, server), expected)
    t0 = time.monotonic()
    run = ServerRun(server, "ok", command=cmd)
    try:
        rc = proc.run_child(cmd, raw / f"{server}.stdout.txt", raw / f"{server}.stderr.txt",
                            timeout=opts.timeout(),
                            on_tick=(lambda: prog.update(count_lines(records))) if prog and records else None)
    except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
        run.status, run.reason = "interrupted", f"interrupted by {proc.interrupted_by()}"
        run.seconds = time.monotonic() - t0
        raise InterruptedRun(run) from None
    except proc.ChildTimeout as e:
        rc, run.status, run.reason = -1, "failed", str(e)
    run.seconds = time.monotonic() - t0
    if run.status == "ok" and rc != 0:
        err = (raw / f"{server}.stderr.txt").read_text(errors="replace")
        run.status, run.reason = "failed", failure_reason(err, rc)
    if run.status == "ok" and not out_json.exists():
        # An older CLI without --out support: the JSON went to stdout.
        try:
            text = (raw / f"{server}.stdout.txt").read_text()
            json.loads(text)
            atomic.write_text(out_json, text)
        except (OSError, ValueError):
            run.status, run.reason = "failed", "the demo printed no JSON"
    return run


class InterruptedRun(Exception):
    """The run of one server was interrupted; `run` says how far it got."""

    def __init__(self, run: ServerRun):
        super().__init__(run.reason)
        self.run = run
