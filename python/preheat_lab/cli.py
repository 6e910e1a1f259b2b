"""Running the `preheat` CLI and reading its JSON output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class ToolError(RuntimeError):
    """The CLI failed; the message carries its stderr."""


def preheat_bin() -> str:
    """The `preheat` binary: $PREHEAT_BIN, else target/release, else target/debug, else PATH."""
    env = os.environ.get("PREHEAT_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "preheat"
        if p.exists():
            return str(p)
    found = shutil.which("preheat")
    if found:
        return found
    raise ToolError(
        "cannot find the preheat binary: build it (cargo build --release) or set PREHEAT_BIN"
    )


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


def failure_reason(stderr: str, rc: int) -> str:
    """The line that explains a failed CLI run: the one naming scripts/setup-lab.sh or the
    Debian package, else the last `Error:` / panic line, else the tail of stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "setup-lab.sh" in ln or "not installed" in ln.lower():
            return " ".join(lines[max(0, i - 1):i + 2])[:600]
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


def supports(sub, flag: str) -> bool:
    """Whether `preheat SUB` accepts `flag` (e.g. demo --records; SUB may be a tuple of words,
    e.g. ("cosched", "simulate")): lets the lab run against an older CLI and leave optional
    flags out."""
    import re

    words = (sub,) if isinstance(sub, str) else tuple(sub)
    return re.search(rf"(^|\s){re.escape(flag)}(\s|=|,|$)", help_text(*words), re.M) is not None


def topology() -> dict:
    """`preheat topology --json`, or {"error": ...}."""
    try:
        return run_json(["topology"], timeout=60)
    except ToolError as e:
        return {"error": str(e)}
