"""One client's measurement against one server, and the comparison of ours with the peer's
(ratio per metric, within the tolerance or not, and the verdict)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional

TOLERANCE = 0.05


@dataclass
class Measurement:
    """One client's run against one server."""

    client: str  # e.g. "preheat load --wait epoll", "memcaslap"
    side: str  # ours | peer
    connections: int
    threads: Optional[int] = None
    duration_s: Optional[float] = None
    requests: Optional[float] = None
    throughput_rps: Optional[float] = None
    mean_us: Optional[float] = None
    p50_us: Optional[float] = None
    p90_us: Optional[float] = None
    p99_us: Optional[float] = None
    max_us: Optional[float] = None
    errors: Optional[float] = None
    note: str = ""
    raw: str = ""  # file name of the raw output (DIR/peer/raw/)
    wait: Optional[str] = None  # ours: --wait
    client_loop: Optional[str] = None  # ours: the loop that ran (event-loop | thread-per-connection)

    def to_dict(self) -> dict:
        return asdict(self)


def ratio(ours: Optional[float], peer: Optional[float]) -> Optional[float]:
    if ours is None or peer is None:
        return None
    try:
        if not (math.isfinite(ours) and math.isfinite(peer)) or peer == 0:
            return None
    except TypeError:
        return None
    return ours / peer


def compare(server: str, ours: Measurement, peer: Measurement,
            tolerance: float = TOLERANCE) -> List[dict]:
    """One row per metric both sides measured: ours, peer, ratio, within ±tolerance."""
    rows = []
    for metric in ("throughput_rps", "mean_us", "p50_us", "p99_us"):
        a, b = getattr(ours, metric), getattr(peer, metric)
        r = ratio(a, b)
        if r is None:
            continue
        within = abs(r - 1.0) <= tolerance + 1e-12  # 105/100 is within 5% despite rounding
        rows.append({"server": server, "ours": ours.client, "peer": peer.client,
                     "metric": metric, "ours_value": a, "peer_value": b, "ratio": r,
                     "within": within, "tolerance": tolerance,
                     "verdict": (f"within {tolerance:.0%}" if within
                                 else f"differs by {r - 1.0:+.1%}")})
    return rows


def verdict(rows: List[dict]) -> str:
    if not rows:
        return "no comparable metric"
    core = [r for r in rows if r["metric"] in ("throughput_rps", "mean_us")]
    if core and all(r["within"] for r in core):
        return "agree (throughput and mean within 5%)"
    bad = ", ".join(f"{r['metric']} {r['ratio']:.2f}×" for r in core if not r["within"])
    return f"differ ({bad})" if bad else "no throughput/mean to compare"
