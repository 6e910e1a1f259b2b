"""preheat lab affinity against a stand-in `preheat` (fixtures/affinity/fake_preheat.py, which
follows docs/affinity-json.md): the run list (cells × workloads × rounds, shuffled, interleaved),
--quick's size and the time budget, a missing program skipped visibly, a failing run recorded,
the statistics on constructed samples (a 10% loss, no loss, the win-back share and its undefined
case), the outputs, --from re-rendering and the CLI errors. No real binary is needed."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from html import unescape
from pathlib import Path

import pandas as pd
import pytest

from preheat_lab import __main__ as lab
from preheat_lab import affinity, affinity_report, cli

FIX = Path(__file__).resolve().parent / "fixtures" / "affinity"
FAKE = FIX / "fake_preheat.py"
FAKE_ENV = ("FAKE_MISSING", "FAKE_FAIL", "FAKE_TOPOLOGY_FAIL", "FAKE_NO_AFFINITY", "FAKE_LOG",
            "FAKE_COUNTER")


def _fake(monkeypatch, tmp_path: Path, **env) -> Path:
    """PREHEAT_BIN = the stand-in, with run-to-run noise from a counter; returns its argv log."""
    monkeypatch.setenv("PREHEAT_BIN", str(FAKE))
    for k in FAKE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FAKE_COUNTER", str(tmp_path / "counter"))
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cli._help_cache.clear()
    return log


def _topo(quanta: str = "2,10,200") -> dict:
    p = subprocess.run([sys.executable, str(FAKE), "affinity", "topology", "--json", "--verify",
                        "--quanta", quanta], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def _captions(report: Path):
    t = report.read_text()
    caps = re.findall(r"<caption>(.*?)</caption>", t, re.DOTALL) + re.findall(
        r"<figcaption>(.*?)(?:<a |</figcaption>)", t, re.DOTALL)
    return [unescape(c) for c in caps]


# ---------------------------------------------------------------------------------------------
# Options, the run list, the budget


def test_options():
    d = affinity.Options.make()
    assert d.workloads == affinity.WORKLOADS and d.quanta == (2, 10, 200) and d.reps == 5
    q = affinity.Options.make(quick=True)
    assert (q.workloads, q.quanta, q.reps, q.cpu_ms) == (("chase", "gzip"), (2, 200), 2, 150)
    o = affinity.Options.make(workloads="stream, chase", quanta="200,2", reps=7, cpu_ms=300, seed=9)
    assert o.workloads == ("stream", "chase") and o.quanta == (2, 200) and o.cpu_ms_given
    assert affinity.Options.make(quick=True, reps=1).reps == 1
    for bad in ({"workloads": "chase,mcf"}, {"workloads": ""}, {"quanta": "2,x"},
                {"quanta": "0"}, {"reps": 4}, {"cpu_ms": 5}, {"from_dir": Path("/nonexistent")}):
        with pytest.raises(ValueError):
            affinity.Options.make(**bad)


def test_run_list_cells_workloads_rounds():
    topo = _topo()
    o = affinity.Options.make()
    conds = affinity.build_conditions(topo, o)
    cells = topo["table2"]["cells"]
    assert len(cells) == 4 * 2 * 3  # affinity columns × retention × quanta
    t2 = [c for c in conds if c["purpose"] == "table2"]
    t3 = [c for c in conds if c["purpose"] == "table3"]
    wb = [c for c in conds if c["purpose"] == "winback"]
    assert len(t2) == 7 * 24 and {(c["workload"], c["cell_id"]) for c in t2} == {
        (w, c["id"]) for w in affinity.WORKLOADS for c in cells}
    # Table 3: each workload main once, the next one interfering (cyclic), high and low, 2 ms.
    pairs = sorted({(c["workload"], c["interfering"]) for c in t3})
    assert len(t3) == 14 and ("cc", "chase") in pairs and ("chase", "stream") in pairs
    assert all(c["quantum_ms"] == 2 and "--quantum-ms 2" in " ".join(c["args"]) for c in t3)
    # Win-back: the bundled kernels, the strongest low cell (BV_L2 at low retention) and
    # Table 3 low, with --preheat.
    assert sorted((c["workload"], c["cell_id"]) for c in wb) == sorted(
        [(w, "BV_L2.low.q2") for w in affinity.BUNDLED]
        + [(w, "table3.low.q2") for w in affinity.BUNDLED])
    for c in conds:
        a = " ".join(c["args"])
        assert a.startswith("affinity run --json --")
        assert ("--preheat" in c["args"]) == c["preheat"] == (c["purpose"] == "winback")
        assert ("--cpu-ms" in c["args"]) == (c["workload"] in affinity.BUNDLED)
        if c["experiment"] == "table2":
            assert ("--concurrent BV_LLC" in a) == (c["retention"] == "low")
    assert len({c["cond"] for c in conds}) == len(conds) == 168 + 14 + 6

    plan = affinity.build_plan(conds, 5, seed=3)
    assert len(plan) == len(conds) * 5
    assert [r["round"] for r in plan] == sorted(r["round"] for r in plan)  # interleaved rounds
    orders = []
    for r in range(1, 6):
        got = [x["cond"] for x in plan if x["round"] == r]
        assert Counter(got) == Counter(c["cond"] for c in conds)  # every condition once
        orders.append(got)
    assert len({tuple(x) for x in orders}) == 5  # shuffled differently each round
    assert orders[0] != [c["cond"] for c in conds]
    assert affinity.build_plan(conds, 5, seed=3) == plan
    assert affinity.build_plan(conds, 5, seed=4) != plan
    assert len({r["run_id"] for r in plan}) == len(plan)


def test_winback_falls_back_to_bv_l1d_and_quanta_filter():
    topo = _topo("2,10")
    topo["table2"]["cells"] = [c for c in topo["table2"]["cells"] if c["interleaved"] != "BV_L2"]
    assert affinity.winback_cell(affinity.table2_cells(topo, (2, 10)))["id"] == "BV_L1D.low.q2"
    notes = []
    o = affinity.Options.make(workloads="chase", quanta="10")
    conds = affinity.build_conditions(topo, o, notes)
    assert {c["quantum_ms"] for c in conds if c["experiment"] == "table2"} == {10}
    assert not any(c["preheat"] and c["experiment"] == "table2" for c in conds)
    assert any("win-back" in n for n in notes)


def test_quick_size_and_the_budget():
    q = affinity.Options.make(quick=True)
    conds = affinity.build_conditions(_topo("2,200"), q)
    # chase + gzip × 16 cells, one Table 3 pair, win-back for chase (BV_L2 cell and Table 3).
    assert len(conds) == 2 * 16 + 2 + 2
    assert len(affinity.build_plan(conds, q.reps, q.seed)) == 72
    assert affinity.estimate_s(conds, q.reps, q.cpu_ms) < 120
    d = affinity.Options.make()
    conds = affinity.build_conditions(_topo(), d)
    assert affinity.fit_cpu_ms(conds, d) == d.cpu_ms
    assert affinity.estimate_s(conds, d.reps, d.cpu_ms) < 30 * 60
    # More cells than a 2-CPU machine offers: the default --cpu-ms is lowered to fit.
    d4 = affinity.Options.make(quanta="2,5,10,200")
    big = affinity.build_conditions(_topo("2,5,10,200"), d4)
    fitted = affinity.fit_cpu_ms(big, d4)
    assert affinity.MIN_CPU_MS < fitted < d4.cpu_ms
    assert affinity.estimate_s(big, d4.reps, fitted) <= affinity.BUDGET_S
    given = affinity.Options.make(quanta="2,5,10,200", cpu_ms=500)
    assert affinity.fit_cpu_ms(big, given) == 500  # an explicit --cpu-ms is kept


# ---------------------------------------------------------------------------------------------
# Statistics on constructed samples


def _plan(conds: dict, values: dict, cost: dict = None) -> list:
    plan = []
    for cid, vals in values.items():
        for r, v in enumerate(vals, 1):
            data = {"kind": "measured", "rate": v, "work": v, "cpu_s": 1.0,
                    "metric": "work per CPU-second", "preheat_cpu_s": 0.0}
            if conds[cid]["preheat"]:
                c = (cost or {}).get(cid, [v] * len(vals))[r - 1]
                data.update({"preheat_cpu_s": v / c - 1.0, "rate_with_preheat_cost": c})
            plan.append({"run_id": f"r{r:02d}-001-{cid}", "round": r, "order": 1, "cond": cid,
                         "status": "ok", "data": data})
    return plan


def _t2_conds(topo: dict, w: str = "chase") -> dict:
    cells = {c["id"]: c for c in topo["table2"]["cells"]}
    out = {}
    for cid, pre in (("BV_0.low.q2", False), ("BV_L1D.low.q2", False), ("BV_L2.low.q2", False),
                     ("BV_L2.low.q2", True)):
        c = affinity._t2_cond(w, cells[cid], pre, 100, "winback" if pre else "table2")
        out[c["cond"]] = c
    return out


HIGH, L1D, L2, PRE = ("t2-chase-BV_0.low.q2", "t2-chase-BV_L1D.low.q2", "t2-chase-BV_L2.low.q2",
                      "t2-chase-BV_L2.low.q2-preheat")
TIGHT = [1.0, 1.001, 0.999, 1.0005, 0.9995, 1.0002]


def test_ten_percent_slower_is_significant_identical_is_not():
    conds = _t2_conds(_topo("2"))
    plan = _plan(conds, {HIGH: [100 * x for x in TIGHT], L1D: [90 * x for x in TIGHT],
                         L2: [100 * x for x in TIGHT], PRE: [100 * x for x in TIGHT]})
    runs = affinity_report.runs_table(plan, conds)
    d, rounds = affinity_report.paired_pct(runs, L1D, HIGH, boot=500)
    assert rounds == 6 and d.value == pytest.approx(-0.10, abs=0.002)
    assert d.hi < 0 and affinity_report.significant(d, rounds) is True
    same, rounds = affinity_report.paired_pct(runs, L2, HIGH, boot=500)
    assert same.value == pytest.approx(0.0) and affinity_report.significant(same, rounds) is False
    t2 = affinity_report.table2_table(runs, conds, boot=500).set_index("cell_id")
    assert t2.loc["BV_L1D.low.q2", "pct"] == pytest.approx(-0.10, abs=0.002)
    assert t2.loc["BV_L1D.low.q2", "verdict"] == "significant"
    assert t2.loc["BV_L2.low.q2", "verdict"] == "not significant"
    assert t2.loc["BV_0.low.q2", "verdict"] == "reference" and t2.loc["BV_0.low.q2", "n"] == 6
    m, lo, hi = t2.loc["BV_L1D.low.q2", ["mean", "lo", "hi"]]
    assert lo < m < hi and m == pytest.approx(90, rel=1e-3)  # stats.mean_ci_t
    # With fewer than MIN_ROUNDS rounds there is no verdict, whatever the interval says.
    few = _plan(conds, {HIGH: [100, 100.1], L1D: [90, 90.1]})
    d, rounds = affinity_report.paired_pct(affinity_report.runs_table(few, conds), L1D, HIGH, 200)
    assert rounds == 2 and affinity_report.significant(d, rounds) is None
    assert "not assessed" in affinity_report.verdict(None, rounds)


def test_winback_share_and_the_undefined_case():
    conds = _t2_conds(_topo("2"))
    # high 100, low 80, with --preheat 95: 75% won back; counting the preheat's CPU time the
    # rate is 90: 50%.
    plan = _plan(conds, {HIGH: [100 * x for x in TIGHT], L2: [80 * x for x in TIGHT],
                         PRE: [95 * x for x in TIGHT]},
                 cost={PRE: [90 * x for x in TIGHT]})
    wb = affinity_report.winback_table(affinity_report.runs_table(plan, conds), conds, boot=500)
    r = wb.iloc[0]
    assert r["high_cond"] == HIGH and r["low_cond"] == L2 and r["preheat_cond"] == PRE
    assert r["loss"] == pytest.approx(-0.2, abs=0.002) and r["loss_verdict"] == "significant"
    assert r["recovered"] == pytest.approx(0.75, abs=0.01)
    assert r["recovered_lo"] < 0.75 < r["recovered_hi"]
    assert r["recovered_hi"] - r["recovered_lo"] < 0.05
    assert r["recovered_with_cost"] == pytest.approx(0.5, abs=0.01)
    assert r["preheat_cost_share"] == pytest.approx(95 / 90 - 1, rel=0.01)
    assert r["gain"] == pytest.approx(95 / 80 - 1, abs=0.005) and not r["recovered_note"]
    # No loss (low = high): the share would divide by ~0: undefined, with the reason.
    plan = _plan(conds, {HIGH: [100 * x for x in TIGHT], L2: [100 * x for x in TIGHT],
                         PRE: [101 * x for x in TIGHT]})
    r = affinity_report.winback_table(affinity_report.runs_table(plan, conds), conds, 500).iloc[0]
    assert pd.isna(r["recovered"]) and pd.isna(r["recovered_with_cost"])
    assert "undefined" in r["recovered_note"] and "not significant" in r["recovered_note"]
    # A tiny but "significant" gap is still a real loss; a gap with 2 rounds is not assessed.
    plan = _plan(conds, {HIGH: [100, 100.2], L2: [80, 80.1], PRE: [95, 95.1]})
    r = affinity_report.winback_table(affinity_report.runs_table(plan, conds), conds, 200).iloc[0]
    assert pd.isna(r["recovered"]) and "not assessed" in r["recovered_note"]


# ---------------------------------------------------------------------------------------------
# The command against the stand-in


def test_quick_run_outputs_and_from(tmp_path: Path, monkeypatch, capsys):
    log = _fake(monkeypatch, tmp_path)
    out = tmp_path / "lab"
    assert lab.main(["affinity", "--out", str(out), "--quick", "--cpu-ms", "120"]) == 0
    printed = capsys.readouterr()
    assert "Table 2 matrix" in printed.out and "substitution:" in printed.out
    assert "expected duration" in printed.out and "72 runs" in printed.out
    calls = log.read_text().splitlines()
    topo_call = next(c for c in calls if c.startswith("affinity topology") and "--help" not in c)
    assert "--verify" in topo_call and "--quanta 2,200" in topo_call
    run_calls = [c for c in calls if c.startswith("affinity run") and "--help" not in c]
    assert len(run_calls) == 72
    assert all("--cpu-ms 120" in c for c in run_calls if "--workload chase" in c)
    assert not any("--cpu-ms" in c for c in run_calls if "--workload gzip" in c)
    assert sum("--preheat" in c for c in run_calls) == 2 * 2
    assert sum("--experiment table3" in c for c in run_calls) == 3 * 2

    for f in ("raw/topology.json", "raw/plan.json", "runs.csv", "table2.csv", "table3.csv",
              "winback.csv", "quanta.csv", "refill.csv", "paper.csv", "workloads.csv",
              "summary.json", "report.html", "table2-chase.png", "table2-gzip.png",
              "fig2-low-retention.png", "fig45-table3.png", "winback.png", "refill.png",
              "quanta.png", "quanta.svg"):
        assert (out / f).exists() and (out / f).stat().st_size > 0, f
    assert len(list((out / "raw").glob("r0*-*.json"))) == 72
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 72 and set(runs["status"]) == {"ok"} and set(runs["label"]) == {"measured"}
    assert list(runs["round"]) == sorted(runs["round"])
    sj = json.loads((out / "summary.json").read_text())
    assert sj["kind"] == "affinity" and sj["state"] == "complete" and sj["runs"] == {"ok": 72}
    # Two rounds: no significance verdicts, so no win-back share either (said, not printed).
    t2 = pd.read_csv(out / "table2.csv")
    assert t2["significant"].isna().all()
    lows = t2.loc[t2["affinity"] != "high", "verdict"]
    assert set(lows) == {"not assessed (2 paired round(s) < 5)"}
    wb = pd.read_csv(out / "winback.csv")
    assert len(wb) == 2 and wb["recovered"].isna().all()
    q = pd.read_csv(out / "quanta.csv")
    assert set(q["requested_ms"]) == {2, 200} and set(q["role"]) == {"main", "vector"}

    html = (out / "report.html").read_text()
    for s in ("27%", "45%", "174%", "288 experiments", "11% average", "16% average",
              "mcf", "whiskers", "±2σ", "work per CPU-second", "jobs per CPU-second",
              "no PMU", "substitution", "the paper"):
        assert s in unescape(html), s
    caps = _captions(out / "report.html")
    assert len(caps) >= 10
    for c in caps:
        assert "measured" in c.lower() or "the paper's" in c, c

    # --from DIR/raw: no CLI call (the stand-in would refuse), the same outputs again.
    monkeypatch.setenv("FAKE_NO_AFFINITY", "1")
    n_calls = len(log.read_text().splitlines())
    for f in ("report.html", "table2.csv", "fig2-low-retention.png"):
        (out / f).unlink()
    assert lab.main(["affinity", "--from", str(out / "raw")]) == 0
    assert len(log.read_text().splitlines()) == n_calls
    for f in ("report.html", "table2.csv", "fig2-low-retention.png"):
        assert (out / f).exists(), f
    assert pd.read_csv(out / "table2.csv").shape == t2.shape
    other = tmp_path / "again"
    assert lab.main(["affinity", "--from", str(out / "raw"), "--out", str(other)]) == 0
    assert (other / "raw" / "plan.json").exists() and (other / "report.html").exists()
    # `report --out DIR` re-renders an affinity directory (its raw/ is not Table 1's).
    (out / "report.html").unlink()
    assert lab.main(["report", "--out", str(out)]) == 0
    assert "Table 2" in (out / "report.html").read_text()


def test_a_missing_program_is_skipped_visibly(tmp_path: Path, monkeypatch, capsys):
    _fake(monkeypatch, tmp_path, FAKE_MISSING="gzip")
    out = tmp_path / "lab"
    assert lab.main(["affinity", "--out", str(out), "--quick", "--quanta", "2"]) == 0
    printed = capsys.readouterr()
    assert "SKIP gzip" in printed.out + printed.err and "not installed" in printed.out
    assert "SKIP table3 chase+gzip" in printed.err
    runs = pd.read_csv(out / "runs.csv")
    gz = runs[(runs["workload"] == "gzip") | (runs["interfering"] == "gzip")]
    assert len(gz) and set(gz["status"]) == {"skipped"}
    assert gz["reason"].str.contains("gzip unavailable").all()
    assert set(runs.loc[runs["workload"] == "chase", "status"]) >= {"ok"}
    html = unescape((out / "report.html").read_text())
    assert "SKIP gzip" in html and "SKIPPED (unavailable)" in html
    assert json.loads((out / "summary.json").read_text())["unavailable"].keys() == {"gzip"}


def test_a_failing_run_is_recorded_and_the_rest_goes_on(tmp_path: Path, monkeypatch):
    bad = "--workload chase --interleave BV_L1I --concurrent BV_LLC --quantum-ms 2"
    _fake(monkeypatch, tmp_path, FAKE_FAIL=bad)
    out = tmp_path / "lab"
    assert lab.main(["affinity", "--out", str(out), "--quick", "--quanta", "2"]) == 1
    runs = pd.read_csv(out / "runs.csv")
    failed = runs[runs["status"] == "failed"]
    assert len(failed) == 2 and set(failed["cell_id"]) == {"BV_L1I.low.q2"}
    assert failed["reason"].str.contains("simulated run failure").all()
    assert (runs["status"] == "ok").sum() == len(runs) - 2
    for rid in failed["run_id"]:
        assert (out / "raw" / f"{rid}.stderr.txt").exists()
    html = unescape((out / "report.html").read_text())
    assert "FAILED 2 run(s)" in html and "simulated run failure" in html
    t2 = pd.read_csv(out / "table2.csv").set_index(["workload", "cell_id"])
    assert t2.loc[("chase", "BV_L1I.low.q2"), "n"] == 0
    assert t2.loc[("chase", "BV_L1D.low.q2"), "n"] == 2


def test_clear_errors(tmp_path: Path, monkeypatch, capsys):
    _fake(monkeypatch, tmp_path)
    monkeypatch.setenv("PREHEAT_BIN", str(tmp_path / "no-such-preheat"))
    assert lab.main(["affinity", "--out", str(tmp_path / "a"), "--quick"]) == 2
    assert "does not exist" in capsys.readouterr().err
    _fake(monkeypatch, tmp_path, FAKE_NO_AFFINITY="1")
    assert lab.main(["affinity", "--out", str(tmp_path / "b"), "--quick"]) == 2
    assert "has no `preheat affinity" in capsys.readouterr().err
    _fake(monkeypatch, tmp_path, FAKE_TOPOLOGY_FAIL="1")
    assert lab.main(["affinity", "--out", str(tmp_path / "c"), "--quick"]) == 2
    err = capsys.readouterr().err
    assert "affinity topology" in err and "simulated failure" in err
    with pytest.raises(SystemExit):
        lab.main(["affinity", "--quick"])  # neither --out nor --from


def test_sigterm_writes_a_partial_report(tmp_path: Path, monkeypatch):
    _fake(monkeypatch, tmp_path, FAKE_RUN_SLEEP="0.3")
    out = tmp_path / "lab"
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = lab.main(["affinity", "--out", str(out), "--quick", "--quanta", "2"])
    finally:
        timer.cancel()
    assert code == 143
    sj = json.loads((out / "summary.json").read_text())
    assert sj["state"] == "interrupted (partial)" and sj["interrupted_by"] == "SIGTERM"
    runs = pd.read_csv(out / "runs.csv")
    assert (runs["status"] == "ok").sum() >= 1 and (runs["status"] == "not run").sum() >= 1
    assert "INTERRUPTED" in (out / "report.html").read_text()
    plan = json.loads((out / "raw" / "plan.json").read_text())
    assert plan["state"] == "interrupted (partial)"
