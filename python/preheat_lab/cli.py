"""Running the `preheat` CLI and reading its JSON output: the one way the lab's experiments do
it.

* `preheat_bin()` finds the binary; `require(...)` also checks that it has the commands an
  experiment runs (a build too old or not built says how to get one).
* `run_json(args)` runs a short command and returns its JSON (ToolError when it fails).
* `run_to_files(cmd, out, err, ...)` runs one measured command with its stdout and stderr in
  files, in its own process group (proc.run_child: stopped on timeout and on Ctrl-C/SIGTERM),
  and returns a `Run`: exit code, the JSON it printed if it is what was expected, the reason it
  failed (the telling stderr line, or the timeout), its time.
* `measuring(name, title, total, state)` is the block in which an experiment runs its commands:
  a progress display, and Ctrl-C/SIGTERM end the block with STATE marked partial (the exit code
  130/143 on the object it yields), so the caller writes the report of what finished.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import proc
from .progress import Progress

REPO = Path(__file__).resolve().parents[2]


class ToolError(RuntimeError):
    """The CLI failed; the message carries its stderr."""


def target_dir() -> Path:
    """Cargo's target directory: $CARGO_TARGET_DIR (relative to the repository), else target/."""
    env = os.environ.get("CARGO_TARGET_DIR")
    return REPO / env if env else REPO / "target"


def preheat_bin() -> str:
    """The `preheat` binary: $PREHEAT_BIN, else release, else debug in Cargo's target directory
    ($CARGO_TARGET_DIR or target/), else PATH."""
    env = os.environ.get("PREHEAT_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = target_dir() / profile / "preheat"
        if p.exists():
            return str(p)
    found = shutil.which("preheat")
    if found:
        return found
    raise ToolError(
        "cannot find the preheat binary: build it (cargo build --release) or set PREHEAT_BIN"
    )


def require(*commands: Sequence[str]) -> str:
    """The preheat binary, checked to exist and to have each of COMMANDS (words, e.g.
    ("affinity", "run")); ToolError saying how to get one that does."""
    b = preheat_bin()
    if not (Path(b).exists() or shutil.which(b)):
        raise ToolError(f"the preheat binary {b} does not exist (PREHEAT_BIN="
                        f"{os.environ.get('PREHEAT_BIN', '')!r}; build: cargo build --release)")
    lacking = [" ".join(c) for c in commands if not help_text(*c)]
    if lacking:
        raise ToolError(f"{b} has no " + ", no ".join(f"`preheat {c}`" for c in lacking)
                        + " (not built yet or too old: cargo build --release)")
    return b


def run_json(args: Sequence[str], timeout: float = 900) -> Any:
    """Run `preheat ARGS --json` and return the parsed JSON."""
    cmd = [preheat_bin(), *args]
    if "--json" not in cmd:
        cmd.append("--json")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ToolError(f"{' '.join(cmd)} timed out after {timeout} s") from e
    if p.returncode != 0:
        raise ToolError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr.strip()}")
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise ToolError(f"{' '.join(cmd)} printed no JSON:\n{p.stdout[:500]}") from e


