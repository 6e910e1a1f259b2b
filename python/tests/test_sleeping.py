"""The sleeping-CPUs experiments end to end at tiny scale: every experiment runs the real CLI,
produces its data, and the report carries the tools' labels."""

import json

import pytest

from preheat_lab import sleeping
from preheat_lab.cli import ToolError, preheat_bin, run_json
from preheat_lab.skips import needs

# The one residency object every command emits (stage bench, power residency, quiesce-bench).
RESIDENCY_KEYS = {"label", "source", "definitions", "interval", "windows", "cpus_measured",
                  "deep_idle_share", "poll_share", "busy_share", "wakeups", "wakeups_per_s",
                  "unavailable", "per_cpu", "notes"}


def _q(value, unit="share"):
    return {"value": value, "unit": unit, "label": "measured"}


def test_residency_columns_from_the_one_shape():
    res = {"label": "measured", "cpus_measured": 2, "windows": 3,
           "deep_idle_share": _q(0.75), "busy_share": _q(0.25),
           "wakeups_per_s": _q(12.5, "1/s")}
    assert sleeping._residency(res) == {
        "residency_label": "measured", "residency_cpus": 2, "residency_windows": 3,
        "deep_idle_share": 0.75, "busy_share": 0.25, "wakeups_per_s": 12.5}
    # Residency unavailable: the columns are there, empty.
    assert set(sleeping._residency(None).values()) == {None}
    # Without a cpuidle driver: shares from /proc/stat, wakeups null.
    res["wakeups_per_s"] = None
    assert sleeping._residency(res)["wakeups_per_s"] is None


def _fake_machine(root, cpuidle: bool):
    """A fake /sys and /proc tree of two CPUs, with or without cpuidle states."""
    cpu = root / "sys/devices/system/cpu"
    for n in (0, 1):
        (cpu / f"cpu{n}/topology").mkdir(parents=True)
        for k, name in enumerate(["POLL", "haltpoll idle"] if cpuidle else []):
            d = cpu / f"cpu{n}/cpuidle/state{k}"
            d.mkdir(parents=True)
            for f, v in (("name", name), ("time", "0"), ("usage", "0")):
                (d / f).write_text(v + "\n")
    (cpu / "online").write_text("0-1\n")
    (cpu / "cpuidle").mkdir(exist_ok=True)
    (cpu / "cpuidle/current_driver").write_text("haltpoll\n" if cpuidle else "none\n")
    (root / "proc").mkdir()
    (root / "proc/stat").write_text("cpu 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0\n"
                                    "cpu1 0 0 0 0 0 0 0 0\n")


@pytest.mark.parametrize("cpuidle", [True, False], ids=["haltpoll", "none"])
def test_quiescence_on_both_machine_variants(tmp_path, cpuidle):
    """The quiescence experiment's request loop runs on either variant; without cpuidle the
    energy columns are empty and say why (a fake machine tree, so both run on any machine)."""
    try:
        preheat_bin()
    except ToolError as e:
        needs("preheat", str(e))
    _fake_machine(tmp_path, cpuidle)
    d = run_json(["power", "quiesce-bench", "--duration-s", "0.6", "--rounds", "1",
                  "--machine-root", str(tmp_path), "--json"])
    df = sleeping.quiesce_rows(d)
    assert (df.n > 0).all() and set(df.residency_label) == {"measured"}
    if cpuidle:
        assert df.energy_J.notna().all() and df.energy_unavailable.isna().all()
    else:
        assert df.energy_J.isna().all() and df.wakeups_per_s.isna().all()
        assert df.energy_unavailable.str.contains("no cpuidle driver").all()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    try:
        preheat_bin()
    except ToolError as e:
        needs("preheat", str(e))
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
    assert set(res["quiesce"].residency_label) == {"measured"}


def test_every_command_emits_the_one_residency_shape(results):
    out, _ = results
    power = run_json(["power", "residency", "--for-s", "0.2", "--json"])
    shapes = [power["residency"]]
    shapes += [m["residency"] for m in json.loads((out / "quiesce.json").read_text())["modes"]]
    shapes += [m["residency"] for m in json.loads((out / "stage.json").read_text())["modes"]
               if m.get("residency")]
    for r in shapes:
        assert set(r) == RESIDENCY_KEYS
        assert r["label"] == "measured" and r["cpus_measured"] == len(r["per_cpu"]) > 0
        assert r["deep_idle_share"]["label"] == "measured"
        for c in r["per_cpu"]:
            assert set(c) == set(shapes[0]["per_cpu"][0])
