"""The bundled NPB-style kernels (`preheat-npb`, next to the `preheat` binary): their names,
the NPB kernels they stand in for, and their true sets by thread name. Shared by `comm`
(detection) and `cosched` (the VMs' loads).

Standard library only: the command line's choices come from here, and `--help` runs without
the lab's third-party packages."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .cli import ToolError, preheat_bin

KERNELS = ("mg", "cg", "is", "ep")
#: NPB kernels the bundled ones stand in for (the sharing pattern, not the computation).
STANDS_IN_FOR = {"mg": "MG/LU (nearest neighbour)", "cg": "CG (irregular, sparse)",
                 "is": "IS (all-to-all)", "ep": "EP (no sharing)"}


def npb_bin() -> str:
    """The bundled kernels, next to the `preheat` binary."""
    p = Path(preheat_bin()).with_name("preheat-npb")
    if not p.exists():
        raise ToolError(f"{p} is missing: build the workspace (cargo build --release)")
    return str(p)


def truth_of(kernel: str, names: Sequence[str]) -> list[list[str]]:
    """True sets by thread name (`npb-K-iI-rR`): one per instance; every thread alone for ep."""
    if kernel == "ep":
        sets = [[n] for n in names]
    else:
        by: dict = {}
        for n in names:
            by.setdefault(n.split("-")[2] if n.count("-") >= 3 else n, []).append(n)
        sets = list(by.values())
    return sorted(sorted(s) for s in sets)
