"""Peer check: the peers' output parsers on outputs captured from real runs here
(tests/fixtures/peer/), the comparison (it must be able to say "differ"), and a short real run on
memcached (skipped with the reason when memcaslap or `preheat serve` is missing)."""

import json
import shutil
from pathlib import Path

import pytest

from preheat_lab import __main__ as lab
from preheat_lab import cli, peer

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
    assert peer._wrk_time_us("1.50s") == 1.5e6 and peer._wrk_time_us("2.00ms") == 2000
    with pytest.raises(peer.PeerParseError):
        peer.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_ours_json():
    d = peer.parse_ours(json.loads(_read("preheat-load-block.json")))
    assert d["throughput_rps"] > 0 and d["connections"] == 4 and d["errors"] == 0


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
        pytest.skip(str(e))
    if not shutil.which("memcaslap"):
        pytest.skip("memcaslap is not installed (Debian: libmemcached-tools)")
    if not cli.help_text("serve"):
        pytest.skip("this preheat CLI has no `serve` subcommand")
    if "--connections" not in cli.help_text("load"):
        pytest.skip("this preheat CLI's load has no --connections")
    if "--threads" not in cli.help_text("load"):
        pytest.skip("this preheat CLI's load has no --threads (rebuild: cargo build --release)")
    out = tmp_path / "lab"
    code = lab.main(["peer", "--out", str(out), "--servers", "memcached", "--seconds", "2"])
    pj = json.loads((out / "peer" / "peer.json").read_text())
    assert pj["failed"] == {}, pj["failed"]
    assert code == 0 and pj["state"] == "complete"
    sides = {m["client"]: m for m in pj["measurements"]}
    assert set(sides) == {"preheat load --wait block", "memcaslap", "preheat load --wait spin"}
    for m in sides.values():
        assert m["throughput_rps"] > 0 and m["mean_us"] > 0
    metrics = {c["metric"] for c in pj["comparisons"] if not c["extra"]}
    assert {"throughput_rps", "mean_us"} <= metrics
    for c in pj["comparisons"]:  # the verdict is computed from the ratio, whatever it is
        assert c["within"] == (abs(c["ratio"] - 1) <= 0.05 + 1e-12)
    assert pj["verdicts"]["memcached"].startswith(("agree", "differ"))
    raw = out / "peer" / "raw"
    assert "Get Statistics" in (raw / "memcached-peer-1.txt").read_text()
    assert (raw / "memcached-ours-block-1.json").exists()
    assert "Peer check" in (out / "report.html").read_text()


def test_same_threads_and_pinning_on_both_sides(tmp_path, monkeypatch):
    monkeypatch.setattr(peer, "peer_tool", lambda s: f"/usr/bin/{peer.PEER_TOOLS[s]}")
    monkeypatch.setattr(peer.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(peer.cli, "preheat_bin", lambda: "preheat")
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
    monkeypatch.setattr(peer.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert peer.cpu_plan(None) == (3, [0, 1, 2])
    assert peer.cpu_plan(1) == (1, [0, 2, 3])
    assert peer.cpu_plan(None, pin=False) == (None, None)
    monkeypatch.setattr(peer.os, "sched_getaffinity", lambda pid: {0})
    assert peer.cpu_plan(None) == (None, None)
