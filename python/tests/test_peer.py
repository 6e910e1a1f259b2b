"""Peer check: the peers' output parsers on outputs captured from real runs here
(tests/fixtures/peer/), the comparison (it must be able to say "differ"), and a short real run on
memcached (skipped with the reason when memcaslap or `preheat serve` is missing)."""

import json
import shutil
from pathlib import Path

import pytest

from preheat_lab import __main__ as lab
from preheat_lab import cli, peer, peer_clients, peer_parsers
from preheat_lab.skips import needs

FIX = Path(__file__).parent / "fixtures" / "peer"


def _read(name):
    return (FIX / name).read_text()


def test_memcaslap_get_statistics():
    d = peer.parse_memcaslap(_read("memcaslap-get-c4.txt"))
    assert d["throughput_rps"] == 137315  # the last Global row of the Get table
    assert d["mean_us"] == 28 and d["min_us"] == 12 and d["max_us"] == 5614
    assert d["requests"] == 274636 and d["errors"] == 0
    assert d["cmd_get"] == 274640 and d["duration_s"] == 2.0
    d = peer.parse_memcaslap(_read("memcaslap-lab-2s.txt"))  # as the lab runs it (-S = -t)
    assert d["throughput_rps"] == 141282 and d["mean_us"] == 28 and d["requests"] == 282569


def test_memcaslap_without_statistics_uses_get_totals():
    text = "\n".join(ln for ln in _read("memcaslap-get-c4.txt").splitlines()
                     if not ln.startswith(("Get Statistics", "Period", "Global", "Type", "Total")))
    text = text.split("cmd_get:")[0].split("\n\n")[0] + "\ncmd_get: 200000\nget_misses: 3\n" \
        "Run time: 2.0s Ops: 240960 TPS: 120480 Net_rate: 15.2M/s\n"
    d = peer.parse_memcaslap(text)
    assert d["throughput_rps"] == 100000  # gets only: the warm-up sets are not GETs
    assert d["errors"] == 3 and "mean_us" not in d


def test_memcaslap_refused_is_an_error():
    with pytest.raises(peer.PeerParseError, match="did it connect"):
        peer.parse_memcaslap(_read("memcaslap-refused.txt"))


def test_redis_benchmark_csv_and_text():
    d = peer.parse_redis_benchmark(_read("redis-benchmark-csv-c4.txt"))
    assert d["throughput_rps"] == 80321.28
    assert d["mean_us"] == pytest.approx(33.0) and d["p50_us"] == pytest.approx(39.0)
    assert d["p99_us"] == pytest.approx(79.0) and d["max_us"] == pytest.approx(3391.0)
    t = peer.parse_redis_benchmark(_read("redis-benchmark-text-c4.txt"))
    assert t["throughput_rps"] == 82576.38 and t["p99_us"] == pytest.approx(71.0)
    assert t["mean_us"] == pytest.approx(32.0)
    lab_run = peer.parse_redis_benchmark(_read("redis-benchmark-lab.txt"))
    assert lab_run["test"] == "GET key:42" and lab_run["throughput_rps"] == 78484.48
    with pytest.raises(peer.PeerParseError):
        peer.parse_redis_benchmark("Could not connect to Redis at 127.0.0.1:1: Connection refused\n")


def test_wrk_latency_units_and_errors():
    d = peer.parse_wrk(_read("wrk-latency-c4.txt"))
    assert d["throughput_rps"] == 77182.22
    assert d["mean_us"] == pytest.approx(65.02) and d["max_us"] == pytest.approx(5620.0)
    assert d["p50_us"] == 47 and d["p99_us"] == 151
    assert (d["threads"], d["connections"], d["requests"]) == (1, 4, 162070)
    assert d["errors"] == 0
    bad = peer.parse_wrk(_read("wrk-non2xx.txt"))
    assert bad["non_2xx"] == 39168 and bad["errors"] == 39168
    assert peer_parsers._wrk_time_us("1.50s") == 1.5e6 and peer_parsers._wrk_time_us("2.00ms") == 2000
    with pytest.raises(peer.PeerParseError):
        peer.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_ours_json():
    d = peer.parse_ours(json.loads(_read("preheat-load-block.json")))
    assert d["throughput_rps"] > 0 and d["connections"] == 4 and d["errors"] == 0
    assert "client_loop" not in d  # an older build's JSON still parses
    d = peer.parse_ours(json.loads(_read("preheat-load-epoll.json")))
    assert d["wait"] == "epoll" and d["client_loop"] == "event-loop"
    assert d["throughput_rps"] > 0 and d["threads"] == 1 and d["errors"] == 0


def _m(side, tput, mean, p50=None):
    return peer.Measurement(client=side, side=side, connections=4, throughput_rps=tput,
                            mean_us=mean, p50_us=p50)


