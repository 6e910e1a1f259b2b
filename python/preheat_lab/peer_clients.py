"""The two sides of a peer check on one server: the server (`preheat serve`), our closed-loop
client (`preheat load --wait ...`) and the peer client, each with its command line, pinning and
the parse of its output into a `Measurement`."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from . import atomic, cli, proc
from .peer_compare import Measurement
from .peer_parsers import parse_memcaslap, parse_ours, parse_redis_benchmark, parse_wrk


class ServeError(RuntimeError):
    pass


class Served:
    """`preheat serve --server S --json` in its own process group until `stop()`."""

    def __init__(self, server: str, raw: Path, cpu: int | None = None, timeout: float = 120.0):
        self.server = server
        cmd = [cli.preheat_bin(), "serve", "--server", server, "--json"]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        self.cmd = cmd
        self.stderr_path = raw / f"{server}-serve.stderr.txt"
        self.stdout_path = raw / f"{server}-serve.stdout.txt"
        self._err = open(self.stderr_path, "wb")
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        assert self.p.stdout is not None  # stdout=PIPE
        self._stdout = self.p.stdout
        self.info = self._ready(timeout)
        self._drain = threading.Thread(target=self._copy_rest, daemon=True)
        self._drain.start()

    def _ready(self, timeout: float) -> dict:
        box: dict = {}

        def read() -> None:
            box["line"] = self._stdout.readline()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        try:
            while t.is_alive() and time.monotonic() < deadline:
                t.join(0.2)
        except BaseException:
            self.stop()
            raise
        line = box.get("line", b"")
        if not line:
            alive = self.p.poll() is None
            self.stop()
            err = self.stderr_path.read_text(errors="replace")
            why = f"no ready line within {timeout:.0f} s" if alive else cli.failure_reason(err, self.p.returncode)
            raise ServeError(f"preheat serve --server {self.server}: {why}")
        try:
            info = json.loads(line)
        except ValueError as e:
            self.stop()
            raise ServeError(f"preheat serve --server {self.server}: ready line is not JSON: "
                             f"{line[:200]!r}") from e
        atomic.write_bytes(self.stdout_path, line)
        return info

    def _copy_rest(self) -> None:
        try:
            with open(self.stdout_path, "ab") as f:
                for chunk in iter(lambda: self._stdout.read(4096), b""):
                    f.write(chunk)
        except (OSError, ValueError):
            pass

    @property
    def port(self) -> int:
        return int(self.info["port"])

    def stop(self) -> None:
        proc.terminate_group(self.p)
        try:
            self._err.close()
        except OSError:
            pass

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def value_length(protocol: str, port: int, key: str, timeout: float = 5.0) -> int | None:
    """The length of KEY's value on a memcached/redis server (so the peer uses the same value
    size); None when it cannot be read."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            if protocol == "memcached":
                s.sendall(f"get {key}\r\n".encode())
                buf = b""
                while b"END\r\n" not in buf and len(buf) < 4 << 20:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                m = re.match(rb"VALUE \S+ \d+ (\d+)", buf)
                return int(m.group(1)) if m else None
            if protocol == "redis":
                k = key.encode()
                s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
                m = re.match(rb"\$(-?\d+)\r\n", s.recv(65536))
                return int(m.group(1)) if m and int(m.group(1)) >= 0 else None
    except OSError:
        return None
    return None


#: The servers of the peer check and the established client each is measured with.
PEER_SERVERS = ["memcached", "redis", "nginx"]
PEER_TOOLS = {"memcached": "memcaslap", "redis": "redis-benchmark", "nginx": "wrk"}


def peer_tool(server: str) -> str | None:
    return shutil.which(PEER_TOOLS.get(server, "")) if server in PEER_TOOLS else None


def peer_threads(server: str, threads: int) -> int:
    """Client threads on both sides for SERVER: redis-benchmark runs one event-loop thread."""
    return 1 if server == "redis" else max(1, threads)


