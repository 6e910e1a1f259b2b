"""One client's measurement against one server, and the comparison of ours with the peer's
(ratio per metric, within the tolerance or not, and the verdict)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

TOLERANCE = 0.05


@dataclass
class Measurement:
    """One client's run against one server."""

    client: str  # e.g. "preheat load --wait epoll", "memcaslap"
    side: str  # ours | peer
    connections: int
    threads: int | None = None
    duration_s: float | None = None
    requests: float | None = None
    throughput_rps: float | None = None
    mean_us: float | None = None
    p50_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    max_us: float | None = None
    errors: float | None = None
    note: str = ""
    raw: str = ""  # file name of the raw output (DIR/peer/raw/)
    wait: str | None = None  # ours: --wait
    client_loop: str | None = None  # ours: the loop that ran (event-loop | thread-per-connection)

    def to_dict(self) -> dict:
        return asdict(self)


def ratio(ours: float | None, peer: float | None) -> float | None:
    if ours is None or peer is None:
        return None
    try:
        if not (math.isfinite(ours) and math.isfinite(peer)) or peer == 0:
            return None
    except TypeError:
        return None
    return ours / peer


def compare(server: str, ours: Measurement, peer: Measurement,
            tolerance: float = TOLERANCE) -> list[dict]:
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


def verdict(rows: list[dict]) -> str:
    if not rows:
        return "no comparable metric"
    core = [r for r in rows if r["metric"] in ("throughput_rps", "mean_us")]
    if core and all(r["within"] for r in core):
        return "agree (throughput and mean within 5%)"
    bad = ", ".join(f"{r['metric']} {r['ratio']:.2f}×" for r in core if not r["within"])
    return f"differ ({bad})" if bad else "no throughput/mean to compare"