def test_comparison_can_fail():
    rows = peer.compare("memcached", _m("ours", 100.0, 40.0), _m("peer", 103.0, 41.0))
    assert all(r["within"] for r in rows) and peer.verdict(rows).startswith("agree")
    rows = peer.compare("memcached", _m("ours", 100.0, 40.0), _m("peer", 110.0, 40.5))
    tput = next(r for r in rows if r["metric"] == "throughput_rps")
    assert not tput["within"] and tput["ratio"] == pytest.approx(100 / 110)
    assert peer.verdict(rows).startswith("differ")
    # exactly at the band edge counts as within; a metric only one side has is not compared
    rows = peer.compare("x", _m("ours", 105.0, 40.0, p50=30.0), _m("peer", 100.0, 40.0))
    assert [r["metric"] for r in rows] == ["throughput_rps", "mean_us"]
    assert all(r["within"] for r in rows)
    rows = peer.compare("x", _m("ours", 105.1, 40.0), _m("peer", 100.0, 40.0))
    assert not rows[0]["within"]
    assert peer.verdict([]) == "no comparable metric"


def test_peer_run_on_memcached(tmp_path):
    try:
        cli.preheat_bin()
    except cli.ToolError as e:
        needs("preheat", str(e))
    if not shutil.which("memcaslap"):
        needs("memcaslap", "memcaslap is not installed (Debian: libmemcached-tools)")
    if not cli.help_text("serve"):
        needs("preheat", "this preheat CLI has no `serve` subcommand (rebuild: cargo build --release)")
    if "--connections" not in cli.help_text("load"):
        needs("preheat", "this preheat CLI's load has no --connections (rebuild: cargo build --release)")
    if "--threads" not in cli.help_text("load"):
        needs("preheat", "this preheat CLI's load has no --threads (rebuild: cargo build --release)")
    if "epoll_wait" not in cli.help_text("load"):
        needs("preheat", "this preheat CLI's load has no --wait epoll (rebuild: cargo build --release)")
    out = tmp_path / "lab"
    code = lab.main(["peer", "--out", str(out), "--servers", "memcached", "--seconds", "2"])
    pj = json.loads((out / "peer" / "peer.json").read_text())
    assert pj["failed"] == {}, pj["failed"]
    assert code == 0 and pj["state"] == "complete"
    sides = {m["client"]: m for m in pj["measurements"]}
    assert set(sides) == {"preheat load --wait epoll", "memcaslap", "preheat load --wait block",
                          "preheat load --wait spin"}
    for m in sides.values():
        assert m["throughput_rps"] > 0 and m["mean_us"] > 0
    assert sides["preheat load --wait epoll"]["client_loop"] == "event-loop"
    main = [c for c in pj["comparisons"] if not c["extra"]]
    assert {c["ours"] for c in main} == {"preheat load --wait epoll"}
    assert {"throughput_rps", "mean_us"} <= {c["metric"] for c in main}
    extra = {c["ours"] for c in pj["comparisons"] if c["extra"]}
    assert extra == {"preheat load --wait block", "preheat load --wait spin"}
    for c in pj["comparisons"]:  # the verdict is computed from the ratio, whatever it is
        assert c["within"] == (abs(c["ratio"] - 1) <= 0.05 + 1e-12)
    assert pj["verdicts"]["memcached"].startswith(("agree", "differ"))
    raw = out / "peer" / "raw"
    assert "Get Statistics" in (raw / "memcached-peer-1.txt").read_text()
    for w in ("epoll", "block", "spin"):
        assert (raw / f"memcached-ours-{w}-1.json").exists()
    assert "Peer check" in (out / "report.html").read_text()


