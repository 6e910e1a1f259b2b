"""Table 1 / Figure 3: the analysis on captured demo outputs and synthetic samples (pure), then
short real runs of `python -m preheat_lab table1` (skipped with the reason when the CLI is not
built): --quick on kv, a failing server, and an interruption."""

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from preheat_lab import __main__ as lab
from preheat_lab import cli, table1
from preheat_lab.skips import needs

FIX = Path(__file__).parent / "fixtures" / "demo"
PY = Path(__file__).resolve().parents[1]


def _fixture(name):
    raw = json.loads((FIX / name).read_text())
    samples = raw.pop("samples")
    df = pd.DataFrame(samples)
    df.insert(0, "server", "x")
    return raw, df


# ---------------------------------------------------------------------------------------------
# Pure


@pytest.mark.parametrize(
    "name", ["kv-5rounds.json", "kv-6rounds.json", "memcached-5rounds.json", "mariadb-5rounds.json"]
)
def test_our_statistics_match_the_cli_rows(name):
    """The Python order statistics and shares reproduce the Rust CLI's own rows from the same
    samples: the two sides use one method, on odd (5) and even (6) round counts, where a lower
    and an upper middle would differ (kv-6rounds.json: `preheat demo --rounds 6 --json`)."""
    meta, df = _fixture(name)
    t = table1.analyze_server("x", df, meta, {}, boot=100)["table"].set_index("mode")
    for row in meta["rows"]:
        m, lat = row["mode"], row["latency"]
        assert t.loc[m, "n"] == lat["n"]
        for k in ("mean", "p50", "p50_lo", "p50_hi", "p99", "p99_lo", "p99_hi", "min", "max"):
            assert t.loc[m, k] == pytest.approx(lat[k], rel=1e-9), (m, k)
        if row["overhead_removed"] is not None:
            assert t.loc[m, "removed_p50"] == pytest.approx(row["overhead_removed"], rel=1e-9), m


def test_skipped_modes_and_request_kinds_survive():
    meta, df = _fixture("mariadb-5rounds.json")
    assert {s["mode"] for s in meta["skipped"]} == {"preheat:replay", "preheat:wake+lines+replay"}
    t = table1.analyze_server("mariadb", df, meta, {}, boot=50)["table"]
    assert "preheat:replay" not in set(t["mode"])
    bk = table1.analyze_server("mariadb", df, meta, {}, boot=50)["by_kind"]
    assert set(bk["kind"]) == set(df["kind"])
    assert bk["n"].sum() == len(df)  # every sample in exactly one kind
    # Mixed kinds: shares on per-round differences (the CLI's rows agree: the test above).
    assert set(t["removed_p50_method"]) == {"within rounds"}
    kv = table1.analyze_server("kv", _fixture("kv-5rounds.json")[1], {}, {}, boot=50)["table"]
    assert set(kv["removed_p50_method"]) == {"p50s"}
    head = table1.analyze_server("mariadb", df, meta, {}, boot=50)["headline"]
    paper = head[head["source"] == table1.PAPER_LABEL].iloc[0]
    assert (paper["warm"], paper["cold"], paper["preheated"]) == (3970, 4320, 4069)


def test_cpi_is_na_without_a_pmu():
    meta, df = _fixture("kv-5rounds.json")
    assert meta["pmu"] is False
    t = table1.analyze_server("kv", df, meta, {}, boot=50)["table"]
    assert set(t["cpi_note"]) == {"n/a (no PMU on this machine)"}
    assert t["cpi"].isna().all()
    label, vals = table1.cpi_text({"pmu": True, "cpi": {"warm": 1.5}}, {})
    assert label == "measured" and vals == {"warm": 1.5}


def test_paper_numbers_and_the_79_8_percent_average():
    shares = [table1.paper_removed(s) for s in ("nginx", "memcached", "mariadb")]
    assert shares[0] == pytest.approx((498.0 - 388.5) / (498.0 - 367.6))
    assert sum(shares) / 3 == pytest.approx(table1.PAPER_AVERAGE_REMOVED, abs=0.001)


