"""Sweeps: parameter parsing and the grid (pure), then 2 points on kv with the local executor and
1 point with the Ray executor (skipped with the reason when Ray is not importable)."""

import json

import pandas as pd
import pytest

from preheat_lab import __main__ as lab
from preheat_lab import cli, sweep, table1
from preheat_lab.skips import needs


def test_parse_param():
    assert sweep.parse_param("lead_us=20,65,200") == ("lead_us", [20, 65, 200])
    assert sweep.parse_param("lead-us=2.5") == ("lead_us", [2.5])
    assert sweep.parse_param("keep=4,6") == ("keep", [4, 6])
    assert sweep.parse_param("strategies=wake,lines,wake+lines") == (
        "strategies", ["wake", "lines", "wake+lines"])
    assert sweep.parse_param("strategies=wake,lines;all") == ("strategies", ["wake,lines", "all"])
    for bad in ("lead_us", "nope=1", "keep=x", "keep=", "keep=4,4"):
        with pytest.raises(ValueError):
            sweep.parse_param(bad)


def test_grid_is_the_cartesian_product():
    g = sweep.grid([("lead_us", [20, 65]), ("keep", [4, 6, 8])])
    assert len(g) == 6 and g[0] == {"lead_us": 20, "keep": 4} and g[-1] == {"lead_us": 65, "keep": 8}
    with pytest.raises(ValueError):
        sweep.grid([("keep", [4]), ("keep", [6])])


def test_point_options_map_to_demo_flags():
    o = sweep.point_options(table1.DemoOptions(rounds=7), {"lead_us": 200, "gap_merge": 2,
                                                           "strategies": "wake,lines"})
    a = o.args()
    assert a[:2] == ["--rounds", "7"]
    assert a[a.index("--lead-us") + 1] == "200" and a[a.index("--gap-merge") + 1] == "2"
    assert a[a.index("--strategies") + 1] == "wake,lines"
    assert "--keep" not in a  # not given: the CLI's default


def _need_cli():
    try:
        cli.preheat_bin()
    except cli.ToolError as e:
        needs("preheat", str(e))


def _check(out, n_points):
    sj = json.loads((out / "sweep" / "sweep.json").read_text())
    assert sj["state"] == "complete"
    assert [p["status"] for p in sj["points"]] == ["ok"] * n_points, sj["points"]
    res = pd.read_csv(out / "sweep" / "sweep.csv")
    assert set(res["point"]) == {p["id"] for p in sj["points"]}
    assert {"lead_us", "mode", "n", "p50", "removed_p50"} <= set(res.columns)
    assert (res["n"] == 5).all()
    assert (out / "sweep" / "sweep-lead_us.png").stat().st_size > 1000
    assert "Sweep on" in (out / "report.html").read_text()
    return sj, res


def test_sweep_two_points_local(tmp_path):
    _need_cli()
    out = tmp_path / "lab"
    code = lab.main(["sweep", "--out", str(out), "--param", "lead_us=20,200", "--server", "kv",
                     "--quick", "--executor", "local"])
    assert code == 0
    sj, res = _check(out, 2)
    assert sorted(res["lead_us"].unique()) == [20, 200]
    assert sj["jobs"] == 1


def test_sweep_one_point_ray(tmp_path):
    _need_cli()
    try:
        import ray  # noqa: F401
    except ImportError:
        needs("ray", "ray is not importable (pip install ray)")
    out = tmp_path / "lab"
    code = lab.main(["sweep", "--out", str(out), "--param", "lead_us=65", "--server", "kv",
                     "--quick", "--executor", "ray"])
    assert code == 0
    sj, _ = _check(out, 1)
    assert sj["executor"] == "ray" and sj["points"][0]["host"]


def test_ray_missing_says_how_to_install_it(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    with pytest.raises(SystemExit) as e:
        sweep.RayExecutor(None, None)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ray" in err and "-m pip install" in err, err
