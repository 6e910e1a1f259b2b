"""Make `preheat_lab` importable however pytest is started (from python/ or the repo root)."""

import sys
from pathlib import Path

_PY = str(Path(__file__).resolve().parents[1])
if _PY not in sys.path:
    sys.path.insert(0, _PY)