def cpu_plan(server_cpu: int | None, pin: bool = True) -> tuple[int | None, list[int] | None]:
    """(server CPU, client CPUs): by default the server on the last CPU we may use and both
    clients on all the others; None/None when there is only one CPU or pinning is off."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    if not pin:
        return server_cpu, None
    if server_cpu is None:
        if len(cpus) < 2:
            return None, None
        server_cpu = cpus[-1]
    clients = [c for c in cpus if c != server_cpu]
    return server_cpu, (clients or None)


def pinned(cmd: list[str], cpus: list[int] | None) -> list[str]:
    """CMD under `taskset -c CPUS` (unchanged without CPUs or without taskset)."""
    ts = shutil.which("taskset")
    if not cpus or not ts:
        return list(cmd)
    return [ts, "-c", ",".join(str(c) for c in cpus)] + list(cmd)


def peer_command(server: str, info: dict, connections: int, seconds: float, workdir: Path,
                 ours_rps: float | None, value_len: int | None,
                 threads: int = 1) -> tuple[list[str], str]:
    """The peer's command line and a note on how it matches ours."""
    if server not in PEER_TOOLS:
        raise ValueError(f"no peer client for {server} (peers: {', '.join(PEER_TOOLS)})")
    tool = peer_tool(server)
    if tool is None:
        raise RuntimeError(f"{PEER_TOOLS[server]} is not installed")
    threads = peer_threads(server, threads)
    port, key = int(info["port"]), str(info.get("key", ""))
    secs = max(1, int(round(seconds)))
    if server == "memcached":
        vlen = value_len or 64
        cfg = workdir / "memcaslap-get.cfg"
        # memaslap's configuration format: key and value size ranges, then the command mix.
        atomic.write_text(cfg, f"key\n16 16 1\nvalue\n{vlen} {vlen} 1\ncmd\n0 0.0\n1 1.0\n")
        cmd = [tool, "-s", f"127.0.0.1:{port}", "-T", str(threads), "-c",
               str(connections), "-t", f"{secs}s", "-S", f"{secs}s", "-F", str(cfg)]
        note = (f"memcaslap: GET only, {threads} thread(s), {connections} connections, closed loop; its own "
                f"16-byte keys (set during its warm-up, excluded from its Get statistics), "
                f"value {vlen} B" + (" (= ours)" if value_len else " (ours unknown: 64 B)"))
        return cmd, note
    if server == "redis":
        n = max(1000, int(round((ours_rps or 20000) * seconds)))
        cmd = [tool, "-h", "127.0.0.1", "-p", str(port), "-c", str(connections),
               "-n", str(n), "--csv", "GET", key]
        note = (f"redis-benchmark: GET {key} (the same key), {connections} connections, 1 thread, "
                f"closed loop, {n} requests (≈ our throughput × {seconds:g} s: it has no duration "
                "option)")
        return cmd, note
    if server == "nginx":
        path = key if key.startswith("/") else "/" + key
        cmd = [tool, "-t", str(threads), "-c", str(connections), "-d", f"{secs}s",
               "--latency", f"http://127.0.0.1:{port}{path}"]
        note = (f"wrk: GET {path} (the same path), {threads} thread(s), {connections} connections, "
                "closed loop")
        return cmd, note
    raise ValueError(f"no peer client for {server} (peers: {', '.join(PEER_TOOLS)})")


# What each peer's numbers mean, next to ours (see the module docstring); appended to the
# report's note for the server. Ours: throughput = measured replies / (first intended send →
# last reply); latency = whole reply read − intended send, per request, HdrHistogram (ns).
EXPLAIN = {
    "memcached": "memcaslap's Avg is printed in whole µs, and its TPS is the last 'Global' row "
                 "of its Get table (gets only; its own warm-up sets are excluded).",
    "redis": "redis-benchmark prints latencies in ms with 3 decimals (1 µs steps) and has no "
             "duration option (it runs ours' throughput × seconds requests). Check Little's law "
             "in the table (littles_law_rps = connections / mean): where its rps is well below "
             "it, part of each connection's cycle is client time outside its latency window, "
             "so its rps and its latency do not describe the same requests.",
    "nginx": "wrk's Latency Avg / Stdev / distribution are NOT per-request means: before "
             "printing, wrk 4 runs stats_correct(latency, runtime / (requests / connections)), "
             "which adds synthetic samples L-i, L-2i, ... for every recorded latency L above that "
             "interval i (a coordinated-omission correction for closed loops). After any stall "
             "its mean and p90/p99 are therefore far above the real requests' (Little's law "
             "breaks: connections / wrk mean is far below its Requests/sec), while p50 barely "
             "moves. Ours records each real request once; compare throughput and p50 with wrk, "
             "not mean or p99.",
}


PARSERS = {"memcached": parse_memcaslap, "redis": parse_redis_benchmark, "nginx": parse_wrk}


