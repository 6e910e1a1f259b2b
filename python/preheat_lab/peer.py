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
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import pandas as pd

from . import atomic, cli, proc
from .progress import Progress

PEER_SERVERS = ["memcached", "redis", "nginx"]
TOLERANCE = 0.05


class PeerParseError(ValueError):
    """The peer's output did not contain what we need (the message says what was missing)."""


@dataclass
class Measurement:
    """One client's run against one server."""

    client: str  # e.g. "preheat load --wait epoll", "memcaslap"
    side: str  # ours | peer
    connections: int
    threads: Optional[int] = None
    duration_s: Optional[float] = None
    requests: Optional[float] = None
    throughput_rps: Optional[float] = None
    mean_us: Optional[float] = None
    p50_us: Optional[float] = None
    p90_us: Optional[float] = None
    p99_us: Optional[float] = None
    max_us: Optional[float] = None
    errors: Optional[float] = None
    note: str = ""
    raw: str = ""  # file name of the raw output (DIR/peer/raw/)
    wait: Optional[str] = None  # ours: --wait
    client_loop: Optional[str] = None  # ours: the loop that ran (event-loop | thread-per-connection)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Parsers (pure: tested on outputs captured from real runs, tests/fixtures/peer/)

_UNIT_US = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "g": 1e9, "G": 1e9}


