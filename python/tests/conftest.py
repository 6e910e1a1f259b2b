"""Make `preheat_lab` importable however pytest is started (from python/ or the repo root); log
every skip with what it lacked ($PREHEAT_SKIP_LOG, see preheat_lab.skips); give the programs the
tests start a temporary directory (and agent run directory) of their own, removed at the end of
the session."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

_PY = str(Path(__file__).resolve().parents[1])
if _PY not in sys.path:
    sys.path.insert(0, _PY)

from preheat_lab import skips  # noqa: E402  (importable only after the path above)

# The preheat CLI and the servers it starts put their scratch directories (a demo's server data
# can be hundreds of MB) under $TMPDIR. Point the child processes of this session at a directory
# the session owns and removes when it ends, so a child killed before it could clean up (a
# timeout, SIGKILL) leaves nothing behind. This process keeps the temp dir the session started
# with: pytest's tmp_path is resolved against it. pytest-xdist's workers inherit the controller's
# $TMPDIR, so the original one travels in $PREHEAT_PYTEST_BASE_TMP (nesting one session's
# directory in another's made Unix socket paths longer than their 107 bytes).
_BASE_TMP = os.environ.setdefault("PREHEAT_PYTEST_BASE_TMP", tempfile.gettempdir())
tempfile.tempdir = _BASE_TMP
_CHILD_TMP = tempfile.mkdtemp(prefix="preheat-pytest-", dir=_BASE_TMP)
os.environ["TMPDIR"] = _CHILD_TMP
# The agents' run directory (their sockets, logs and the wake-up calibration) too: the default
# /tmp/preheat outlives the session, and the agents of a `comm` run or of a lab demo left their
# logs there. Short enough for the agents' Unix socket paths (107 bytes). A test that needs a
# run directory of its own still sets one; a caller's own $PREHEAT_RUN_DIR is kept.
_RUN_DIR = os.environ.setdefault("PREHEAT_RUN_DIR", os.path.join(_CHILD_TMP, "run"))


def pytest_sessionfinish(session, exitstatus):
    left = sorted(p.name for p in Path(_CHILD_TMP).iterdir()
                  if str(p) != _RUN_DIR) if os.path.isdir(_CHILD_TMP) else []
    if left:
        print(f"\nconftest: removing what the tests' programs left in {_CHILD_TMP}: "
              + ", ".join(left[:20]) + (" ..." if len(left) > 20 else ""))
    shutil.rmtree(_CHILD_TMP, ignore_errors=True)


# Whether this process is a pytest-xdist worker (set by pytest_configure; a nested pytest run a
# test starts inherits PYTEST_XDIST_WORKER from its environment, so that cannot tell).
_XDIST_WORKER = False


def pytest_configure(config):
    global _XDIST_WORKER
    _XDIST_WORKER = hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    """One line in $PREHEAT_SKIP_LOG per skipped test (setup or call), with its component (by
    the controller alone under pytest-xdist, which sees every worker's reports)."""
    if _XDIST_WORKER:
        return
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    component, reason = skips.split_message(message)
    skips.record("python", report.nodeid, component, reason)
