#!/usr/bin/env python3
"""The end of scripts/test.sh: which tests skipped, for what, and whether that is allowed.

    skip-summary.py LOG [--installed COMPONENT,...]

LOG holds one line per skip, `suite<TAB>test<TAB>component<TAB>reason` (the Rust tests, the
Python tests' conftest and test.sh itself append to the file named by $PREHEAT_SKIP_LOG). Prints
"test.sh: N tests skipped:" and one line per skip, or "test.sh: no test skipped". With $CI set
(non-empty), exits 1 when a skip's component is one of --installed: the components test.sh
installs itself, so on CI such a skip means the set-up is broken, not that the machine lacks
something. Standard library only: it runs even when the Python dependencies could not be
installed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TextIO


class Skip(NamedTuple):
    suite: str
    test: str
    component: str
    reason: str


def read_log(path: str) -> list[Skip]:
    """The skips in PATH (none when it does not exist); malformed lines keep what they have."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        if not line.strip():
            continue
        parts = line.split("\t", 3)
        parts += [""] * (4 - len(parts))
        suite, test, component, reason = (p.strip() for p in parts)
        out.append(Skip(suite or "?", test or "?", component or "unspecified", reason))
    return out


def summarize(skips: Sequence[Skip], installed: set[str], ci: bool,
              out: TextIO = sys.stdout) -> int:
    """Print the summary; the exit code (1: CI and a skip for an installed component)."""
    if not skips:
        print("test.sh: no test skipped", file=out)
        return 0
    print(f"test.sh: {len(skips)} test{'s' if len(skips) != 1 else ''} skipped:", file=out)
    w_suite = max(len(s.suite) for s in skips)
    for s in skips:
        print(f"  {s.suite:<{w_suite}}  {s.test}  [{s.component}]  {s.reason}", file=out)
    broken = [s for s in skips if s.component in installed]
    if broken and ci:
        names = sorted({s.component for s in broken})
        print(f"test.sh: FAILED (CI): {len(broken)} skip(s) for what test.sh installs itself "
              f"({', '.join(names)}): the set-up did not provide it; see the lines above",
              file=out)
        return 1
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="the skip log ($PREHEAT_SKIP_LOG)")
    ap.add_argument("--installed", default="",
                    help="comma- or space-separated components test.sh installs")
    a = ap.parse_args(argv)
    installed = {c for c in a.installed.replace(",", " ").split() if c}
    return summarize(read_log(a.log), installed, bool(env.get("CI")))


if __name__ == "__main__":
    sys.exit(main())