def _wrk_time_us(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(us|µs|ms|s|m|h)\s*", text)
    if not m:
        raise PeerParseError(f"wrk: cannot read the time {text!r}")
    return float(m.group(1)) * _UNIT_US[m.group(2)]


def _si(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise PeerParseError(f"cannot read the number {text!r}")
    return float(m.group(1)) * _SI[m.group(2)]


def parse_wrk(text: str) -> dict:
    """wrk 4.x with --latency: Requests/sec, Thread Stats Latency Avg/Max, the 50/75/90/99%
    distribution, requests in T s, Non-2xx and socket errors."""
    out: dict = {}
    m = re.search(r"^\s*Requests/sec:\s*([0-9.]+)", text, re.M)
    if not m:
        raise PeerParseError("wrk: no 'Requests/sec:' line (did the run fail?)")
    out["throughput_rps"] = float(m.group(1))
    m = re.search(r"^\s*Latency\s+([0-9.]+\s*\S+)\s+([0-9.]+\s*\S+)\s+([0-9.]+\s*\S+)", text, re.M)
    if not m:
        raise PeerParseError("wrk: no 'Latency avg stdev max' line")
    out["mean_us"] = _wrk_time_us(m.group(1))
    out["stdev_us"] = _wrk_time_us(m.group(2))
    out["max_us"] = _wrk_time_us(m.group(3))
    for pct, key in (("50", "p50_us"), ("75", "p75_us"), ("90", "p90_us"), ("99", "p99_us")):
        m = re.search(rf"^\s*{pct}%\s+([0-9.]+\s*\S+)\s*$", text, re.M)
        if m:
            out[key] = _wrk_time_us(m.group(1))
    m = re.search(r"^\s*(\d+) requests in ([0-9.]+\s*\S+),", text, re.M)
    if m:
        out["requests"] = int(m.group(1))
        out["duration_s"] = _wrk_time_us(m.group(2)) / 1e6
    m = re.search(r"^\s*(\d+) threads and (\d+) connections", text, re.M)
    if m:
        out["threads"], out["connections"] = int(m.group(1)), int(m.group(2))
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if m:
        errors += int(m.group(1))
        out["non_2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        errors += sum(int(g) for g in m.groups())
        out["socket_errors"] = [int(g) for g in m.groups()]
    out["errors"] = errors
    return out


def parse_redis_benchmark(text: str, test: str = "GET") -> dict:
    """redis-benchmark 6/7: the --csv line ("test","rps","avg_latency_ms",...,"p50","p95",
    "p99","max"), else the text summary ("throughput summary: X requests per second" and the
    "latency summary (msec)" table). Latencies are converted to µs."""
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    header = None
    for ln in lines:
        cells = [c.strip().strip('"') for c in ln.split(",")]
        if cells and cells[0] == "test" and "rps" in cells:
            header = cells
            continue
        if header and len(cells) == len(header) and cells[0].upper().startswith(test.upper()):
            row = dict(zip(header, cells))
            out = {"test": row["test"], "throughput_rps": float(row["rps"])}
            for k, v in row.items():
                m = re.fullmatch(r"(avg|min|max|p\d+)_latency_ms", k)
                if m:
                    name = "mean_us" if m.group(1) == "avg" else f"{m.group(1)}_us"
                    out[name] = float(v) * 1e3
            return out
    m = re.search(r"throughput summary:\s*([0-9.]+)\s*requests per second", text)
    if m:
        out = {"throughput_rps": float(m.group(1))}
        m2 = re.search(r"latency summary \(msec\):\s*\n\s*(.+)\n\s*(.+)", text.replace("\r", "\n"))
        if m2:
            names, vals = m2.group(1).split(), m2.group(2).split()
            for n, v in zip(names, vals):
                out["mean_us" if n == "avg" else f"{n}_us"] = float(v) * 1e3
        return out
    raise PeerParseError("redis-benchmark: neither a CSV result line nor a throughput summary "
                         "(did it connect?)")


def parse_memcaslap(text: str) -> dict:
    """memcaslap (libmemcached's memaslap 1.0) run with -S: the final "Get Statistics (N events)"
    block (Min/Max/Avg/Std in µs), the last "Global" row of the periodic Get table (TPS), and
    cmd_get / get_misses / "Run time". Without -S only the totals exist (no latency)."""
    out: dict = {}
    blocks = re.findall(r"Get Statistics \((\d+) events\)(.*?)(?:\n\s*\n|\Z)", text, re.S)
    if blocks:
        n, body = blocks[-1]
        out["requests"] = int(n)
        for key, name in (("Min", "min_us"), ("Max", "max_us"), ("Avg", "mean_us"),
                          ("Geo", "geo_us"), ("Std", "stdev_us")):
            m = re.search(rf"^\s*{key}:\s*([0-9.]+)", body, re.M)
            if m:
                out[name] = float(m.group(1))
    # Periodic tables: "Get Statistics" header line, column names, then Period / Global rows.
    tps = None
    for m in re.finditer(r"Get Statistics\s*\n\s*Type[^\n]*\n(?:\s*Period[^\n]*\n)?\s*Global\s+([^\n]+)", text):
        cols = m.group(1).split()
        if len(cols) >= 3:
            tps = float(cols[2])
            out["global_time_s"] = float(cols[0])
    m_get = re.search(r"^cmd_get:\s*(\d+)", text, re.M)
    m_miss = re.search(r"^get_misses:\s*(\d+)", text, re.M)
    m_run = re.search(r"Run time:\s*([0-9.]+)s\s+Ops:\s*(\d+)\s+TPS:\s*(\d+)", text)
    if m_get:
        out["cmd_get"] = int(m_get.group(1))
    if m_miss:
        out["errors"] = int(m_miss.group(1))
        out["get_misses"] = int(m_miss.group(1))
    if m_run:
        out["duration_s"] = float(m_run.group(1))
        out["ops_total"] = int(m_run.group(2))
    if tps is not None:
        out["throughput_rps"] = tps
    elif m_get and m_run and float(m_run.group(1)) > 0:
        # cmd_get excludes the warm-up sets (those are cmd_set), unlike the final TPS.
        out["throughput_rps"] = int(m_get.group(1)) / float(m_run.group(1))
    if "throughput_rps" not in out:
        raise PeerParseError("memcaslap: no Get statistics and no cmd_get/Run time totals "
                             "(did it connect?)")
    return out


def parse_ours(data: dict) -> dict:
    keep = ("connections", "requests", "errors", "wrong", "duration_s", "throughput_rps",
            "offered_rps", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us",
            "threads", "label", "mode", "wait", "client_loop")
    out = {k: data.get(k) for k in keep if k in data}
    if out.get("throughput_rps") is None:
        raise PeerParseError("preheat load: no throughput_rps in its JSON")
    out["errors"] = (data.get("errors") or 0) + (data.get("wrong") or 0)
    return out


# ---------------------------------------------------------------------------------------------
# Comparison


def ratio(ours: Optional[float], peer: Optional[float]) -> Optional[float]:
    if ours is None or peer is None:
        return None
    try:
        if not (math.isfinite(ours) and math.isfinite(peer)) or peer == 0:
            return None
    except TypeError:
        return None
    return ours / peer


def compare(server: str, ours: Measurement, peer: Measurement,
            tolerance: float = TOLERANCE) -> List[dict]:
    """One row per metric both sides measured: ours, peer, ratio, within ±tolerance."""
    rows = []
    for metric in ("throughput_rps", "mean_us", "p50_us", "p99_us"):
        a, b = getattr(ours, metric), getattr(peer, metric)
        r = ratio(a, b)
        if r is None:
            continue
        within = abs(r - 1.0) <= tolerance + 1e-12  # 105/100 is within 5% despite rounding
        rows.append({"server": server, "ours": ours.client, "peer": peer.client,
                     "metric": metric, "ours_value": a, "peer_value": b, "ratio": r,
                     "within": within, "tolerance": tolerance,
                     "verdict": (f"within {tolerance:.0%}" if within
                                 else f"differs by {r - 1.0:+.1%}")})
    return rows


def verdict(rows: List[dict]) -> str:
    if not rows:
        return "no comparable metric"
    core = [r for r in rows if r["metric"] in ("throughput_rps", "mean_us")]
    if core and all(r["within"] for r in core):
        return "agree (throughput and mean within 5%)"
    bad = ", ".join(f"{r['metric']} {r['ratio']:.2f}×" for r in core if not r["within"])
    return f"differ ({bad})" if bad else "no throughput/mean to compare"


# ---------------------------------------------------------------------------------------------
# Running


class ServeError(RuntimeError):
    pass


class Served:
    """`preheat serve --server S --json` in its own process group until `stop()`."""

    def __init__(self, server: str, raw: Path, cpu: Optional[int] = None, timeout: float = 120.0):
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
        self.info = self._ready(timeout)
        self._drain = threading.Thread(target=self._copy_rest, daemon=True)
        self._drain.start()

    def _ready(self, timeout: float) -> dict:
        box: dict = {}

        def read():
            box["line"] = self.p.stdout.readline()

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
            why = ("no ready line within %.0f s" % timeout) if alive else cli.failure_reason(err, self.p.returncode)
            raise ServeError(f"preheat serve --server {self.server}: {why}")
        try:
            info = json.loads(line)
        except ValueError:
            self.stop()
            raise ServeError(f"preheat serve --server {self.server}: ready line is not JSON: {line[:200]!r}")
        atomic.write_bytes(self.stdout_path, line)
        return info

    def _copy_rest(self):
        try:
            with open(self.stdout_path, "ab") as f:
                for chunk in iter(lambda: self.p.stdout.read(4096), b""):
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def value_length(protocol: str, port: int, key: str, timeout: float = 5.0) -> Optional[int]:
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


PEER_TOOLS = {"memcached": "memcaslap", "redis": "redis-benchmark", "nginx": "wrk"}


def peer_tool(server: str) -> Optional[str]:
    return shutil.which(PEER_TOOLS.get(server, "")) if server in PEER_TOOLS else None


def peer_threads(server: str, threads: int) -> int:
    """Client threads on both sides for SERVER: redis-benchmark runs one event-loop thread."""
    return 1 if server == "redis" else max(1, threads)


def cpu_plan(server_cpu: Optional[int], pin: bool = True) -> (Optional[int], Optional[List[int]]):
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


def pinned(cmd: List[str], cpus: Optional[List[int]]) -> List[str]:
    """CMD under `taskset -c CPUS` (unchanged without CPUs or without taskset)."""
    ts = shutil.which("taskset")
    if not cpus or not ts:
        return list(cmd)
    return [ts, "-c", ",".join(str(c) for c in cpus)] + list(cmd)


def peer_command(server: str, info: dict, connections: int, seconds: float, workdir: Path,
                 ours_rps: Optional[float], value_len: Optional[int],
                 threads: int = 1) -> (List[str], str):
    """The peer's command line and a note on how it matches ours."""
    threads = peer_threads(server, threads)
    port, key = int(info["port"]), str(info.get("key", ""))
    secs = max(1, int(round(seconds)))
    if server == "memcached":
        vlen = value_len or 64
        cfg = workdir / "memcaslap-get.cfg"
        # memaslap's configuration format: key and value size ranges, then the command mix.
        atomic.write_text(cfg, f"key\n16 16 1\nvalue\n{vlen} {vlen} 1\ncmd\n0 0.0\n1 1.0\n")
        cmd = [peer_tool(server), "-s", f"127.0.0.1:{port}", "-T", str(threads), "-c",
               str(connections), "-t", f"{secs}s", "-S", f"{secs}s", "-F", str(cfg)]
        note = (f"memcaslap: GET only, {threads} thread(s), {connections} connections, closed loop; its own "
                f"16-byte keys (set during its warm-up, excluded from its Get statistics), "
                f"value {vlen} B" + (" (= ours)" if value_len else " (ours unknown: 64 B)"))
        return cmd, note
    if server == "redis":
        n = max(1000, int(round((ours_rps or 20000) * seconds)))
        cmd = [peer_tool(server), "-h", "127.0.0.1", "-p", str(port), "-c", str(connections),
               "-n", str(n), "--csv", "GET", key]
        note = (f"redis-benchmark: GET {key} (the same key), {connections} connections, 1 thread, "
                f"closed loop, {n} requests (≈ our throughput × {seconds:g} s: it has no duration "
                "option)")
        return cmd, note
    if server == "nginx":
        path = key if key.startswith("/") else "/" + key
        cmd = [peer_tool(server), "-t", str(threads), "-c", str(connections), "-d", f"{secs}s",
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
                 threads: Optional[int] = None, cpus: Optional[List[int]] = None) -> List[str]:
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
             threads: Optional[int] = None, cpus: Optional[List[int]] = None) -> Measurement:
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
        raise RuntimeError(f"preheat load --wait {wait}: {e}")
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


def row_kind(wait: str) -> str:
    """How a comparison row is labeled in peer.json / comparison.csv."""
    if wait == MAIN_WAIT:
        return "main (epoll: epoll_wait then read, like the peer)"
    if wait == "block":
        return "extra (block: blocking read per connection thread; epoll_wait when threads < connections)"
    return "extra (spin: busy-poll, no client wakeup)"


def run_peer(server: str, info: dict, connections: int, seconds: float, raw: Path, tag: str,
             ours_rps: Optional[float], threads: int = 1,
             cpus: Optional[List[int]] = None) -> Measurement:
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


@dataclass
class PeerOptions:
    connections: int = 4
    seconds: float = 10.0
    repeats: int = 1
    # None: the last CPU we may use (with ≥ 2 CPUs); the clients get the others.
    server_cpu: Optional[int] = None
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
    state = {"kind": "peer", "state": "running", "options": asdict(opts), "servers": list(servers),
             "failed": {}, "measurements": [], "comparisons": [], "verdicts": {}, "notes": {},
             "rows": {"main": client_label(MAIN_WAIT),
                      "extra": [client_label(w) for w in EXTRA_WAITS],
                      "order": "per repeat: ours --wait epoll, the peer, "
                               + ", ".join(f"ours --wait {w}" for w in EXTRA_WAITS),
                      "verdict": "from the main row only (throughput and mean within the "
                                 "tolerance)"}}
    code = 0
    proc.reset_interrupt_state()

    def save():
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
        from . import labreport

        labreport.publish(out)
    return code
