"""preheat lab cosched: analysis, figures, tables and the report on fixture JSON (no CLI); the
whole command against a stand-in `preheat` (fixtures/cosched/fake_preheat.py: success, a failing
part, an interruption); the sweep runner's cosim target (parameters, argv, 2 points through the
stand-in and 2 through the real simulator); and one end-to-end `--quick` run through the real
binary (marked slow; skipped when the binary lacks `cosched`, a failure when CI is set)."""

import json
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from html import unescape
from pathlib import Path

import pandas as pd
import pytest

from preheat_lab import __main__ as lab
from preheat_lab import cli, cosched, sweep
from preheat_lab.skips import needs

FIX = Path(__file__).resolve().parent / "fixtures" / "cosched"
FAKE = FIX / "fake_preheat.py"
LABELS = ("measured", "simulated", "modeled", "the paper's")


def _exp() -> dict:
    return json.loads((FIX / "experiment.json").read_text())


def _sim_records() -> list:
    """Simulator runs as run_simulations leaves them: the fixture output for 8 CPUs, scaled per
    seed so the range over seeds is not empty."""
    base = json.loads((FIX / "simulate-8cpu-double.json").read_text())
    recs = []
    for k in ("mg", "ep"):
        for s in ("single", "double", "quad"):
            for seed in (1, 2, 3):
                d = json.loads(json.dumps(base))
                for p in d["policies"]:
                    if p["improvement_over_full"]:
                        p["improvement_over_full"] += 0.01 * seed
                recs.append({"id": f"8cpu-{k}-{s}-s{seed}", "host": "8cpu",
                             "host_label": cosched.SIM_HOSTS[0].label, "cpus": 8, "vms": "8+4",
                             "kernel": k, "scenario": s, "seed": seed, "phase_us": 155.1,
                             "phase_source": "measured", "sync": k != "ep", "duration_s": 20.0,
                             "detect_s": 5.0, "status": "ok", "data": d})
    return recs


def _html_labels(report: Path):
    """Every table caption and figure caption of a report."""
    t = report.read_text()
    caps = re.findall(r"<caption>(.*?)</caption>", t, re.DOTALL) + re.findall(
        r"<figcaption>(.*?)(?:<a |</figcaption>)", t, re.DOTALL)
    return [unescape(c) for c in caps]