def test_same_threads_and_pinning_on_both_sides(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_clients, "peer_tool", lambda s: f"/usr/bin/{peer.PEER_TOOLS[s]}")
    monkeypatch.setattr(peer_clients.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(peer_clients.cli, "preheat_bin", lambda: "preheat")
    info = {"port": 11211, "key": "key:42", "protocol": "memcached"}
    cmd, _ = peer.peer_command("memcached", info, 4, 5, tmp_path, None, 100, threads=2)
    assert cmd[cmd.index("-T") + 1] == "2" and cmd[cmd.index("-c") + 1] == "4"
    cmd, _ = peer.peer_command("nginx", dict(info, key="/index.html"), 4, 5, tmp_path, None,
                               None, threads=2)
    assert cmd[cmd.index("-t") + 1] == "2"
    assert peer.peer_threads("redis", 4) == 1 and peer.peer_threads("nginx", 2) == 2
    ours = peer.ours_command(info, 4, 5, "block", threads=1, cpus=[0])
    assert ours[:3] == ["/usr/bin/taskset", "-c", "0"]
    assert ours[ours.index("--threads") + 1] == "1" and ours[ours.index("--connections") + 1] == "4"
    assert peer.pinned(["wrk"], [0, 1]) == ["/usr/bin/taskset", "-c", "0,1", "wrk"]
    assert peer.pinned(["wrk"], None) == ["wrk"]
    monkeypatch.setattr(peer_clients.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert peer.cpu_plan(None) == (3, [0, 1, 2])
    assert peer.cpu_plan(1) == (1, [0, 2, 3])
    assert peer.cpu_plan(None, pin=False) == (None, None)
    monkeypatch.setattr(peer_clients.os, "sched_getaffinity", lambda pid: {0})
    assert peer.cpu_plan(None) == (None, None)


class _FakeServed:
    def __init__(self, server, raw, cpu=None, timeout=120.0):
        self.info = {"server": server, "port": 1, "key": "key:42", "protocol": "memcached"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _fake_run(monkeypatch, tmp_path, ours_by_wait, peer_m, loop="event-loop"):
    """peer.run with the server and every client replaced by fixed measurements."""
    calls = []

    def run_ours(info, connections, seconds, wait, raw, tag, threads=None, cpus=None):
        calls.append(wait)
        tput, mean = ours_by_wait[wait]
        if wait == "epoll" and loop != "event-loop":
            raise RuntimeError(f"preheat load --wait epoll ran the {loop} loop, not the event loop")
        return peer.Measurement(client=peer.client_label(wait), side="ours",
                                connections=connections, throughput_rps=tput, mean_us=mean,
                                wait=wait, client_loop=loop)

    def run_peer(server, info, connections, seconds, raw, tag, ours_rps, threads=1, cpus=None):
        calls.append("peer")
        return peer.Measurement(client="memcaslap", side="peer", connections=connections,
                                throughput_rps=peer_m[0], mean_us=peer_m[1], note="fake")

    monkeypatch.setattr(peer, "Served", _FakeServed)
    monkeypatch.setattr(peer, "run_ours", run_ours)
    monkeypatch.setattr(peer, "run_peer", run_peer)
    monkeypatch.setattr(peer, "peer_tool", lambda s: "/usr/bin/memcaslap")
    out = tmp_path / "lab"
    code = peer.run(out, ["memcached"], peer.PeerOptions(connections=1, seconds=1, repeats=2),
                    report=False)
    return code, json.loads((out / "peer" / "peer.json").read_text()), calls


def test_main_row_is_epoll_and_decides_the_verdict(tmp_path, monkeypatch):
    # epoll agrees with the peer, block and spin do not: the verdict says agree ...
    code, pj, calls = _fake_run(monkeypatch, tmp_path,
                                {"epoll": (100.0, 10.0), "block": (115.0, 8.7),
                                 "spin": (130.0, 7.7)}, (101.0, 9.9))
    assert code == 0 and calls == ["epoll", "peer", "block", "spin"] * 2
    assert pj["verdicts"]["memcached"].startswith("agree"), pj["verdicts"]
    assert pj["rows"]["main"] == "preheat load --wait epoll"
    main = [c for c in pj["comparisons"] if not c["extra"]]
    assert {c["wait"] for c in main} == {"epoll"} and len(main) == 2 * 2
    assert all(c["kind"].startswith("main (epoll") for c in main)
    extra = [c for c in pj["comparisons"] if c["extra"]]
    assert {c["wait"] for c in extra} == {"block", "spin"}
    assert all(c["kind"].startswith("extra (") for c in extra)
    assert not any(c["within"] for c in extra if c["metric"] == "throughput_rps")
    assert {m["client"] for m in pj["measurements"]} == {
        "preheat load --wait epoll", "memcaslap", "preheat load --wait block",
        "preheat load --wait spin"}


def test_verdict_fails_when_the_epoll_row_differs(tmp_path, monkeypatch):
    # ... and differ when the main row differs, even if an extra row agrees.
    code, pj, _ = _fake_run(monkeypatch, tmp_path,
                            {"epoll": (88.0, 11.4), "block": (100.0, 10.0),
                             "spin": (100.0, 10.0)}, (100.0, 10.0))
    assert code == 0
    v = pj["verdicts"]["memcached"]
    assert v.startswith("differ") and "throughput_rps 0.88" in v, v


def test_an_epoll_run_that_fell_back_fails_the_server(tmp_path, monkeypatch):
    code, pj, _ = _fake_run(monkeypatch, tmp_path, {"epoll": (100.0, 10.0)}, (100.0, 10.0),
                            loop="thread-per-connection")
    assert code == 1 and "not the event loop" in pj["failed"]["memcached"]
    assert "memcached" not in pj["verdicts"]
