"""`python -m preheat_lab sleeping --out DIR [--quick] [--only figure1,kernels,...]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import sleeping


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="preheat-lab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("sleeping", help="the sleeping-CPUs experiments (plots + HTML report)")
    sp.add_argument("--out", type=Path, default=Path("results/sleeping"))
    sp.add_argument("--quick", action="store_true", help="tiny runs (for tests)")
    sp.add_argument("--only", default="", help=f"comma list of {','.join(sleeping.EXPERIMENTS)}")
    a = ap.parse_args(argv)
    only = [x for x in a.only.split(",") if x] or None
    res = sleeping.run_all(a.out, quick=a.quick, only=only)
    failed = [p.stem for p in a.out.glob("*.error.txt")]
    print(f"wrote {a.out / 'report.html'} ({len(res)} experiments"
          + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
