"""Parsers of the peers' outputs (memcaslap, redis-benchmark, wrk) and of our `preheat load
--json`: pure, tested on outputs captured from real runs (tests/fixtures/peer/)."""

from __future__ import annotations

import re


class PeerParseError(ValueError):
    """The peer's output did not contain what we need (the message says what was missing)."""


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
