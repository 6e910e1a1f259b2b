"""The sleeping-CPUs experiments end to end at tiny scale: every experiment runs the real CLI,
produces its data, and the report carries the tools' labels."""

import json
from pathlib import Path

import pytest

from preheat_lab import sleeping
from preheat_lab.cli import ToolError, preheat_bin


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    try:
        preheat_bin()
    except ToolError as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("sleeping")
    return out, sleeping.run_all(out, quick=True)


def test_every_experiment_ran(results):
    out, res = results
    errors = {p.stem: p.read_text() for p in out.glob("*.error.txt")}
    assert not errors, errors
    assert set(res) == set(sleeping.EXPERIMENTS)
    html = (out / "report.html").read_text()
    for word in ("measured", "emulated", "modeled"):
        assert word in html


def test_figure1_has_every_policy_and_gap(results):
    out, res = results
    df = res["figure1"]
    assert set(df.policy) == set(sleeping.POLICIES)
    assert set(df.device) == {"file", "emulated"}
    assert set(df[df.device == "emulated"].label) == {"emulated"}
    assert set(df[df.device == "file"].label) == {"measured"}
    assert (df.n > 0).all() and (df.p99_us >= df.p50_us).all()
    assert (out / "figure1.png").stat().st_size > 1000


def test_wakeups_and_stage_and_quiesce(results):
    out, res = results
    assert {"none"} <= set(res["wakeups"].mech)
    stage = res["stage"]
    assert set(stage["mode"]) >= {"direct", "staged"}
    assert (stage.n > 0).all()
    q = json.loads((out / "quiesce.json").read_text())
    assert q["modes"] and all(m["latency"]["n"] > 0 for m in q["modes"])