def failure_reason(stderr: str, rc: int | None) -> str:
    """The line that explains a failed CLI run: the one naming scripts/setup-lab.sh or the
    Debian package, else the CLI's own `preheat: error: ...` (whole: a refusal of the
    pre-flight says why and what to do on that line), else the last `Error:` / panic line,
    else the tail of stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "setup-lab.sh" in ln or "not installed" in ln.lower():
            return " ".join(lines[max(0, i - 1):i + 2])[:600]
    for i, ln in enumerate(lines):
        if ln.startswith("preheat: error:"):
            return " ".join(lines[i:i + 8])[:2000]
    for i, ln in enumerate(lines):
        if ln.startswith("Error") or "panicked" in ln:
            return " ".join(lines[i:i + 3])[:600]
    tail = " | ".join(lines[-3:]) if lines else "(no output)"
    return f"exit code {rc}: {tail}"[:600]


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


_help_cache: dict = {}


def help_text(*sub: str) -> str:
    """`preheat SUB --help` (cached; empty when the subcommand does not exist)."""
    key = (preheat_bin(), sub)
    if key not in _help_cache:
        try:
            p = subprocess.run([preheat_bin(), *sub, "--help"], capture_output=True, text=True,
                               timeout=30)
            _help_cache[key] = p.stdout if p.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            _help_cache[key] = ""
    return _help_cache[key]


def supports(sub: str | Sequence[str], flag: str) -> bool:
    """Whether `preheat SUB` accepts `flag` (e.g. demo --records; SUB may be a tuple of words,
    e.g. ("cosched", "simulate")): lets the lab run against an older CLI and leave optional
    flags out."""
    words = (sub,) if isinstance(sub, str) else tuple(sub)
    return re.search(rf"(^|\s){re.escape(flag)}(\s|=|,|$)", help_text(*words), re.M) is not None


def topology() -> dict:
    """`preheat topology --json`, or {"error": ...}."""
    try:
        return run_json(["topology"], timeout=60)
    except ToolError as e:
        return {"error": str(e)}


@dataclass
class Run:
    """One command run by `run_to_files`."""

    command: list[str]
    #: The exit code; -1: stopped at its time limit.
    rc: int
    #: What it printed on stdout as JSON, when it exited 0 and printed what was expected.
    data: Any
    #: Why it failed ("" when it did not): the timeout, the telling stderr line, or the JSON.
    reason: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.reason

    def check(self) -> Any:
        """The JSON, or ToolError naming the command and why it failed."""
        if self.rc == -1:
            raise ToolError(self.reason)
        if self.reason:
            raise ToolError(f"{' '.join(self.command)} failed: {self.reason}")
        return self.data


def run_to_files(cmd: Sequence[str], out: Path, err: Path, timeout: float, *,
                 on_tick: Callable[[], None] | None = None, expect: str = "",
                 valid: Callable[[dict], object] | None = None, tidy: bool = False) -> Run:
    """Run CMD with stdout to OUT and stderr to ERR (proc.run_child: its own process group,
    stopped at TIMEOUT seconds and on Ctrl-C/SIGTERM, which propagate; ON_TICK is called while
    it runs). With VALID, the run fails unless it printed a JSON object VALID accepts
    ("printed no JSON with EXPECT"). TIDY: remove OUT when the command failed and left it
    empty, ERR when the command succeeded and left it empty."""
    cmd = list(cmd)
    t0 = time.monotonic()
    try:
        rc = proc.run_child(cmd, out, err, timeout=timeout, on_tick=on_tick)
    except proc.ChildTimeout as e:
        rc, text, reason = -1, "", str(e)
    else:
        text = err.read_text(errors="replace") if err.exists() else ""
        reason = "" if rc == 0 else failure_reason(text, rc)
    seconds = time.monotonic() - t0
    data = read_json(out) if rc == 0 else None
    if rc == 0 and valid is not None and not (isinstance(data, dict) and valid(data)):
        data, reason = None, f"printed no JSON with {expect or 'what was expected'}"
    if tidy:
        if rc != 0 and out.exists() and out.stat().st_size == 0:
            out.unlink()
        if rc == 0 and err.exists() and not text.strip():
            err.unlink()
    return Run(cmd, rc, data, reason, text, seconds)


@dataclass
class Measuring:
    """What `measuring` yields: the progress display, and the exit code so far (130/143 once
    interrupted by SIGINT/SIGTERM)."""

    prog: Progress
    code: int = 0


@contextmanager
def measuring(name: str, title: str, total: int, state: dict) -> Iterator[Measuring]:
    """The block in which experiment NAME runs its commands, with a Progress(TITLE, TOTAL).
    SIGINT/SIGTERM in the block stop the running child and end the block: STATE is marked
    "interrupted (partial)" (proc.mark_interrupted) and `.code` is 130/143; a block that ends
    normally marks STATE "complete". Either way the caller goes on to write what finished."""
    proc.reset_interrupt_state()
    with proc.interruptible(), Progress(title, total) as prog:
        m = Measuring(prog)
        try:
            yield m
            state["state"] = "complete"
        except KeyboardInterrupt:  # proc.Interrupted, or one a C extension re-raised plainly
            m.code = proc.mark_interrupted(state)
            prog.log(f"{name}: interrupted by {proc.interrupted_by()}: writing what finished")


def not_run(records: Iterable[dict]) -> None:
    """After `measuring`: the records still "pending" become "not run"."""
    for rec in records:
        if rec["status"] == "pending":
            rec["status"] = "not run"
