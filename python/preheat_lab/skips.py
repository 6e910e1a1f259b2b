"""Skips that say what they lack.

A test that cannot run here skips through `needs(component, reason)`: the component is what is
missing, named the way the test command knows it (a Debian binary such as `memcaslap` or
`redis-server`, a Python package such as `ray`, the `preheat` binary of this workspace, or a
capability such as `root`). The test suite's conftest appends one line per skipped test to the
file named by $PREHEAT_SKIP_LOG (`suite<TAB>test<TAB>component<TAB>reason`), the format the Rust
tests and scripts/test.sh write too; scripts/skip-summary.py prints them at the end of the run.
"""

from __future__ import annotations

import os
import re
from typing import NoReturn

SKIP_LOG_ENV = "PREHEAT_SKIP_LOG"
#: The component of a skip that did not name one (a bare `pytest.skip`).
UNSPECIFIED = "unspecified"

_NEEDS = re.compile(r"needs ([A-Za-z0-9_.+-]+): (.*)", re.S)


def needs_message(component: str, reason: str) -> str:
    """The skip message `needs COMPONENT: REASON` (what `split_message` reads back)."""
    return f"needs {component}: {reason}"


def needs(component: str, reason: str) -> NoReturn:
    """Skip the running test because COMPONENT is missing (REASON says how to get it)."""
    import pytest

    pytest.skip(needs_message(component, reason))


def split_message(message: str) -> tuple[str, str]:
    """(component, reason) of a skip message; UNSPECIFIED when it names no component."""
    message = message.strip()
    if message.startswith("Skipped: "):
        message = message[len("Skipped: "):]
    m = _NEEDS.fullmatch(message)
    if m:
        return m.group(1), m.group(2).strip()
    return UNSPECIFIED, message


def _field(text: str) -> str:
    return " ".join(str(text).split())  # no tabs or newlines inside a field


def log_line(suite: str, test: str, component: str, reason: str) -> str:
    return "\t".join(_field(x) for x in (suite, test, component, reason)) + "\n"


def record(suite: str, test: str, component: str, reason: str) -> None:
    """Append one skip to $PREHEAT_SKIP_LOG (nothing when it is not set)."""
    path = os.environ.get(SKIP_LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(log_line(suite, test, component, reason))
