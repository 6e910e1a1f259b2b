"""The lab's third-party Python packages, and the one line that says how to install them.

`python -m preheat_lab` (what `preheat lab` runs) parses and checks its command line with the
standard library only, so `--help` works on a machine where nothing but Python is installed.
The experiment modules import numpy, pandas and matplotlib at their top; `__main__` imports
them only inside `needed_for(...)`, once a command is about to run. A package that is missing
then ends the run with one line naming it and the command that installs it, and exit status 2.

The list of packages is python/pyproject.toml's (`dependencies`; the `lab` extra adds pyarrow and
rich, which the lab uses when present; the `ray` extra is for `sweep --executor ray`).
`scripts/setup-lab.sh` installs the package with its `lab` extra. `REQUIRED` repeats the
`dependencies` names for the check before importing (a test holds the two equal).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

#: python/pyproject.toml's `dependencies`, by import name (here the same as the package name).
REQUIRED = ("numpy", "pandas", "matplotlib")
#: Where pyproject.toml is in a source checkout (python/), and the setup script beside it.
PYTHON_DIR = Path(__file__).resolve().parents[1]
SETUP_LAB = PYTHON_DIR.parent / "scripts" / "setup-lab.sh"


def missing(packages: Sequence[str]) -> list[str]:
    """The PACKAGES this Python cannot import (looked up, not imported)."""
    out = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def install_command(packages: Sequence[str], extras: Sequence[str] = ("lab",)) -> str:
    """How to install the lab's packages with EXTRAS for the Python running this: the setup
    script for the `lab` extra (it also installs the servers), else pip on pyproject.toml (pip
    on PACKAGES outside a source checkout)."""
    py = shlex.quote(sys.executable or "python3")
    if not (PYTHON_DIR / "pyproject.toml").is_file():
        return f"{py} -m pip install " + " ".join(packages)
    target = f"{PYTHON_DIR}[{','.join(extras)}]"
    pip = f"{py} -m pip install -e {shlex.quote(target)}"
    if tuple(extras) == ("lab",) and SETUP_LAB.is_file():
        return f"{shlex.quote(str(SETUP_LAB))} (as root), or {pip}"
    return pip


def exit_missing(packages: Sequence[str], command: str,
                 extras: Sequence[str] = ("lab",)) -> NoReturn:
    """One line on stderr naming the missing PACKAGES and how to install them; exit status 2."""
    s = "s" if len(packages) > 1 else ""
    print(f"error: preheat lab {command} needs the Python package{s} {', '.join(packages)}, "
          f"missing for {sys.executable}: install with {install_command(packages, extras)}",
          file=sys.stderr, flush=True)
    raise SystemExit(2)


@contextmanager
def needed_for(command: str, ray: bool = False) -> Iterator[None]:
    """Around the imports of COMMAND's modules: every package it needs must be importable
    (REQUIRED, and ray with RAY), or the run ends with `exit_missing`; so does an import in the
    block that fails for a missing third-party package."""
    extras = ("lab", "ray") if ray else ("lab",)
    gone = missing(REQUIRED + (("ray",) if ray else ()))
    if gone:
        exit_missing(gone, command, ("ray",) if gone == ["ray"] else extras)
    try:
        yield
    except ImportError as e:
        top = (e.name or "").partition(".")[0]
        if not top or top == __package__:
            raise
        exit_missing([top], command, extras)