def _synthetic(rounds=60, noise=0.0, seed=3, extra=None):
    rng = np.random.default_rng(seed)
    truth = {"warm": 20.0, "cold-sweep": 120.0, "cold-idle": 100.0, "control": 60.0,
             "preheat:wake": 80.0, "preheat:lines": 70.0, "preheat:wake+lines": 45.0,
             **(extra or {})}
    rows = []
    for r in range(rounds):
        for m in rng.permutation(list(truth)):
            loads = table1.loads_lines(m)
            rows.append({"server": "syn", "mode": m, "round": r,
                         "latency_us": truth[m] + noise * rng.standard_normal(),
                         "lines_done": 320 if loads else 0, "lines_total": 320 if loads else 0,
                         "preheat_us": 5.12 if loads else 0.0})
    return pd.DataFrame(rows)


def test_decomposition_arithmetic_on_synthetic_samples():
    df = _synthetic()
    a = table1.analyze_server("syn", df, {}, {}, boot=200)
    d = a["decomposition"]
    for st in ("mean", "p50"):
        g = d[d["stat"] == st].set_index("component")
        assert g.loc["cold overhead", "us"] == pytest.approx(100.0)
        assert g.loc["wake-up / idle", "us"] == pytest.approx(40.0)
        assert g.loc["wake-up / idle", "share"] == pytest.approx(0.4)
        assert g.loc["cache loss", "us"] == pytest.approx(60.0)
        assert g.loc["cache loss", "share"] == pytest.approx(0.6)
        # the two parts add up to the whole
        assert g.loc["wake-up / idle", "us"] + g.loc["cache loss", "us"] == pytest.approx(
            g.loc["cold overhead", "us"])
        assert g.loc["plain idle gap (no sweep)", "share"] == pytest.approx(0.8)
        assert g.loc["removed by preheat:lines", "share"] == pytest.approx(0.5)
        assert g.loc["removed by preheat:wake+lines", "share"] == pytest.approx(0.75)
        assert g.loc["removed by preheat:wake", "share"] == pytest.approx(0.4)
        assert (g["rounds"] == 60).all()
    t = a["table"].set_index("mode")
    assert t.loc["preheat:lines", "removed_mean"] == pytest.approx(0.5)
    assert t.loc["preheat:lines", "removed_p50_lo"] == pytest.approx(0.5)  # no noise: no width
    # 320 lines × 64 B in 5.12 µs = 4 GB/s; the working set is 20 KiB
    assert t.loc["preheat:lines", "gb_per_s_p50"] == pytest.approx(4.0)
    assert t.loc["preheat:lines", "ws_kib"] == pytest.approx(20.0)
    assert math.isnan(t.loc["preheat:wake", "preheat_us_p50"])  # wake loads no lines
    assert t.loc["warm", "removed_mean"] == 1.0 and t.loc["cold-sweep", "removed_mean"] == 0.0
    head = a["headline"]
    measured = head[head["source"].str.startswith("measured")]
    assert list(measured["preheated_mode"].str.split(":").str[:2].str.join(":")) == [
        "preheat:lines", "preheat:wake+lines"]  # the paper's method, then the best here


def test_decomposition_intervals_bracket_the_truth_with_noise():
    d = table1.analyze_server("syn", _synthetic(rounds=150, noise=4.0), {}, {}, boot=500)["decomposition"]
    g = d[d["stat"] == "mean"].set_index("component")
    for comp, truth in (("cold overhead", 100.0), ("wake-up / idle", 40.0), ("cache loss", 60.0)):
        assert g.loc[comp, "us_lo"] < truth < g.loc[comp, "us_hi"], comp
    assert g.loc["removed by preheat:lines", "share_lo"] < 0.5 < g.loc["removed by preheat:lines", "share_hi"]


