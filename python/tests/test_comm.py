"""preheat lab comm: truth by thread name, heatmaps and the summary on a captured report, and
one short real run on a bundled kernel through the CLI."""

import json
from pathlib import Path

import pytest

from preheat_lab import comm
from preheat_lab.cli import ToolError, preheat_bin
from preheat_lab.skips import needs_message

REPORT = {
    "label": "measured", "events": 60, "faults_induced": 300, "elapsed_ns": 2_000_000_000,
    "threads": [{"tid": 11, "name": "npb-is-i0-r0", "alive": True},
                {"tid": 12, "name": "npb-is-i1-r0", "alive": True},
                {"tid": 13, "name": "npb-is-i0-r1", "alive": True},
                {"tid": 14, "name": "npb-is-i1-r1", "alive": True}],
    "matrix": [[0, 0, 30, 0], [0, 0, 0, 30], [30, 0, 0, 0], [0, 30, 0, 0]],
}


def _have_cli() -> bool:
    try:
        preheat_bin()
        comm.npb_bin()
        return True
    except ToolError:
        return False


def test_truth_by_thread_name():
    names = ["npb-mg-i1-r0", "npb-mg-i0-r0", "npb-mg-i1-r1", "npb-mg-i0-r1"]
    assert comm.truth_of("mg", names) == [["npb-mg-i0-r0", "npb-mg-i0-r1"],
                                          ["npb-mg-i1-r0", "npb-mg-i1-r1"]]
    assert comm.truth_of("ep", names[:2]) == [["npb-mg-i0-r0"], ["npb-mg-i1-r0"]]


def test_heatmap_outlines_sets(tmp_path: Path):
    png = comm.heatmap(REPORT, [[0, 2], [1, 3]], "t", tmp_path / "h.png")
    assert png.exists() and png.stat().st_size > 1000


@pytest.mark.skipif(not _have_cli(), reason=needs_message("preheat", "preheat / preheat-npb not built (cargo build)"))
def test_captured_report_is_grouped(tmp_path: Path):
    f = tmp_path / "is.json"
    f.write_text(json.dumps(REPORT))
    a = comm.analyze(f, tmp_path, "is")
    assert a["row"]["equal"] is True
    assert a["row"]["sets_true"] == "npb-is-i0-r0,npb-is-i0-r1 | npb-is-i1-r0,npb-is-i1-r1"


@pytest.mark.skipif(not _have_cli(), reason=needs_message("preheat", "preheat / preheat-npb not built (cargo build)"))
def test_short_real_run(tmp_path: Path):
    rc = comm.run(tmp_path, ["is"], seconds=2.5)
    assert rc == 0
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert rows[0]["program"] == "is" and rows[0]["faults_induced"] > 0
    assert (tmp_path / "report.html").exists() and (tmp_path / "is.png").exists()
