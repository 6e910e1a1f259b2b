"""The lab on a machine where only Python is installed: `--help` of the lab and of every command
works without numpy, pandas, matplotlib, pyarrow, rich or ray, and a command that runs says in
one line what is missing and how to install it (exit status 2, no traceback).

"Only Python" is made two ways at once, so an installed package cannot leak in: the child runs
with `-S` (no site-packages) and a finder first on sys.meta_path refuses the lab's third-party
packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preheat_lab import __main__ as lab
from preheat_lab import deps
from preheat_lab.skips import needs

PYTHON_DIR = Path(__file__).resolve().parents[1]
THIRD_PARTY = ("numpy", "pandas", "matplotlib", "pyarrow", "rich", "ray")
COMMANDS = sorted(lab.build_parser()[1])

# A finder first on sys.meta_path that refuses THIRD_PARTY, as if they were not installed.
_BLOCKER = f"""
import runpy, sys
BLOCKED = {THIRD_PARTY!r}
class Blocker:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Blocker)
"""
# `python -m preheat_lab ARGS` (runpy, as -m does) behind the blocker.
_BLOCKED_MAIN = _BLOCKER + """
sys.argv = ["preheat_lab", *sys.argv[1:]]
runpy.run_module("preheat_lab", run_name="__main__", alter_sys=True)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(PYTHON_DIR)
    return env


def _bare(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-c", _BLOCKED_MAIN, *args], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=60)


def test_the_environment_has_no_third_party_packages(tmp_path: Path):
    for name in THIRD_PARTY:
        code = f"{_BLOCKER}\nimport {name}"
        p = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr, (name, p.stderr)


def test_the_commands_are_the_ones_documented():
    assert set(COMMANDS) >= {"table1", "peer", "sweep", "report", "sleeping", "comm", "cosched",
                             "affinity"}


@pytest.mark.parametrize("args", [["--help"]] + [[c, "--help"] for c in COMMANDS],
                         ids=lambda a: " ".join(a))
def test_help_needs_only_the_standard_library(args: list[str], tmp_path: Path):
    p = _bare(args, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert "usage:" in p.stdout


@pytest.mark.parametrize("args", [
    ["table1", "--out", "OUT", "--quick"],
    ["affinity", "--out", "OUT", "--quick"],
    ["cosched", "--out", "OUT", "--quick"],
    ["peer", "--out", "OUT", "--quick"],
    ["sweep", "--out", "OUT", "--param", "lead_us=65", "--quick"],
    ["sleeping", "--out", "OUT", "--quick"],
    ["comm", "--out", "OUT", "--quick"],
    ["report", "--out", "OUT"],
], ids=lambda a: a[0])
def test_a_command_without_its_packages_says_how_to_install_them(args: list[str],
                                                                 tmp_path: Path):
    out = tmp_path / "out"
    p = _bare([str(out) if a == "OUT" else a for a in args], tmp_path)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert f"preheat lab {args[0]} needs" in line and "numpy, pandas, matplotlib" in line
    assert str(deps.SETUP_LAB) in line and f"-m pip install -e '{PYTHON_DIR}[lab]'" in line
    assert not out.exists()  # nothing started


def test_a_bad_argument_is_reported_before_the_packages(tmp_path: Path):
    p = _bare(["sweep", "--out", str(tmp_path / "o"), "--param", "nope=1"], tmp_path)
    assert p.returncode == 2 and "unknown demo parameter" in p.stderr, p.stderr
    assert "needs the Python package" not in p.stderr


def test_ray_is_named_with_its_extra(tmp_path: Path):
    p = _bare(["sweep", "--out", str(tmp_path / "o"), "--param", "lead_us=65", "--executor",
               "ray"], tmp_path)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "ray" in p.stderr and f"'{PYTHON_DIR}[lab,ray]'" in p.stderr


def test_required_is_pyprojects_dependency_list():
    try:
        import tomllib
    except ImportError:
        needs("tomllib", "Python 3.11 or newer reads pyproject.toml")
    meta = tomllib.loads((PYTHON_DIR / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("<")[0].strip() for d in meta["dependencies"]]
    assert sorted(names) == sorted(deps.REQUIRED)
    lab_extra = [d.split(">")[0].strip() for d in meta["optional-dependencies"]["lab"]]
    assert set(lab_extra) <= set(THIRD_PARTY)


def test_preheat_lab_help_through_the_cli(tmp_path: Path):
    """`preheat lab ...` runs `python3 -m preheat_lab`: with a python3 that has no
    site-packages first on PATH, its help works and a command says what is missing."""
    from preheat_lab.cli import ToolError, preheat_bin

    try:
        binary = preheat_bin()
    except ToolError as e:
        needs("preheat", str(e))
    if not Path(binary).exists() and not shutil.which(binary):
        needs("preheat", f"{binary} does not exist (cargo build)")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    (shim / "python3").chmod(0o755)
    env = _env()
    env.pop("PYTHONPATH")
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    env["PREHEAT_PYTHON_DIR"] = str(PYTHON_DIR)
    bare = subprocess.run(["python3", "-c", "import pandas"], env=env, capture_output=True)
    if bare.returncode == 0:  # then `table1` below would measure: never
        pytest.fail(f"{sys.executable} -S imports pandas: no bare Python to test with")
    for args in (["--help"], ["table1", "--help"]):
        p = subprocess.run([binary, "lab", *args], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0 and "usage:" in p.stdout, p.stderr
        assert "Traceback" not in p.stderr
    p = subprocess.run([binary, "lab", "table1", "--out", str(tmp_path / "o"), "--quick"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.splitlines()) == 1 and "needs the Python packages" in p.stderr


def test_the_binary_is_found_in_cargos_target_directory(tmp_path: Path, monkeypatch):
    """A suite run with $CARGO_TARGET_DIR set builds there; the lab looks there too."""
    from preheat_lab import cli

    built = tmp_path / "release" / "preheat"
    built.parent.mkdir()
    built.write_text("")
    monkeypatch.delenv("PREHEAT_BIN", raising=False)
    monkeypatch.setenv("CARGO_TARGET_DIR", str(tmp_path))
    assert cli.preheat_bin() == str(built)
    assert cli.target_dir() == tmp_path