def ours_command(info: dict, connections: int, seconds: float, wait: str,
                 threads: int | None = None, cpus: list[int] | None = None) -> list[str]:
    """Our closed-loop command line with --wait WAIT (epoll | block | spin) and THREADS client
    threads (None: one per connection)."""
    cmd = [cli.preheat_bin(), "load", "--mode", "closed", "--connections", str(connections),
           "--duration-s", f"{seconds:g}", "--wait", wait, "--json",
           "--protocol", str(info.get("protocol", "memcached")),
           "--target", f"127.0.0.1:{int(info['port'])}", "--key", str(info.get("key", ""))]
    if threads is not None:
        cmd += ["--threads", str(min(max(1, threads), connections))]
    return pinned(cmd, cpus)


def run_ours(info: dict, connections: int, seconds: float, wait: str, raw: Path, tag: str,
             threads: int | None = None, cpus: list[int] | None = None) -> Measurement:
    out = raw / f"{tag}.json"
    cmd = ours_command(info, connections, seconds, wait, threads, cpus)
    atomic.write_text(raw / f"{tag}.cmd.txt", " ".join(cmd) + "\n")
    rc = proc.run_child(cmd, out, raw / f"{tag}.stderr.txt", timeout=seconds * 3 + 60)
    if rc != 0:
        raise RuntimeError(f"preheat load --wait {wait}: "
                           + cli.failure_reason((raw / f"{tag}.stderr.txt").read_text(errors="replace"), rc))
    try:
        d = parse_ours(json.loads(out.read_text()))
    except ValueError as e:
        raise RuntimeError(f"preheat load --wait {wait}: {e}") from e
    if wait == "epoll" and d.get("client_loop") != "event-loop":
        # The main row must wait in epoll_wait like the peers; anything else is not comparable.
        raise RuntimeError(f"preheat load --wait epoll ran the {d.get('client_loop') or 'unknown'} "
                           "loop, not the event loop (is this preheat build older than --wait "
                           "epoll?)")
    return Measurement(client=client_label(wait), side="ours", connections=connections,
                       threads=d.get("threads"), duration_s=d.get("duration_s"), **_measured(d),
                       raw=out.name, wait=wait, client_loop=d.get("client_loop"))


_MEASURED = ("requests", "throughput_rps", "mean_us", "p50_us", "p90_us", "p99_us", "max_us",
             "errors")


def _measured(d: dict) -> dict:
    """The Measurement fields a parsed output gives the same way for ours and the peer."""
    return {k: d.get(k) for k in _MEASURED}


# Our rows per repeat: the main one first (compared for the verdict), then the extras.
MAIN_WAIT = "epoll"
EXTRA_WAITS = ("block", "spin")


def client_label(wait: str) -> str:
    return f"preheat load --wait {wait}"


def row_kind(wait: str | None) -> str:
    """How a comparison row is labeled in peer.json / comparison.csv."""
    if wait == MAIN_WAIT:
        return "main (epoll: epoll_wait then read, like the peer)"
    if wait == "block":
        return "extra (block: blocking read per connection thread; epoll_wait when threads < connections)"
    return "extra (spin: busy-poll, no client wakeup)"


def run_peer(server: str, info: dict, connections: int, seconds: float, raw: Path, tag: str,
             ours_rps: float | None, threads: int = 1,
             cpus: list[int] | None = None) -> Measurement:
    tool = peer_tool(server)
    if not tool:
        raise RuntimeError(f"{PEER_TOOLS.get(server, '?')} is not installed")
    vlen = value_length(str(info.get("protocol")), int(info["port"]), str(info.get("key", "")))
    cmd, note = peer_command(server, info, connections, seconds, raw, ours_rps, vlen, threads)
    cmd = pinned(cmd, cpus)
    out = raw / f"{tag}.txt"
    rc = proc.run_child(cmd, out, raw / f"{tag}.stderr.txt",
                        timeout=seconds * 4 + 60)
    text = out.read_text(errors="replace")
    atomic.write_text(raw / f"{tag}.cmd.txt", " ".join(cmd) + "\n")
    if rc != 0:
        err = (raw / f"{tag}.stderr.txt").read_text(errors="replace").strip()
        raise RuntimeError(f"{Path(tool).name} exited {rc}: {(err or text)[-400:]}")
    d = PARSERS[server](text)
    return Measurement(client=Path(tool).name, side="peer", connections=connections,
                       threads=d.get("threads", peer_threads(server, threads)),
                       duration_s=d.get("duration_s", seconds), **_measured(d),
                       note=note, raw=out.name)
