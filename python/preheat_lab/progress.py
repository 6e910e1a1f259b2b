"""Progress display: a rich progress bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from typing import Any

from .proc import isatty


def minutes(s: float) -> str:
    """A duration for people: "45 s", "2.5 min" (from 90 s on)."""
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def time_left(t0: float, done: int, left: int) -> str:
    """"; ~X left" for LEFT more items at the pace of DONE since T0 (time.monotonic()), or ""
    when none is left."""
    if not left:
        return ""
    return f"; ~{minutes((time.monotonic() - t0) / max(done, 1) * left)} left"


class Progress:
    """`with Progress("table1", total) as p: p.task(name, total); p.update(done); p.advance()`.

    One bar for the overall run and one for the current task (e.g. samples of one server).
    Without a TTY (or without rich) it prints a line when a task starts and ends, and at most
    every `every` seconds in between."""

    def __init__(self, title: str, total: int, every: float = 10.0, enabled: bool | None = None):
        self.title = title
        self.total = total
        self.every = every
        self.done = 0
        self.name = ""
        self.task_total = 0
        self.task_done = 0
        self._last = 0.0
        # rich.progress.Progress when rich is importable (optional), else None.
        self._rich: Any = None
        use_rich = isatty() if enabled is None else enabled
        if use_rich:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )
                from rich.progress import Progress as RP

                self._rich = RP(TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
            except ImportError:
                self._rich = None
        self._overall: int | None = None
        self._current: int | None = None

    def __enter__(self) -> Progress:
        if self._rich:
            self._rich.start()
            self._overall = self._rich.add_task(self.title, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich:
            self._rich.stop()

    def log(self, msg: str) -> None:
        if self._rich:
            self._rich.console.print(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    def task(self, name: str, total: int) -> None:
        self.name, self.task_total, self.task_done = name, total, 0
        if self._rich:
            if self._current is not None:
                self._rich.remove_task(self._current)
            self._current = self._rich.add_task(f"  {name}", total=max(total, 1))
        else:
            self.log(f"[{self.done + 1}/{self.total}] {self.title}: {name} ...")
            self._last = time.monotonic()

    def update(self, done: int) -> None:
        """Progress within the current task (e.g. samples measured so far)."""
        if done == self.task_done:
            return
        self.task_done = done
        if self._rich and self._current is not None:
            self._rich.update(self._current, completed=min(done, self.task_total))
        elif time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            self.log(f"    {self.name}: {done}/{self.task_total}")

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self._rich:
            self._rich.update(self._overall, completed=self.done)
            if self._current is not None:
                self._rich.update(self._current, completed=self.task_total)
            if note:
                self._rich.console.print(f"  {self.name}: {note}")
        else:
            self.log(f"[{self.done}/{self.total}] {self.title}: {self.name} {note or 'done'}")