def _fake(monkeypatch, **env):
    monkeypatch.setenv("PREHEAT_BIN", str(FAKE))
    # The stand-in is instant: no shortening for the time budget.
    monkeypatch.setattr(cosched, "SIM_BUDGET_S", {False: 1e9, True: 1e9})
    for k in ("FAKE_SIM_FAIL", "FAKE_NO_EXPERIMENT", "FAKE_EXPERIMENT_SLEEP"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cli._help_cache.clear()


# ---------------------------------------------------------------------------------------------
# Pure analysis


def test_options(monkeypatch):
    q = cosched.Options.make(quick=True)
    assert (q.kernels, q.scenarios, q.reps, q.seconds, q.regroup_s, q.sim_seeds) == (
        ("mg", "ep"), ("single", "double"), 2, 2.0, 0.7, 2)
    d = cosched.Options.make()
    assert d.kernels == ("mg", "cg", "is", "ep") and d.reps == 5 and d.seconds == 6.0
    assert cosched.Options.make(quick=True, kernels="cg", reps=3).kernels == ("cg",)
    # --guests: QEMU guests, only kernels with barriers (a guest's progress is its phases).
    g, gq = cosched.Options.make(guests=True), cosched.Options.make(quick=True, guests=True)
    assert (g.kernels, g.reps, g.seconds, gq.kernels, gq.reps) == (("mg", "cg"), 3, 8.0, ("mg",), 1)
    monkeypatch.setenv("PREHEAT_BIN", "preheat")
    assert "--guests" in cosched.experiment_argv(g) and "--guests" not in cosched.experiment_argv(d)
    assert cosched.estimate_experiment_s(g) < 25 * 60 and cosched.estimate_experiment_s(gq) < 5 * 60
    with pytest.raises(ValueError):
        cosched.Options.make(guests=True, kernels="ep")
    assert cosched.Options.make(scenarios="double").scenarios == ("double",)
    for bad in ({"kernels": "mg,xx"}, {"scenarios": "quad"}, {"scenarios": ","}, {"reps": 0}, {"seconds": 0}, {"sim_seeds": -1},
                {"from_file": Path("/nonexistent.json")}):
        with pytest.raises(ValueError):
            cosched.Options.make(**bad)
    # The budgets of the brief: --quick a few minutes, the default < 30 min with simulations,
    # even on a debug build with short phases (the 64-CPU hosts then simulate a shorter time).
    short = {k: 130.0 for k in cosched.KERNELS}
    for o, limit in ((q, 5 * 60), (d, 30 * 60)):
        budget = cosched.SIM_BUDGET_S[o.quick]
        assert cosched.estimate_experiment_s(o) + budget < limit, o.quick
        for release in (False, True):
            scale, seeds = cosched.fit_budget(o, short, True, budget, release)
            assert seeds >= (1 if o.quick else 2)
            plan = cosched.sim_plan(o, short, True, scale, seeds)
            est = cosched.estimate_sims_s(plan, release)
            assert cosched.estimate_experiment_s(o) + est < limit, (o.quick, release, est)
            at_floor = seeds == (1 if o.quick else 2) and all(
                r["duration_s"] == cosched.SIM_MIN_DURATION_S for r in plan)
            assert est <= budget * 1.05 or at_floor, (o.quick, release, est)
            if scale == 1.0:  # the paper-size host keeps the simulator's 20 s (5 s --quick)
                assert {r["duration_s"] for r in plan if r["host"] == "8cpu"} == {
                    5.0 if o.quick else 20.0}
            assert all(r["duration_s"] >= min(cosched.SIM_MIN_DURATION_S, 20.0 / 4)
                       and r["detect_s"] == pytest.approx(r["duration_s"] / 4, abs=1e-3)
                       for r in plan)
        assert cosched.fit_budget(o, short, True, budget, False)[0] < 1.0
        assert cosched.fit_budget(o, short, True, 1e9) == (1.0, o.sim_seeds)


def test_alone_iteration_times_both_formats():
    assert cosched.alone_us(_exp()) == {"mg": 310.2, "ep": 120.5}
    assert cosched.alone_us({"calibration": [{"kernel": "mg", "alone_iteration_us": 3951.4,
                                              "contention": 0.5, "runs": 3}]}) == {"mg": 3951.4}
    assert cosched.alone_us(None) == {}


def test_validation_marks_inside_and_outside():
    v = cosched.validation_table(cosched.rows_table(_exp()))
    got = {(r.kernel, r.scenario, r.policy): r.verdict for r in v.itertuples()}
    assert got[("mg", "single", "partial-static")] == "outside"   # above the interval
    assert got[("mg", "double", "partial-static")] == "outside"   # below it
    assert got[("ep", "double", "partial-auto")] == "outside"
    assert got[("mg", "single", "partial-auto")] == "inside"      # on the median
    for k in (("ep", "single", "partial-static"), ("ep", "single", "partial-auto"),
              ("ep", "double", "partial-static")):
        assert got[k] == "inside"
    assert got[("mg", "double", "partial-auto")] == "no simulated value"
    assert got[("mg", "single", "none")] == "no simulated value"
    assert (v["inside"].dropna() == v["inside_check"].dropna()).all()
    s = cosched.validation_sentence(v)
    assert "7 have a simulated value" in s and "4 of them lie inside" in s and "3 outside" in s
    assert "WARNING" not in s


def test_validation_without_the_cli_flag_and_with_a_wrong_one():
    exp = _exp()
    for r in exp["rows"]:
        r.pop("simulated_within_ci")
    v = cosched.validation_table(cosched.rows_table(exp))
    assert (v["verdict"] == "inside").sum() == 4 and (v["verdict"] == "outside").sum() == 3
    exp = _exp()
    row = next(r for r in exp["rows"] if r["kernel"] == "mg" and r["scenario"] == "single"
               and r["policy"] == "partial-static")
    row["simulated_within_ci"] = True  # the CLI says inside, its numbers say outside
    s = cosched.validation_sentence(cosched.validation_table(cosched.rows_table(exp)))
    assert "WARNING" in s and "disagrees" in s


def test_validation_says_which_rows_overlapped_foreign_load():
    exp = _exp()
    assert "load from outside" not in cosched.validation_sentence(
        cosched.validation_table(cosched.rows_table(exp)))
    exp["rows"][0]["foreign_load_runs"] = 2
    exp["rows"][1]["foreign_load_runs"] = 1
    v = cosched.validation_table(cosched.rows_table(exp))
    assert int(v["foreign_load_runs"].sum()) == 3
    s = cosched.validation_sentence(v)
    assert "2 row(s) overlapped load from outside" in s and "in 3 run(s)" in s


def test_simulate_rows_are_tolerant():
    rows = cosched.sim_policy_rows(json.loads((FIX / "simulate-8cpu-double.json").read_text()))
    assert [r["policy"] for r in rows] == ["full", "partial-static", "partial-auto"]
    assert rows[1]["improvement_over_full"] == pytest.approx(0.333)
    assert rows[2]["predicted_improvement"] is None and rows[0]["vm2_run_time_s"] == 2.0
    assert all(r["label"] == "simulated" for r in rows)
    assert cosched.sim_policy_rows({}) == [] and cosched.sim_policy_rows(None) == []


def test_sets_and_regroups_text():
    assert cosched.static_sets("double", [2, 1]) == [[0], [1], [2]]
    assert cosched.static_sets("single", [8, 4]) == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert cosched.static_sets("quad", [8, 4])[:2] == [[0, 1], [2, 3]]
    assert cosched.regroups_text([[[0, 1, 2]], [[0], [1], [2]]]) == (
        "#1: {0,1,2} → #2: {0} {1} {2}")
    assert cosched.regroups_text([{"at_s": 0.7, "sets": [[0, 1]]}]) == "#1 @0.7 s: {0,1}"
    assert cosched.regroups_text([]) == "(no regroup)"


def test_render_fixture_writes_figures_tables_and_labels(tmp_path: Path):
    state = {"state": "complete", "failures": []}
    res = cosched.render(tmp_path, _exp(), _sim_records(), state)
    for name in ("improvement-measured", "corun-idle-measured", "improvement-simulated-8cpu"):
        for ext in ("png", "svg"):
            assert (tmp_path / f"{name}.{ext}").stat().st_size > 1000, name
    assert (tmp_path / "heatmap-mg-double-vm1.png").exists()  # the cell with matrices
    for t in ("validation", "rows", "cells", "auto_sets", "sim_runs", "sim_summary", "paper",
              "sim_summary-8cpu"):
        assert (tmp_path / f"{t}.csv").exists(), t
    cells = pd.read_csv(tmp_path / "cells.csv")
    assert len(cells) == len(_exp()["cells"]) and set(cells["label"]) == {"measured"}
    summ = pd.read_csv(tmp_path / "sim_summary.csv")
    st = summ[(summ.kernel == "mg") & (summ.scenario == "double") & (summ.policy == "partial-static")]
    assert st["seeds"].iloc[0] == 3 and st["min"].iloc[0] < st["max"].iloc[0]
    # Every figure title and every caption says what its numbers are.
    assert res["figures"] and all(("MEASURED" in t or "SIMULATED" in t) for _, t in res["figures"])
    caps = _html_labels(tmp_path / "report.html")
    assert len(caps) >= 8
    for c in caps:
        assert any(x in c.lower() for x in LABELS), c
    html = (tmp_path / "report.html").read_text()
    assert "the paper&#x27;s" in html or "the paper's" in html
    assert "4 of them lie inside" in html and "NO (outside)" in html
    assert "up to +100% with static" in html and "+50% with automatic" in html
    sj = json.loads((tmp_path / "summary.json").read_text())
    assert sj["validation"]["inside"] == 4 and sj["validation"]["outside"] == 3
    assert not state["failures"]


def test_render_without_anything_still_writes_a_report(tmp_path: Path):
    state = {"state": "complete", "failures": ["measured experiment: boom"],
             "experiment_status": "FAILED (see above)"}
    cosched.render(tmp_path, None, [], state)
    html = (tmp_path / "report.html").read_text()
    assert "measured experiment: boom" in html and "The paper" in html


# ---------------------------------------------------------------------------------------------
# The command against a stand-in CLI


def test_command_with_a_stand_in_cli(tmp_path: Path, monkeypatch):
    _fake(monkeypatch)
    out = tmp_path / "lab"
    assert lab.main(["cosched", "--out", str(out), "--quick"]) == 0
    sj = json.loads((out / "summary.json").read_text())
    assert sj["state"] == "complete" and not sj["failures"]
    sims = sj["simulations"]
    assert len(sims) == 3 * 2 * 3 * 2 and {s["status"] for s in sims} == {"ok"}
    ep = [s for s in sims if s["kernel"] == "ep"]
    mg = [s for s in sims if s["kernel"] == "mg"]
    assert all("--no-sync" in s["command"] for s in ep)
    assert not any("--no-sync" in s["command"] for s in mg)
    # phase = the measured alone iteration / barriers per iteration (mg: 2)
    assert mg[0]["phase_us"] == pytest.approx(310.2 / 2) and ep[0]["phase_us"] == pytest.approx(120.5)
    assert "--vm 64 --vm 32 --vm 16 --vm 16" in next(s["command"] for s in sims
                                                      if s["host"] == "64cpu-many")
    for h in ("8cpu", "64cpu", "64cpu-many"):
        assert (out / f"improvement-simulated-{h}.png").exists()
    assert (out / "raw" / "experiment.json").exists()


def test_a_failing_part_is_reported_and_the_rest_renders(tmp_path: Path, monkeypatch):
    _fake(monkeypatch, FAKE_SIM_FAIL="1")
    out = tmp_path / "lab"
    assert lab.main(["cosched", "--out", str(out), "--quick"]) == 1
    html = (out / "report.html").read_text()
    assert "simulate: 36 run(s) failed" in html and "simulated failure for the test" in html
    assert (out / "improvement-measured.png").exists() and "Validation" in html

    _fake(monkeypatch, FAKE_NO_EXPERIMENT="1")
    out2 = tmp_path / "lab2"
    assert lab.main(["cosched", "--out", str(out2), "--quick", "--sim-seeds", "1"]) == 1
    html = (out2 / "report.html").read_text()
    assert "has no `preheat cosched experiment`" in html
    assert (out2 / "improvement-simulated-8cpu.png").exists()


def test_from_file_renders_without_measuring(tmp_path: Path, monkeypatch):
    _fake(monkeypatch, FAKE_NO_EXPERIMENT="1")  # would fail if it tried to measure
    out = tmp_path / "lab"
    assert lab.main(["cosched", "--out", str(out), "--from", str(FIX / "experiment.json"),
                     "--sim-seeds", "0"]) == 0
    assert (out / "validation.csv").exists() and not list(out.glob("improvement-simulated-*"))
    assert json.loads((out / "raw" / "experiment.json").read_text())["label"] == "measured"
    # partial-auto's detected matrices: heatmaps and the tree `preheat groups` prints.
    html = (out / "report.html").read_text()
    assert "tree and sets of its last communication matrix" in html and "fake tree" in html


def test_sigterm_writes_a_partial_report(tmp_path: Path, monkeypatch):
    _fake(monkeypatch, FAKE_EXPERIMENT_SLEEP="30")
    out = tmp_path / "lab"
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.monotonic()
    try:
        code = lab.main(["cosched", "--out", str(out), "--quick"])
    finally:
        timer.cancel()
    assert code == 143 and time.monotonic() - t0 < 25
    sj = json.loads((out / "summary.json").read_text())
    assert sj["state"] == "interrupted (partial)" and sj["interrupted_by"] == "SIGTERM"
    assert "INTERRUPTED" in (out / "report.html").read_text()


# ---------------------------------------------------------------------------------------------
# The sweep runner's cosim target


def test_cosim_parameters_and_argv():
    assert sweep.parse_param("vm=8+4,64+32", "cosim") == ("vm", ["8+4", "64+32"])
    assert sweep.parse_param("slice-ms=2,10,50", "cosim") == ("slice_ms", [2, 10, 50])
    assert sweep.parse_param("scenario=double,quad", "cosim") == ("scenario", ["double", "quad"])
    for bad in ("vm=8+x", "vm=8+0", "lead_us=20", "slice_ms=a"):
        with pytest.raises(ValueError):
            sweep.parse_param(bad, "cosim")
    with pytest.raises(ValueError):
        sweep.parse_param("slice_ms=2")  # not a demo parameter
    a = sweep.cosim_args({"vm": "64+32", "slice_ms": 2, "seed": 3})
    assert a[a.index("--cpus") + 1] == "64"  # as many CPUs as the largest VM
    assert [a[i + 1] for i, x in enumerate(a) if x == "--vm"] == ["64", "32"]
    assert a[a.index("--slice-ms") + 1] == "2" and a[a.index("--seed") + 1] == "3"
    d = sweep.cosim_args({"scenario": "quad"})
    assert [d[i + 1] for i, x in enumerate(d) if x == "--vm"] == ["8", "4"]
    assert d[d.index("--cpus") + 1] == "8"
    assert sweep.cosim_argv("preheat", ["--cpus", "8"])[:3] == ["preheat", "cosched", "simulate"]


def _check_cosim_sweep(out: Path, n_points: int, name: str):
    sdir = out / sweep.COSIM_DIR
    sj = json.loads((sdir / "sweep.json").read_text())
    assert sj["state"] == "complete" and sj["target"] == "cosim"
    assert [p["status"] for p in sj["points"]] == ["ok"] * n_points, sj["points"]
    res = pd.read_csv(sdir / "sweep.csv")
    assert set(res["point"]) == {p["id"] for p in sj["points"]}
    assert {name, "policy", "improvement_over_full", "predicted_improvement"} <= set(res.columns)
    assert (sdir / f"sweep-{name}.png").stat().st_size > 1000
    html = (out / "report.html").read_text()
    assert "SIMULATED" in html
    return res


def test_cosim_sweep_two_points_stand_in(tmp_path: Path, monkeypatch):
    _fake(monkeypatch)
    out = tmp_path / "lab"
    code = lab.main(["sweep", "--target", "cosim", "--out", str(out), "--param", "slice_ms=2,10",
                     "--param", "scenario=double"])
    assert code == 0
    res = _check_cosim_sweep(out, 2, "slice_ms")
    st = res[res.policy == "partial-static"].sort_values("slice_ms")
    assert list(st["slice_ms"]) == [2, 10]
    assert st["improvement_over_full"].iloc[0] > st["improvement_over_full"].iloc[1]


def _real_cli_has(*sub: str) -> str:
    """'' when the real binary has `preheat SUB`, else why not."""
    try:
        cli.preheat_bin()
    except cli.ToolError as e:
        return str(e)
    cli._help_cache.clear()
    return "" if cli.help_text(*sub) else f"{cli.preheat_bin()} has no `{' '.join(sub)}`"


def _need_real(*sub: str):
    why = _real_cli_has(*sub)
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI builds the binary, yet: {why}")
        needs("preheat", f"{why} (build the workspace: cargo build --release)")


def test_cosim_sweep_two_points_real_simulator(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("PREHEAT_BIN", raising=False)
    _need_real("cosched", "simulate")
    out = tmp_path / "lab"
    code = lab.main(["sweep", "--target", "cosim", "--out", str(out), "--param", "slice_ms=2,10",
                     "--param", "scenario=double", "--param", "duration_s=2",
                     "--param", "detect_s=0.5"])
    assert code == 0
    res = _check_cosim_sweep(out, 2, "slice_ms")
    st = res[res.policy == "partial-static"]
    assert ((st["improvement_over_full"] > 0.2) & (st["improvement_over_full"] < 0.45)).all()


@pytest.mark.slow
def test_end_to_end_quick_real_binary(tmp_path: Path, monkeypatch):
    """`preheat lab cosched --quick` through the real binary, one kernel (mg), one 1 s
    repetition per cell and one simulator seed (the suite's time: --quick alone took 187-225 s
    of a 17-minute suite; with mg and ep 120 s of a 23-minute one)."""
    monkeypatch.delenv("PREHEAT_BIN", raising=False)
    _need_real("cosched", "experiment")
    _need_real("cosched", "simulate")
    out = tmp_path / "lab"
    t0 = time.monotonic()
    code = lab.main(["cosched", "--out", str(out), "--quick", "--kernels", "mg", "--reps", "1",
                     "--seconds", "1", "--sim-seeds", "1"])
    took = time.monotonic() - t0
    sj = json.loads((out / "summary.json").read_text())
    assert code == 0, sj["failures"]
    assert sj["state"] == "complete"
    assert {s["status"] for s in sj["simulations"]} == {"ok"}
    v = pd.read_csv(out / "validation.csv")
    assert set(v["kernel"]) == {"mg"} and set(v["scenario"]) == {"single", "double"}
    for f in ("improvement-measured.png", "corun-idle-measured.png",
              "improvement-simulated-8cpu.png", "improvement-simulated-64cpu.png", "report.html"):
        assert (out / f).exists(), f
    print(f"end-to-end --quick took {took:.0f} s")


def _qemu_of(run_dir: Path) -> list[int]:
    """QEMU processes started with RUN_DIR (they inherit PREHEAT_RUN_DIR)."""
    want = f"PREHEAT_RUN_DIR={run_dir}".encode()
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if "qemu" in (p / "comm").read_text() and want in (p / "environ").read_bytes():
                found.append(int(p.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_end_to_end_guests_quick_real_binary(tmp_path: Path, monkeypatch, request):
    """`preheat lab cosched --guests --quick` through the real binary and real QEMU guests, cut
    to the double scenario (VM1 = 2 vCPUs with one instance each, VM2 = 1 vCPU), one 3 s
    repetition per policy and one simulator seed: the measured rows with the prediction and the
    simulation beside them, co-run and foreign load per run, partial-auto's regroups, the
    real-VM figures, and no QEMU or journal entry left behind."""
    monkeypatch.delenv("PREHEAT_BIN", raising=False)
    _need_real("cosched", "experiment")
    _need_real("cosched", "simulate")
    if not any((Path(d) / "qemu-system-x86_64").exists()
               for d in os.environ.get("PATH", "").split(os.pathsep)):
        if os.environ.get("CI"):
            pytest.fail("scripts/test.sh installs QEMU under CI")
        needs("qemu-system-x86_64", "QEMU is not installed")
    # A short run directory: the agents' Unix socket paths must fit in 107 bytes, and pytest's
    # tmp_path plus the experiment's scratch directory do not.
    rd = Path(tempfile.mkdtemp(prefix="ph-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(rd, ignore_errors=True))
    monkeypatch.setenv("PREHEAT_RUN_DIR", str(rd))
    out = tmp_path / "lab"
    code = lab.main(["cosched", "--guests", "--quick", "--scenarios", "double", "--reps", "1",
                     "--seconds", "3", "--sim-seeds", "1", "--out", str(out)])
    sj = json.loads((out / "summary.json").read_text())
    assert code == 0, sj["failures"]
    assert sj["state"] == "complete"
    v = json.loads((out / "raw" / "experiment.json").read_text())
    assert (v["label"], v["vms"]) == ("measured", "guests")
    assert len(v["cells"]) == 4, v["cells"]
    for c in v["cells"]:
        assert c["window_s"] > 0.5, c
        assert c["others_share"] is not None and c["steal_share"] is not None, c
        assert len(c["instance_rates"]) == 3, f"two instances in VM1, one in VM2: {c}"
        if c["policy"] == "partial-auto":
            assert c["regroups"], f"no regroup: {c}"
    rows = v["rows"]
    assert sorted(r["policy"] for r in rows) == ["none", "partial-auto", "partial-static"]
    for r in rows:
        for k in ("improvement_over_full", "predicted", "simulated"):
            assert r[k] is not None and math.isfinite(r[k]), (k, r)
        assert 0.0 <= r["full_corun_fraction_median"] <= 1.0, r
    assert v["calibration"][0]["alone_iteration_us"] > 0
    val = pd.read_csv(out / "validation.csv")
    assert set(val["kernel"]) == {"mg"} and set(val["scenario"]) == {"double"}
    for f in ("improvement-measured.png", "corun-idle-measured.png", "report.html"):
        assert (out / f).exists(), f
    assert "QEMU guests" in (out / "report.html").read_text()
    assert not _qemu_of(rd), f"QEMU left running: {_qemu_of(rd)}"
    journal = list((rd / "guests").iterdir()) if (rd / "guests").is_dir() else []
    assert not journal, f"journal entries left: {journal}"
