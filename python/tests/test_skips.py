"""Skips that say what they lack: the skip log written by the tests' conftest, and the summary
scripts/test.sh prints at the end (scripts/skip-summary.py), with and without CI."""

import importlib.util
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

from preheat_lab import skips

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent


def _summary_module():
    spec = importlib.util.spec_from_file_location("skip_summary", REPO / "scripts" / "skip-summary.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SAMPLE = (
    "rust\tlab::demo_on_mariadb_runs_tpcc_transactions\tmariadbd\tmariadbd is not installed\n"
    "rust\tpower::quiesce_freezes\troot\tnot root: cannot create cgroups\n"
    "python\ttests/test_sweep.py::test_sweep_one_point_ray\tray\tray is not importable\n"
    "test.sh\tfuzz\tnightly\tneeds a nightly toolchain and cargo-fuzz\n"
)
INSTALLED = "memcached,nginx,redis-server,mariadbd,ray,ruff,mypy,preheat"


def _run(tmp_path: Path, text: str, env: dict) -> tuple:
    log = tmp_path / "skips.tsv"
    log.write_text(text)
    mod = _summary_module()
    out = io.StringIO()
    code = mod.summarize(mod.read_log(str(log)), set(INSTALLED.split(",")), bool(env.get("CI")),
                         out)
    return code, out.getvalue()


def test_summary_lists_every_skip_without_ci(tmp_path):
    code, out = _run(tmp_path, SAMPLE, {})
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "test.sh: 4 tests skipped:"
    assert len(lines) == 5
    assert "lab::demo_on_mariadb_runs_tpcc_transactions  [mariadbd]  mariadbd is not installed" in out
    assert "[nightly]" in out and lines[4].lstrip().startswith("test.sh")


def test_ci_fails_on_a_skip_for_what_test_sh_installs(tmp_path):
    code, out = _run(tmp_path, SAMPLE, {"CI": "1"})
    assert code == 1
    assert "FAILED (CI): 2 skip(s)" in out and "(mariadbd, ray)" in out


def test_ci_accepts_skips_for_what_the_machine_lacks(tmp_path):
    only_caps = "".join(ln + "\n" for ln in SAMPLE.splitlines() if "\troot\t" in ln or "nightly" in ln)
    code, out = _run(tmp_path, only_caps, {"CI": "1"})
    assert code == 0 and "2 tests skipped" in out


def test_no_skip_and_no_log(tmp_path):
    mod = _summary_module()
    out = io.StringIO()
    assert mod.summarize(mod.read_log(str(tmp_path / "missing.tsv")), set(), True, out) == 0
    assert out.getvalue() == "test.sh: no test skipped\n"
    # An empty CI value counts as unset; malformed lines keep what they have.
    (tmp_path / "odd.tsv").write_text("rust\tonly_a_name\n\n")
    assert mod.main([str(tmp_path / "odd.tsv"), "--installed", "x"], env={"CI": ""}) == 0


def test_script_runs_standalone(tmp_path):
    log = tmp_path / "s.tsv"
    log.write_text(SAMPLE)
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "skip-summary.py"), str(log),
                        "--installed", INSTALLED], capture_output=True, text=True,
                       env=dict(os.environ, CI="true"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.startswith("test.sh: 4 tests skipped:")


def test_messages_carry_the_component():
    msg = skips.needs_message("memcaslap", "memcaslap is not installed")
    assert skips.split_message("Skipped: " + msg) == ("memcaslap", "memcaslap is not installed")
    assert skips.split_message("no binary") == (skips.UNSPECIFIED, "no binary")
    assert skips.log_line("python", "t::x", "ray", "a\tb\nc") == "python\tt::x\tray\ta b c\n"


def test_conftest_logs_every_skip(tmp_path):
    """A pytest run with this suite's conftest: needs(), a skipif marker naming the component, a
    bare skip, a skip in a fixture, a pass and an xfail: one log line per skipped test."""
    d = tmp_path / "suite"
    d.mkdir()
    shutil.copy(TESTS / "conftest.py", d / "conftest.py")
    (d / "test_sample.py").write_text(
        "import pytest\n"
        "from preheat_lab.skips import needs, needs_message\n\n"
        "@pytest.fixture\n"
        "def server():\n"
        "    needs('redis-server', 'redis-server is not installed')\n\n"
        "def test_needs():\n"
        "    needs('memcaslap', 'memcaslap is not installed (Debian: libmemcached-tools)')\n\n"
        "@pytest.mark.skipif(True, reason=needs_message('root', 'not root'))\n"
        "def test_marker():\n"
        "    pass\n\n"
        "def test_bare():\n"
        "    pytest.skip('something unnamed')\n\n"
        "def test_fixture(server):\n"
        "    pass\n\n"
        "def test_passes():\n"
        "    pass\n\n"
        "@pytest.mark.xfail(reason='known')\n"
        "def test_xfails():\n"
        "    assert False\n")
    log = tmp_path / "skips.tsv"
    env = dict(os.environ, PREHEAT_SKIP_LOG=str(log), PYTHONPATH=str(TESTS.parent))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(d)],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = sorted(tuple(ln.split("\t")) for ln in log.read_text().splitlines())
    assert rows == [
        ("python", "suite/test_sample.py::test_bare", skips.UNSPECIFIED, "something unnamed"),
        ("python", "suite/test_sample.py::test_fixture", "redis-server",
         "redis-server is not installed"),
        ("python", "suite/test_sample.py::test_marker", "root", "not root"),
        ("python", "suite/test_sample.py::test_needs", "memcaslap",
         "memcaslap is not installed (Debian: libmemcached-tools)"),
    ]
