"""Child processes and interruption.

Every `preheat` child runs in its own session (process group), so one signal reaches the CLI and
every server it started. Ctrl-C or SIGTERM to the lab raises `Interrupted` in the main thread;
the code running the child then sends SIGTERM to the child's process group (the CLI cleans up
its servers on SIGTERM), waits a grace period, and only then SIGKILLs what is left. The
experiment code catches `Interrupted`, writes what it measured so far (marked partial) and
exits non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Callable, NoReturn, Union


class Interrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C or SIGTERM). A KeyboardInterrupt, so no `except
    Exception` swallows it and C extensions that check signals (Ray) pass it through."""


class ChildTimeout(RuntimeError):
    pass


_state: dict[str, str | None] = {"signal": None}


def interrupted_by() -> str | None:
    """The signal that interrupted this run (called after an interruption: a KeyboardInterrupt
    that did not pass through our handler counts as SIGINT)."""
    return _state["signal"] or "SIGINT"


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise `Interrupted` once (later signals during the
    clean-up are only recorded). Outside the main thread this is a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        first = _state["signal"] is None
        _state["signal"] = signal.Signals(signum).name
        if first:
            raise Interrupted(_state["signal"])

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, handler)
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt as e:  # a SIGINT that arrived before our handler
        _state["signal"] = _state["signal"] or "SIGINT"
        raise Interrupted(_state["signal"]) from e
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def reset_interrupt_state() -> None:
    _state["signal"] = None


def mark_interrupted(state: dict) -> int:
    """Record an interruption in a run's STATE (`state`, `interrupted_by`) and return the exit
    code for it: 143 for SIGTERM, else 130."""
    state["state"] = "interrupted (partial)"
    state["interrupted_by"] = interrupted_by()
    return 143 if interrupted_by() == "SIGTERM" else 130


def terminate_group(p: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM to the child's process group, then SIGKILL after `grace` seconds."""
    if p.poll() is not None:
        # The leader is gone; its group may still hold servers it started.
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            p.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            continue
        except Interrupted:  # a second signal while we clean up: keep cleaning up
            continue
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


FileLike = Union[str, Path, IO]


def _open(x: FileLike | None) -> tuple[int | IO, IO | None]:
    if x is None:
        return subprocess.DEVNULL, None
    if isinstance(x, (str, Path)):
        f = open(x, "wb")
        return f, f
    return x, None


def run_child(cmd: Sequence[str], stdout: FileLike | None, stderr: FileLike | None,
              timeout: float, on_tick: Callable[[], None] | None = None,
              tick: float = 0.5, env: dict | None = None) -> int:
    """Run `cmd` in its own process group with output to files; call `on_tick` every `tick`
    seconds while it runs. On timeout or any exception (including `Interrupted`), terminate the
    group and re-raise. Returns the exit code."""
    out, fo = _open(stdout)
    err, fe = _open(stderr)
    try:
        p = subprocess.Popen(list(cmd), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return p.wait(timeout=tick)
                except subprocess.TimeoutExpired:
                    pass
                if on_tick:
                    on_tick()
                if time.monotonic() > deadline:
                    raise ChildTimeout(f"{' '.join(cmd)} timed out after {timeout:.0f} s")
        except BaseException:
            terminate_group(p)
            raise
    finally:
        for f in (fo, fe):
            if f:
                f.close()


def worker_signal_setup() -> None:
    """For pool worker processes: SIGTERM and SIGINT raise KeyboardInterrupt, so `run_child`
    terminates the child's group before the worker exits."""

    def h(signum: int, frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, h)
    signal.signal(signal.SIGINT, h)


def isatty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
