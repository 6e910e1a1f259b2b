"""The sleeping-CPUs experiments (see `sleeping`): their names, the I/O policies compared, and
how much each measures.

Standard library only: the command line's choices come from here, and `--help` runs without
the lab's third-party packages."""

from __future__ import annotations

from dataclasses import dataclass

#: In the order they run and appear in the report (`sleeping.EXPERIMENTS` maps them to code).
EXPERIMENT_NAMES = ("figure1", "kernels", "wakeups", "stage", "quiesce")
POLICIES = ["default", "awake", "anticipatory"]


@dataclass
class Scale:
    """How much to measure: `quick` for tests, `full` for the report."""

    io_requests: int
    io_gaps: str
    kernels: int
    wake_rounds: int
    wake_gaps: str
    stage_rate: int
    stage_s: int
    stage_rounds: int
    quiesce_s: int
    quiesce_rounds: int

    @staticmethod
    def of(quick: bool) -> Scale:
        if quick:
            return Scale(20, "0,1000", 12, 5, "100,1000", 200, 1, 1, 2, 2)
        return Scale(400, "0,100,1000,10000", 200, 60, "10,100,1000,10000", 100, 10, 3, 9, 6)