def test_partial_records_are_loaded(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = (FIX / "kv-records-head.jsonl").read_text().splitlines()
    (raw / "kv.jsonl").write_text("\n".join(lines) + "\n{\"mode\": \"warm\", \"rou")  # torn tail
    meta, df = table1.load_server(raw, "kv")
    assert meta == {} and len(df) == len(lines) and set(df["source"]) == {"records"}
    assert df["latency_us"].notna().all()


def test_failure_reason_names_the_setup_script():
    err = ("demo: starting redis\nError: redis-server is not installed (Debian package "
           "redis-server): run scripts/setup-lab.sh\n")
    assert "setup-lab.sh" in table1.failure_reason(err, 1)
    assert "exit code 3" in table1.failure_reason("boom\n", 3)


def test_failure_reason_keeps_the_clis_whole_error():
    fix = "What to do: " + "x" * 700
    err = ("demo: starting ./srv 8080 on CPU 1\npreheat: error: the agent cannot be loaded into "
           f"./srv: ./srv is statically linked. {fix}\n")
    reason = table1.failure_reason(err, 1)
    assert reason.startswith("preheat: error: the agent cannot be loaded") and fix in reason


# ---------------------------------------------------------------------------------------------
# Real runs


def _need_cli():
    try:
        b = cli.preheat_bin()
    except cli.ToolError as e:
        needs("preheat", str(e))
    if "--server" not in cli.help_text("demo"):
        needs("preheat", f"{b}: preheat demo has no --server (rebuild the CLI)")
    return b


def test_table1_quick_on_kv(tmp_path):
    _need_cli()
    out = tmp_path / "t1"
    code = lab.main(["table1", "--out", str(out), "--servers", "kv", "--quick"])
    assert code == 0, (out / "raw" / "kv.stderr.txt").read_text()
    summ = json.loads((out / "summary.json").read_text())
    assert summ["state"] == "complete" and summ["failed"] == {}
    assert summ["servers"]["kv"]["status"] == "ok"
    samples = pd.read_csv(out / "samples.csv")
    assert {"server", "mode", "round", "latency_us"} <= set(samples.columns)
    assert set(samples["round"]) == set(range(5))
    assert {"warm", "cold-sweep", "cold-idle", "control", "preheat:lines"} <= set(samples["mode"])
    if (out / "samples.parquet").exists():
        assert len(pd.read_parquet(out / "samples.parquet")) == len(samples)
    t = pd.read_csv(out / "table1.csv")
    assert (t["n"] == 5).all()
    assert (t["p50_lo"] <= t["p50"]).all() and (t["p50"] <= t["p50_hi"]).all()
    assert (t["mean_lo"] <= t["mean"]).all() and (t["mean"] <= t["mean_hi"]).all()
    assert (t["p99"] >= t["p50"]).all()
    for ext in ("png", "svg"):
        assert (out / f"figure3.{ext}").stat().st_size > 1000
        assert (out / f"figure3-kv.{ext}").stat().st_size > 1000
        assert (out / f"stages.{ext}").stat().st_size > 1000
    st = pd.read_csv(out / "stages.csv")
    # The agent saw when the server thread started on (almost) every request of every mode.
    assert (st["n_stages"] >= st["n"] - 1).all() and st["start_p50"].notna().all(), st
    html = (out / "report.html").read_text()
    for needle in ("Table 1 equivalent", "paper (Odroid-XU3, ARM Cortex-A15)", "Method.",
                   "Where cold-start time goes", "n/a (no PMU on this machine)", "data:image/png",
                   "Machine", "measured", "79.8%"):
        assert needle in html, needle
    assert not list(out.rglob(".*.tmp"))  # atomic writes leave no temp files
    # `report` rebuilds everything from raw/
    (out / "report.html").unlink()
    (out / "table1.csv").unlink()
    assert lab.main(["report", "--out", str(out), "--bootstrap", "100"]) == 0
    assert "Table 1 equivalent" in (out / "report.html").read_text()
    assert len(pd.read_csv(out / "table1.csv")) == len(t)


def _fake_cli(tmp_path, real):
    """A preheat wrapper whose demo fails for redis the way a missing package does."""
    p = tmp_path / "preheat"
    p.write_text("#!/bin/sh\n"
                 "case \" $* \" in *\" demo \"*\"--server redis \"*)\n"
                 "  echo 'demo: starting redis' >&2\n"
                 "  echo 'Error: redis-server is not installed (Debian package redis-server): "
                 "run scripts/setup-lab.sh' >&2; exit 1;;\n"
                 "esac\n"
                 f"exec {real} \"$@\"\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def test_a_failing_server_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    real = _need_cli()
    monkeypatch.setenv("PREHEAT_BIN", str(_fake_cli(tmp_path, real)))
    cli._help_cache.clear()
    out = tmp_path / "t1"
    code = lab.main(["table1", "--out", str(out), "--servers", "redis,kv", "--quick",
                     "--bootstrap", "100"])
    assert code == 1
    assert "redis FAILED" in capsys.readouterr().out
    summ = json.loads((out / "summary.json").read_text())
    assert "setup-lab.sh" in summ["failed"]["redis"]
    kv = summ["servers"]["kv"]
    # Every mode the demo measured (the hot floor among them where it can be held) × 5 rounds.
    modes = set(pd.read_csv(out / "table1.csv").query("server == 'kv'")["mode"])
    assert kv["status"] == "ok" and kv["samples"] == 5 * len(modes) and len(modes) >= 9
    html = (out / "report.html").read_text()
    assert "FAILED" in html and "setup-lab.sh" in html


def test_sigterm_stops_the_demo_and_writes_a_partial_report(tmp_path):
    _need_cli()
    if "--records" not in cli.help_text("demo"):
        needs("preheat", "preheat demo has no --records: an interrupted run keeps nothing (rebuild the CLI)")
    out = tmp_path / "t1"
    env = dict(os.environ, PYTHONPATH=str(PY))
    p = subprocess.Popen([sys.executable, "-m", "preheat_lab", "table1", "--out", str(out),
                          "--servers", "kv", "--rounds", "400", "--bootstrap", "100"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rec = out / "raw" / "kv.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and table1.count_lines(rec) < 20:
        time.sleep(0.2)
    assert table1.count_lines(rec) >= 20, "the demo measured nothing in 30 s"
    runs = json.loads((out / "runs.json").read_text())
    p.send_signal(signal.SIGTERM)
    text, _ = p.communicate(timeout=60)
    assert p.returncode == 143, text
    summ = json.loads((out / "summary.json").read_text())
    assert summ["state"] == "interrupted (partial)" and summ["interrupted_by"] == "SIGTERM"
    assert summ["servers"]["kv"]["status"] == "interrupted"
    assert summ["servers"]["kv"]["source"] == "records" and summ["servers"]["kv"]["samples"] >= 20
    assert "INTERRUPTED" in (out / "report.html").read_text()
    # nothing of the demo's process group is left running
    ps = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout
    alive = [ln for ln in ps.splitlines() if str(out) in ln and not ln.startswith("Z")]
    assert not alive, alive
    assert runs["state"] == "running"


def test_csv_only_with_a_note_when_pyarrow_is_missing(tmp_path, monkeypatch, capsys):
    from preheat_lab import atomic

    monkeypatch.setattr(atomic, "parquet_available", lambda: False)
    monkeypatch.setattr(atomic, "_warned_parquet", False)
    atomic.write_table(tmp_path / "samples", pd.DataFrame({"a": [1, 2]}))
    assert (tmp_path / "samples.csv").exists() and not (tmp_path / "samples.parquet").exists()
    assert "pyarrow is not installed" in capsys.readouterr().out


def _tail_frame(n=100):
    """A preheat mode whose slowest 5% were never acted on, and one whose tail has nothing
    recorded in common."""
    rows = []
    for i in range(n):
        slow = i >= n - 5
        rows.append({"mode": "preheat:lines", "latency_us": 200.0 if slow else 50.0 + i % 7,
                     "worker_lead_us": np.nan if slow else 20.0, "lines_total": 10,
                     "lines_done": 10, "server_start_us": 30.0})
        rows.append({"mode": "preheat:wake", "latency_us": 200.0 if slow else 50.0 + i % 7,
                     "worker_lead_us": 20.0, "lines_total": 0, "lines_done": 0,
                     "server_start_us": 30.0})
    return pd.DataFrame(rows).assign(server="kv", round=0)


def test_tail_requests_are_described_by_what_sets_them_apart():
    from preheat_lab import table1_analysis as ta
    t = ta.tail_table("kv", _tail_frame())
    lines = t.set_index("mode").loc["preheat:lines"]
    assert lines["n_tail"] == 5 and lines["not_acted_tail"] == 1.0 and lines["not_acted_rest"] == 0
    text = ta.tail_summary(t)
    assert any("preheat:lines" in x and "not acted on in 100%" in x for x in text), text
    assert any("preheat:wake" in x and "nothing recorded sets them apart" in x for x in text), text
    assert all(x.endswith("Measured.") for x in text)


def test_stages_split_at_the_server_start():
    from preheat_lab import table1_analysis as ta
    df = pd.DataFrame({"mode": ["warm"] * 3 + ["hot"] * 2, "latency_us": [20, 22, 24, 10, 12],
                       "server_start_us": [15, 16, np.nan, 5, 6]})
    st = ta.stages_table("kv", df).set_index("mode")
    assert list(st.index) == ["hot", "warm"]
    assert st.loc["warm", "n"] == 3 and st.loc["warm", "n_stages"] == 2
    assert st.loc["hot", "start_p50"] in (5, 6) and st.loc["hot", "serve_p50"] == 5


def test_stages_add_the_split_at_the_server_syscalls_where_recorded():
    from preheat_lab import table1_analysis as ta
    from preheat_lab.table1_run import DemoOptions
    df = pd.DataFrame({"mode": ["hot"] * 3, "latency_us": [10, 12, 14],
                       "server_start_us": [5, 6, 7],
                       "sys_to_read_us": [6, np.nan, 8], "sys_compute_us": [1, np.nan, 3],
                       "sys_reply_us": [3, np.nan, 3], "sys_to_event_us": [4, np.nan, 4]})
    st = ta.stages_table("kv", df).set_index("mode")
    assert st.loc["hot", "n_sys"] == 2 and st.loc["hot", "to_event_p50"] == 4
    assert st.loc["hot", "to_read_p50"] in (6, 8) and st.loc["hot", "reply_p50"] == 3
    # Records without the split (no --syscall-stages) have no such columns.
    plain = ta.stages_table("kv", df.drop(columns=list(ta.SYSCALL_STAGES)))
    assert "n_sys" not in plain.columns
    assert "--syscall-stages" in DemoOptions(rounds=5, syscall_stages=True).args()
    assert "--syscall-stages" not in DemoOptions(rounds=5).args()


def test_the_connection_row_is_a_diagnostic_not_a_strategy():
    from preheat_lab.table1_run import DemoOptions

    opts = DemoOptions(rounds=5, connection_row=True)
    assert "--connection-row" in opts.args() and "--connection-row" not in DemoOptions(rounds=5).args()
    assert opts.modes_per_round() == DemoOptions(rounds=5).modes_per_round() + 1
    # auto leaves 25 µs above the floor of a 100 µs cold overhead; one request on the
    # connection takes 20 of them: the decomposition says so, and conn-primed is no strategy
    # (no "removed by" row, never the headline's best).
    df = _synthetic(extra={"preheat:auto": 45.0, "conn-primed": 25.0})
    a = table1.analyze_server("syn", df, {}, {}, boot=200)
    d = a["decomposition"]
    g = d[d["stat"] == "p50"].set_index("component")
    assert g.loc["auto − conn-primed (the connection)", "us"] == pytest.approx(20.0)
    assert g.loc["auto − conn-primed (the connection)", "share"] == pytest.approx(0.2)
    assert "removed by conn-primed" not in g.index
    assert "removed by preheat:auto" in g.index
    head = a["headline"]
    assert not head["preheated_mode"].str.startswith("conn-primed").any()
    assert "conn-primed" not in table1.strategy_modes(list(df["mode"].unique()))


def _recording_cli(tmp_path):
    """A fake `preheat` that records the argv of its demo and answers with a captured demo JSON
    (no server is started)."""
    p = tmp_path / "preheat"
    argv = tmp_path / "demo-argv.json"
    p.write_text(
        f"#!{sys.executable}\n"
        "import json, shutil, sys\n"
        "a = sys.argv[1:]\n"
        "if a[:1] == ['topology']:\n"
        "    print('{}'); sys.exit(0)\n"
        "if a[:1] == ['demo'] and '--help' in a:\n"
        "    print('  --records <RECORDS>\\n  --out <OUT>'); sys.exit(0)\n"
        "if a[:1] == ['demo']:\n"
        f"    open({str(argv)!r}, 'w').write(json.dumps(a))\n"
        f"    shutil.copy({str(FIX / 'kv-5rounds.json')!r}, a[a.index('--out') + 1])\n"
        "    sys.exit(0)\n"
        "sys.exit(2)\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p, argv


def test_table1_takes_any_server_like_the_demo(tmp_path, monkeypatch):
    fake, argv = _recording_cli(tmp_path)
    monkeypatch.setenv("PREHEAT_BIN", str(fake))
    cli._help_cache.clear()
    out = tmp_path / "t1"
    cmd = ["python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"]
    code = lab.main(["table1", "--out", str(out), "--quick", "--bootstrap", "100",
                     "--port", "8080", "--request", "/index.html", "--name", "web", "--", *cmd])
    assert code == 0
    a = json.loads(argv.read_text())
    # The demo gets the server the way it takes any server: no catalog name, the command last.
    assert "--server" not in a
    i = a.index("--port")
    assert a[i:i + 6] == ["--port", "8080", "--protocol", "http", "--request", "/index.html"]
    assert a[a.index("--") + 1:] == cmd
    assert a[a.index("--rounds") + 1] == "5"
    summ = json.loads((out / "summary.json").read_text())
    assert list(summ["servers"]) == ["web"] and summ["servers"]["web"]["status"] == "ok"
    assert set(pd.read_csv(out / "table1.csv")["server"]) == {"web"}
    runs = json.loads((out / "runs.json").read_text())
    assert runs["custom"]["command"] == cmd


def test_table1_any_server_usage_errors(tmp_path, capsys):
    base = ["table1", "--out", str(tmp_path / "t1")]
    for args, needle in [
        (["--port", "80", "--", "srv"], "--port and --request"),
        (["--request", "/x"], "-- CMD"),
        (["--servers", "kv", "--port", "80", "--request", "/x", "--", "srv"], "either --servers"),
    ]:
        with pytest.raises(SystemExit) as e:
            lab.main(base + args)
        assert e.value.code == 2
        assert needle in capsys.readouterr().err


def test_the_floor_is_hot_only_where_the_cli_verified_it():
    """The floor follows the CLI's check (warm − hot per round above 0), read from its JSON."""
    from preheat_lab.table1_samples import HOT, WARM, floor_mode
    modes = [HOT, WARM, "cold-sweep"]
    assert floor_mode(modes) == HOT  # an older CLI without the check
    assert floor_mode(modes, {"floor_check": {"verified": True}}) == HOT
    assert floor_mode(modes, {"floor_check": {"verified": False}}) == WARM
    assert floor_mode([WARM, "cold-sweep"], {"floor_check": None}) == WARM


def test_share_flags_follow_the_cli_rule():
    """Outside ±100% is flagged; against warm only a loss beyond −100% (the CLI's rule)."""
    from preheat_lab.table1_analysis import share_flag
    assert share_flag("preheat:replay", "hot", removed=0.9, removed_vs_warm=1.1) == ""
    assert "removed 120%" in share_flag("preheat:replay", "hot", removed=1.2)
    assert "removed vs warm -130%" in share_flag("preheat:wake", "hot", removed_vs_warm=-1.3)
    assert share_flag("preheat:wake", "hot", removed=float("nan"), removed_vs_warm=None) == ""


@pytest.mark.parametrize("argv, says", [
    (["table1", "--rounds", "0"], "--rounds: 0: must be at least 1"),
    (["table1", "--lead-us", "0"], "--lead-us: 0: must be above 0"),
    (["table1", "--rounds", "x"], "'x' is not a number"),
    (["peer", "--seconds", "-1"], "--seconds: -1: must be above 0"),
    (["affinity", "--reps", "0"], "--reps: 0: must be at least 1"),
])
def test_sizes_that_measure_nothing_are_refused(argv, says, capsys):
    # `--rounds 0` once fell back to the default silently and ran a whole table.
    with pytest.raises(SystemExit) as e:
        lab.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err
