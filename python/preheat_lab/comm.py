"""Communication detection on the bundled NPB-style kernels (partial coscheduling, SAC'15 §2.2
and §3): for each kernel, `preheat comm` (SPCD in user space, matrix reset after start-up,
report taken while the kernel runs), `preheat groups` (eq. 1, t = 1.5), the thread × thread
matrix as a heatmap with the detected sets outlined, the sets beside the kernel's true sets,
and CSV/Parquet/JSON plus one HTML report. Existing `preheat comm --out` files (any program)
can be rendered too (`--from`). Every number is measured on this machine."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from . import atomic
from .cli import ToolError, preheat_bin, run_json
from .npb import KERNELS, STANDS_IN_FOR, npb_bin, truth_of
from .report import Report


def run_kernel(kernel: str, raw: Path, seconds: float, threads: int, instances: int,
               period_ms: int, budget: int) -> Path:
    """`preheat comm` on one kernel; returns the report file."""
    out = raw / f"{kernel}.json"
    cmd = [preheat_bin(), "comm", "--period-ms", str(period_ms), "--budget", str(budget),
           "--reset-after-ms", "300", "--duration", f"{max(seconds - 1.0, 1.0):g}",
           "--only", "npb-", "--out", str(out), "--", npb_bin(), kernel,
           "--threads", str(threads), "--instances", str(instances),
           "--seconds", f"{seconds:g}", "--start-delay-ms", "300"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if p.returncode != 0:
        raise ToolError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr.strip()[-800:]}")
    return out


def labels_of(report: dict) -> list[str]:
    names = report.get("labels")
    if names and len(names) == len(report["matrix"]):
        return list(names)
    return [t.get("name") or str(t.get("tid")) for t in report.get("threads", [])]


def heatmap(report: dict, sets: list[list[int]], title: str, png: Path) -> Path:
    """The matrix with threads ordered by detected set, each set outlined."""
    m = report["matrix"]
    names = labels_of(report)
    order = [i for s in sets for i in s]
    data = [[m[i][j] for j in order] for i in order]
    n = len(order)
    side = 2.6 + 0.55 * max(n, 3)
    fig, ax = plt.subplots(figsize=(side + 1.2, side))
    im = ax.imshow(data, cmap="viridis")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels([names[i] for i in order], rotation=60, ha="right", fontsize=8)
    ax.set_yticklabels([names[i] for i in order], fontsize=8)
    start = 0
    for s in sets:
        ax.add_patch(plt.Rectangle((start - 0.5, start - 0.5), len(s), len(s), fill=False,
                                   edgecolor="red", linewidth=2))
        start += len(s)
    fig.colorbar(im, ax=ax, label="communication events (measured)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    atomic.savefig(fig, png, dpi=110)
    plt.close(fig)
    return png


def analyze(report_path: Path, out: Path, kernel: str | None = None) -> dict:
    """Groups, heatmap and one summary row for one `preheat comm` report."""
    report = json.loads(Path(report_path).read_text())
    if not report.get("matrix"):
        raise ToolError(f"{report_path}: no threads in the matrix")
    g = run_json(["groups", str(report_path)])
    sets = [list(s) for s in g["sets"]]
    names = labels_of(report)
    name = kernel or Path(report_path).stem
    png = heatmap(report, sets, f"{name}: {report['events']} events,\n"
                  f"{report['faults_induced']} induced faults (measured)", out / f"{name}.png")
    detected = sorted(sorted(names[i] for i in s) for s in sets)
    row = {"program": name, "threads": len(names), "events": report["events"],
           "faults_induced": report["faults_induced"],
           "seconds": round(report["elapsed_ns"] / 1e9, 2),
           "sets_detected": " | ".join(",".join(s) for s in detected)}
    if kernel:
        plain = [n.split("/")[0] for n in names]
        truth = truth_of(kernel, plain)
        row["stands_in_for"] = STANDS_IN_FOR.get(kernel, "")
        row["sets_true"] = " | ".join(",".join(s) for s in truth)
        row["equal"] = sorted(sorted(plain[i] for i in s) for s in sets) == truth
    return {"row": row, "png": png, "groups": g}


def run(out: Path, kernels: Sequence[str] = KERNELS, from_files: Sequence[Path] = (),
        seconds: float = 4.0, threads: int = 4, instances: int = 2, period_ms: int = 20,
        budget: int = 5000) -> int:
    out = Path(out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rep = Report("preheat lab comm: communication detection and coscheduling sets")
    rep.text("SPCD in user space (mprotect sampling inside the agent), matrix reset after "
             "start-up, groups by eq. 1 with t = 1.5 (Busse et al., SAC'15). Measured on this "
             "machine; the paper's numbers are not comparable (KVM guests, kernel module).")
    rows, failures = [], []
    jobs: list[tuple[Path, str | None]] = [(Path(f), None) for f in from_files]
    for k in kernels:
        try:
            jobs.append((run_kernel(k, raw, seconds, threads, instances, period_ms, budget), k))
        except ToolError as e:
            failures.append(f"{k}: {e}")
    for path, kernel in jobs:
        try:
            a = analyze(path, out, kernel)
        except (ToolError, OSError, ValueError, KeyError) as e:
            failures.append(f"{path}: {e}")
            continue
        rows.append(a["row"])
        atomic.write_json(out / f"{a['row']['program']}.groups.json", a["groups"])
        rep.heading(a["row"]["program"], 3)
        rep.image(a["png"], f"{a['row']['program']}: matrix ordered by detected set (red)")
    df = pd.DataFrame(rows)
    if not df.empty:
        atomic.write_table(out / "comm", df)
        rep.table(df, "detected and true sets (measured)")
    for f in failures:
        rep.note(f, "fail")
    atomic.write_json(out / "summary.json", {"rows": rows, "failures": failures})
    rep.write(out / "report.html")
    print(df.to_string(index=False) if not df.empty else "no results")
    for f in failures:
        print(f"failed: {f}")
    return 1 if failures else 0
