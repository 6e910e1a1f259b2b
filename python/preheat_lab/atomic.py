"""Atomic file output: every artifact is written to a temporary file in the same directory and
renamed into place, so a reader (or an interrupted run) never sees a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # annotations only: this module imports neither at run time
    import pandas as pd
    from matplotlib.figure import Figure

_warned_parquet = False


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's 0600 is too strict for results


def _atomic(path: Path, write: Callable[[Path], object]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, _MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_bytes(path: Path, data: bytes) -> Path:
    return _atomic(path, lambda p: p.write_bytes(data))


def write_text(path: Path, text: str) -> Path:
    return _atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def _jsonable(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return None if not np.isfinite(o) else float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"not JSON serializable: {type(o)}")


def _nan_to_none(o: Any) -> Any:
    if isinstance(o, float) and o != o:
        return None
    if isinstance(o, dict):
        return {k: _nan_to_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_nan_to_none(v) for v in o]
    return o


def write_json(path: Path, data: Any) -> Path:
    """JSON with NaN written as null (strict JSON readers reject NaN)."""
    text = json.dumps(_nan_to_none(json.loads(json.dumps(data, default=_jsonable))), indent=1)
    return write_text(path, text + "\n")


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    return _atomic(path, lambda p: df.to_csv(p, index=False))


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401

        return True
    except ImportError:
        return False


def write_parquet(path: Path, df: pd.DataFrame) -> bool:
    """Parquet through pyarrow; False (and one printed note) when pyarrow is missing."""
    global _warned_parquet
    if not parquet_available():
        if not _warned_parquet:
            print("note: pyarrow is not installed: writing CSV only, no Parquet "
                  "(pip install pyarrow)")
            _warned_parquet = True
        return False
    _atomic(path, lambda p: df.to_parquet(p, index=False))
    return True


def write_table(base: Path, df: pd.DataFrame) -> Path:
    """`base.csv` always, `base.parquet` when pyarrow is there."""
    write_csv(base.with_suffix(".csv"), df)
    write_parquet(base.with_suffix(".parquet"), df)
    return base.with_suffix(".csv")


def savefig(fig: Figure, path: Path, **kw: Any) -> Path:
    fmt = Path(path).suffix.lstrip(".")
    return _atomic(path, lambda p: fig.savefig(p, format=fmt, **kw))
