"""`DIR/report.html` from whatever DIR holds: Table 1 (summary.json + CSVs + figure3), the peer
check (peer/), sweeps (sweep/) and the machine facts (topology.json). Rebuild any time with
`python -m preheat_lab report --out DIR`."""

from __future__ import annotations

import html
import math
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pandas as pd

from . import atomic
from .cli import read_json as _read_json
from .report import Report
from .sweep_grid import COSIM_DIR
from .table1_analysis import PAPER_AVERAGE_REMOVED, PAPER_LABEL
from .table1_run import DISPLAY

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METHOD = (
    "Method. For each server, `preheat demo` starts it pinned to one CPU with the preheat agent "
    "attached (the client runs on another CPU), records its per-request working set with the "
    "flush+reload probe (k of n samples), and then runs interleaved rounds: every round measures "
    "every mode exactly once, in a freshly shuffled order, so slow drifts of the machine hit all "
    "modes alike. Modes: hot = the floor: a request right after another with the server's CPU "
    "kept out of idle (per-CPU PM QoS, as the wake planner arms it), caches warm; warm = "
    "back-to-back requests (the CPU may halt between them); cold-sweep = an eviction sweep on the "
    "server's CPU, then a short gap, then the request (the paper's flushed caches); cold-idle = "
    "a plain idle gap, no sweep; control = the same gap as cold-sweep without the sweep (what "
    "waking an idle CPU costs by itself); preheat:S = cold-sweep, but the request is announced "
    "ahead (lead time) and the agent applies strategy S before it arrives (wake: keep the core "
    "busy; lines: prefetch the recorded working set, the paper's preheating; replay: a warm-up "
    "request through the real kernel path). Response time is measured by the client from send "
    "(or the announced arrival) to the complete reply. Means get a 95% percentile-bootstrap "
    "interval (2000 resamples); medians and p99 get the distribution-free order-statistic "
    "interval (binomial, normal approximation; the same method as the Rust side); derived "
    "quantities (differences, shares of the overhead removed) get a paired bootstrap over "
    "rounds, which keeps each round's modes together. The share removed is (cold − mode) / "
    "(cold − floor) with cold = cold-sweep and floor = hot where it was measured (else warm); "
    "the same share against warm (caches warm, CPUs not kept awake through the lead: above 100% "
    "where a mode also removed the wake-up) stands beside it. Every mode's client waits the same "
    "lead before it sends, so only the server's state differs between rows. A share is undefined "
    "when a resample has no overhead (the share of such resamples is reported); a share outside "
    "±100% (against warm: below −100%) is flagged (the floor or the baseline is then not what it "
    "claims). Every number here is measured on this machine "
    "unless it is labeled paper; n is the number of samples behind it."
)


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def signed_pct(v: object, d: int = 1, signed: bool = True) -> str:
    """A difference as a percentage ("+12.3%"), "–" when not a finite number."""
    f = _num(v)
    if f is None:
        return "–"
    return f"{100 * f:+.{d}f}%" if signed else f"{100 * f:.{d}f}%"


def signed_pct_ci(v: object, lo: object, hi: object, d: int = 1) -> str:
    """A difference as a percentage with its interval: "+12.3% [+1.0%, +20.0%]"."""
    s = signed_pct(v, d=d)
    if s != "–" and _num(lo) is not None and _num(hi) is not None:
        s += f" [{signed_pct(lo, d=d)}, {signed_pct(hi, d=d)}]"
    return s


def plt() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def save_figure(fig: Figure, base: Path) -> Path:
    """base.png and base.svg (atomically), the figure closed; returns the PNG."""
    for ext in ("svg", "png"):
        atomic.savefig(fig, base.with_suffix(f".{ext}"), dpi=110)
    plt().close(fig)
    return base.with_suffix(".png")


def fmt(v: object, d: int = 1) -> str:
    f = _num(v)
    if f is None:
        return "–" if v is None or (isinstance(v, float)) else str(v)
    if abs(f) >= 1000:
        return f"{f:,.0f}"
    return f"{f:.{d}f}"


def ci(v: object, lo: object, hi: object, d: int = 1) -> str:
    if _num(v) is None:
        return "–"
    if _num(lo) is None or _num(hi) is None:
        return fmt(v, d)
    return f"{fmt(v, d)} ({fmt(lo, d)}–{fmt(hi, d)})"


def pct(v: Any, lo: Any = None, hi: Any = None, und: Any = None) -> str:
    f = _num(v)
    if f is None:
        return "–"
    s = f"{100 * f:.0f}%"
    if _num(lo) is not None and _num(hi) is not None:
        s += f" ({100 * float(lo):.0f}–{100 * float(hi):.0f}%)"
    u = _num(und)
    if u is not None and u > 0.025:
        s += f" [undefined in {100 * u:.0f}% of resamples: no overhead]"
    return s


def _read_csv(p: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(p)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def _cis(df: pd.DataFrame, col: str, d: int = 1) -> list:
    """COL with its 95% CI (COL_lo, COL_hi), formatted per row."""
    return [ci(v, lo, hi, d) for v, lo, hi in zip(df[col], df[f"{col}_lo"], df[f"{col}_hi"])]


def _removed(df: pd.DataFrame, col: str) -> list:
    """A share removed (COL) with its CI and the share of resamples where it was undefined."""
    return [pct(v, lo, hi, und) for v, lo, hi, und in
            zip(df[col], df[f"{col}_lo"], df[f"{col}_hi"], df[f"{col}_undefined_share"])]


def _banner(rep: Report, what: str, state: str | None, failed: dict) -> None:
    if state and state != "complete":
        rep.note(f"{what}: {state.upper()} — the numbers below are what was measured before the "
                 "run stopped.", "warn")
    for s, why in (failed or {}).items():
        rep.note(f"{what}: {DISPLAY.get(s, s)} FAILED: {why}", "fail")


def machine(rep: Report, out: Path) -> None:
    topo = _read_json(out / "topology.json")
    rep.heading("Machine")
    if not topo:
        rep.text("preheat topology --json was not recorded.")
        return
    rows = []
    for k, v in topo.items():
        if isinstance(v, list):
            v = "; ".join(" ".join(map(str, x)) if isinstance(x, list) else str(x) for x in v)
        rows.append({"fact": k, "value": str(v)})
    rep.table(pd.DataFrame(rows), "preheat topology --json (measured on this machine)")


def table1_section(rep: Report, out: Path) -> None:
    summ = _read_json(out / "summary.json")
    if not summ:
        return
    rep.heading("Table 1 equivalent (paper §4.1)")
    _banner(rep, "table1", summ.get("state"), summ.get("failed"))
    rep.text(METHOD)
    opts = summ.get("options") or {}
    if opts:
        rep.note("demo options: " + ", ".join(f"{k}={v}" for k, v in opts.items() if v is not None))
    head = _read_csv(out / "headline.csv")
    if len(head):
        h = pd.DataFrame({
            "server": head["server_name"],
            "source": head["source"],
            "preheated =": head["preheated_mode"],
            "hot µs (floor)": (head["hot"].map(fmt) if "hot" in head
                               else pd.Series(["–"] * len(head))),
            "warm µs": head["warm"].map(fmt),
            "cold µs": head["cold"].map(fmt),
            "preheated µs": head["preheated"].map(fmt),
            "overhead removed (95% CI)": [pct(r.removed, r.removed_lo, r.removed_hi)
                                          for r in head.itertuples()],
            "CPI warm/cold/preheated": head["cpi"].fillna("–"),
            "working set KiB": head["ws_kib"].map(fmt),
            "preheating µs": head["preheat_us"].map(fmt),
            "n": head["n"], "label": head["label"]})
        rep.table(h, "Response time (means, as the paper averages) beside the paper's Table 1. "
                     "cold = cold-sweep; overhead removed against the hot floor where measured "
                     "(the paper's is against warm). Redis and preheat-kv have no row in the "
                     "paper (—).")
    avg = (summ.get("average_removed") or {}).get("preheat:lines")
    if avg:
        txt = (f"On average over {avg['servers']} server(s) measured here "
               f"({', '.join(DISPLAY.get(s, s) for s in avg.get('which', []))}), preheating the "
               f"working set (preheat:lines) removes {100 * avg['mean_over_servers']:.1f}% of the "
               "mean cold overhead (measured)")
        if avg.get("mean_over_paper_servers") is not None:
            txt += (f"; over the paper's servers measured here "
                    f"({', '.join(DISPLAY.get(s, s) for s in avg['paper_servers'])}): "
                    f"{100 * avg['mean_over_paper_servers']:.1f}%")
    else:
        txt = ("No average of preheat:lines over the servers measured here: its share of the "
               "mean cold overhead is undefined (no mode measured, or cold not above the floor)")
    # The paper's average is printed either way (it is the paper's, not ours).
    rep.text(txt + f". The paper: \"on average the overhead is reduced by "
                   f"{100 * PAPER_AVERAGE_REMOVED:.1f}%\" ({PAPER_LABEL}).")
    t = _read_csv(out / "table1.csv")
    for server, g in (t.groupby("server", sort=False) if len(t) else []):
        d = pd.DataFrame({
            "mode": g["mode"], "n": g["n"],
            "mean µs (95% CI)": _cis(g, "mean"),
            "p50 µs (95% CI)": _cis(g, "p50"),
            "p99 µs (95% CI)": _cis(g, "p99"),
            "removed, mean-based": _removed(g, "removed_mean"),
            "removed, p50-based": _removed(g, "removed_p50"),
            "vs warm, p50-based": (_removed(g, "removed_vs_warm_p50")
                                   if "removed_vs_warm_p50" in g else "–"),
            "WS KiB": g["ws_kib"].map(fmt), "runs": g["runs"].map(lambda v: fmt(v, 0)),
            "encoded B": g["encoded_bytes"].map(lambda v: fmt(v, 0)),
            "preheat µs p50 (CI), n": [
                (ci(r.preheat_us_p50, r.preheat_us_p50_lo, r.preheat_us_p50_hi, 2) + f", n={int(r.preheat_n)}")
                if _num(r.preheat_n) else "–" for r in g.itertuples()],
            "GB/s p50": g["gb_per_s_p50"].map(lambda v: fmt(v, 2)),
            "all lines in time": g["completed_share"].map(lambda v: pct(v)),
            "CPI": [fmt(r.cpi, 2) if _num(r.cpi) is not None else r.cpi_note for r in g.itertuples()],
            "label": g["label"]})
        srv = (summ.get("servers") or {}).get(server, {})
        meta = srv.get("meta") or {}
        cap = (f"{DISPLAY.get(server, server)}: {int(g['n'].max())} samples per mode at most "
               f"({srv.get('samples')} in all, source: {srv.get('source')}); "
               f"lead {meta.get('lead_us', '?')} µs; {meta.get('machine', '')}; measured")
        rep.heading(DISPLAY.get(server, server), 3)
        if "removed_p50_method" in g and (g["removed_p50_method"] == "within rounds").any():
            rep.note("The request kinds differ between rounds (every mode of a round runs the "
                     "same kind): \"removed, p50-based\" is the median over rounds of "
                     "(cold − mode) over the median of (cold − floor), so p50s falling in "
                     "different kinds' clusters cannot mislead it.")
        for f in (g["flag"].dropna() if "flag" in g else []):
            if str(f):
                rep.note(f"FLAG {f}", "warn")
        for sk in meta.get("skipped") or []:
            if isinstance(sk, dict):
                rep.note(f"{sk.get('mode')}: not measured on {DISPLAY.get(server, server)}: "
                         f"{sk.get('reason')}")
            else:
                rep.note(f"not measured: {sk}")
        if (meta.get("prepared") or {}).get("detail"):
            rep.note(f"data set: {meta['prepared']['detail']}")
        rep.table(d, cap)
    bk = _read_csv(out / "by_kind.csv")
    for server, g in (bk.groupby("server", sort=False) if len(bk) else []):
        d = pd.DataFrame({
            "request kind": g["kind"], "mode": g["mode"], "n": g["n"],
            "mean µs (95% CI)": _cis(g, "mean"),
            "p50 µs (95% CI)": _cis(g, "p50"),
            "removed, p50-based": _removed(g, "removed_p50"),
            "label": g["label"]})
        rep.table(d, f"{DISPLAY.get(server, server)} per request kind (each round measures one "
                     "kind in every mode; measured)")
    dec = _read_csv(out / "decomposition.csv")
    if len(dec):
        rep.heading("Where cold-start time goes (decomposition)")
        rep.text("Cold overhead = cold-sweep − floor (hot where measured, else warm). It splits "
                 "into the part an idle gap costs without any eviction (control − floor: waking "
                 "the CPU and the idle path) and the "
                 "part that is cache loss (cold-sweep − control). Each strategy's row is how much "
                 "of the overhead it removes. Medians: differences of medians; means: differences "
                 "of means; 95% CIs from a paired bootstrap over rounds. Measured.")
        for (server, st), g in dec.groupby(["server", "stat"], sort=False):
            d = pd.DataFrame({
                "component": g["component"], "formula": g["formula"],
                "µs (95% CI)": _cis(g, "us"),
                "share of the cold overhead (95% CI)": [
                    pct(r.share, r.share_lo, r.share_hi, r.share_undefined) for r in g.itertuples()],
                "n": g["n"], "label": g["label"]})
            rep.table(d, f"{DISPLAY.get(server, server)}, {'medians' if st == 'p50' else 'means'} "
                         f"({int(g['rounds'].iloc[0])} rounds)")
    sp = out / "stages.png"
    if sp.exists():
        rep.heading("Where each mode's response time goes (stages)")
        rep.text("Every response splits where the server thread started on the request (it "
                 "returned from its wait with it, as the agent saw): start = send (announced "
                 "modes: the announced arrival) → the server thread runs; serve = from then until "
                 "the client has the reply. Bars are each stage's p50 (so they need not add up "
                 "to the latency's p50). Measured.")
        rep.image(sp, "p50 of the start and serve stages per mode (measured)",
                  out / "stages.svg")
    for line in (summ.get("tails") or []):
        rep.note(line)
    png = out / "figure3.png"
    if png.exists():
        rep.heading("Figure 3 equivalent: response-time CDFs")
        rep.image(png, "cumulative distribution of response time per mode (measured; log x)",
                  out / "figure3.svg")
        links = [f"<a href='{html.escape(p.name)}'>{html.escape(p.name)}</a>"
                 for p in sorted(out.glob("figure3-*.*"))]
        if links:
            rep.html("<p class='note'>per server: " + ", ".join(links) + "</p>")


def peer_section(rep: Report, out: Path) -> None:
    pj = _read_json(out / "peer" / "peer.json")
    if not pj:
        return
    rep.heading("Peer check: our load generator vs an established client")
    _banner(rep, "peer", pj.get("state"), pj.get("failed"))
    o = pj.get("options", {})
    rep.text(f"Same server (started by preheat serve, no agent), closed loop, "
             f"{o.get('connections')} connections on both sides, {o.get('seconds')} s per run, "
             f"{o.get('repeats')} repeat(s); "
             + (f"{rows['order']}. The main comparison is {rows['main']} vs the peer (both wait "
                f"in epoll_wait, then read); {', '.join(rows['extra'])} are extra rows; the "
                f"verdict is {rows['verdict']}. "
                if (rows := pj.get("rows")) else
                "order per repeat: ours (--wait block), peer, ours (--wait spin). The main "
                "comparison is ours --wait block vs the peer (both block in the kernel); --wait "
                "spin is an extra row. ")
             + f"Agreement = ratio within ±{100 * o.get('tolerance', 0.05):.0f}%. Measured; raw "
               f"outputs in peer/raw/.")
    m = pd.DataFrame(pj.get("measurements", []))
    if len(m):
        cols = [c for c in ("server", "repeat", "client", "side", "connections", "threads",
                            "duration_s", "requests", "throughput_rps", "mean_us", "p50_us",
                            "p99_us", "max_us", "errors", "littles_law_rps", "raw") if c in m]
        rep.table(m[cols], "every run (littles_law_rps = connections / mean latency: a closed "
                           "loop's throughput should match it)")
    c = pd.DataFrame(pj.get("comparisons", []))
    if len(c):
        c = c.assign(ratio=c["ratio"].map(lambda v: f"{v:.3f}"))
        # Rows of a peer.json written before --wait epoll have no kind.
        old = c["extra"].map(lambda e: "extra (spin)" if e else "main (block)")
        c = c.assign(kind=c["kind"].fillna(old) if "kind" in c else old)
        rep.table(c[["server", "repeat", "kind", "ours", "peer", "metric", "ours_value",
                     "peer_value", "ratio", "verdict"]], "ours / peer")
    for s, v in (pj.get("verdicts") or {}).items():
        note = (pj.get("notes") or {}).get(s, {}).get("peer", "")
        rep.text(f"{s}: {v}. {note}")


def sweep_section(rep: Report, out: Path) -> None:
    sj = _read_json(out / "sweep" / "sweep.json")
    if not sj:
        return
    rep.heading(f"Sweep on {DISPLAY.get(sj.get('server'), sj.get('server'))}")
    failed = {p["id"]: f"{p['params']}: {p['reason']}" for p in sj.get("points", [])
              if p.get("status") == "failed"}
    _banner(rep, "sweep", sj.get("state"), failed)
    rep.text(f"Parameters: {sj.get('params')}; executor {sj.get('executor')} with "
             f"{sj.get('jobs')} point(s) at a time; each point is one preheat demo "
             f"({sj.get('base', {}).get('rounds')} rounds). Measured.")
    pts = pd.DataFrame([{"point": p["id"], **p["params"], "status": p["status"],
                         "host": p.get("host"), "seconds": p.get("seconds")}
                        for p in sj.get("points", [])])
    if len(pts):
        rep.table(pts, "points")
    res = _read_csv(out / "sweep" / "sweep.csv")
    if len(res):
        keys = [k for k in (sj.get("params") or {})]
        d = res[["point", *keys, "mode", "n"]].copy()
        d["p50 µs (95% CI)"] = _cis(res, "p50")
        d["mean µs (95% CI)"] = _cis(res, "mean")
        d["removed, p50-based"] = _removed(res, "removed_p50")
        d["removed, mean-based"] = _removed(res, "removed_mean")
        rep.table(d, "per point and mode (measured)")
    for name in sj.get("params", {}):
        png = out / "sweep" / f"sweep-{name}.png"
        if png.exists():
            rep.image(png, f"median latency and overhead removed vs {name} (measured)",
                      out / "sweep" / f"sweep-{name}.svg")


def cosim_section(rep: Report, out: Path) -> None:
    """The cosim sweep in DIR/sweep-cosim/ as a report section (nothing if absent)."""
    sdir = Path(out) / COSIM_DIR
    sj = _read_json(sdir / "sweep.json")
    if not sj:
        return
    rep.heading("Sweep of the partial-coscheduling simulator (SIMULATED)")
    if sj.get("state") != "complete":
        rep.note(f"sweep: {str(sj.get('state')).upper()} — the rows below are the points that "
                 "completed.", "warn")
    for p in sj.get("points", []):
        if p.get("status") == "failed":
            rep.note(f"sweep: {p['id']} {p['params']} FAILED: {p.get('reason')}", "fail")
    rep.text(f"Parameters: {sj.get('params')}; executor {sj.get('executor')} with "
             f"{sj.get('jobs')} point(s) at a time; each point is one `preheat cosched simulate` "
             "(every number simulated; predicted = the setup's closed form, modeled).")
    pts = pd.DataFrame([{"point": p["id"], **p["params"], "status": p["status"],
                         "host": p.get("host"), "seconds": p.get("seconds")}
                        for p in sj.get("points", [])])
    if len(pts):
        rep.table(pts, "points (simulator runs)")
    try:
        res = pd.read_csv(sdir / "sweep.csv")
    except (OSError, ValueError, pd.errors.EmptyDataError):
        res = pd.DataFrame()
    if len(res):
        rep.table(res, "per point and policy (SIMULATED; predicted_improvement: modeled)")
    for name in sj.get("params", {}):
        png = sdir / f"sweep-{name}.png"
        if png.exists():
            rep.image(png, f"SIMULATED improvement over full vs {name}", sdir / f"sweep-{name}.svg")


def build(out: Path) -> Path:
    out = Path(out)
    rep = Report("preheat lab: response time with preheated caches on this machine")
    rep.text("Reproduces Gottschlag & Bellosa, Reducing Response Time with Preheated Caches, §4.1 "
             "(Table 1, Figure 3) on real servers. Labels: measured = on this machine; "
             f"{PAPER_LABEL} = the paper's numbers, for reference only.")
    machine(rep, out)
    table1_section(rep, out)
    peer_section(rep, out)
    sweep_section(rep, out)
    cosim_section(rep, out)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                   if p.is_file() and not p.name.startswith(".") and p.name != "report.html"
                   and "/raw/" not in f"/{p.relative_to(out)}")
    if files:
        rep.heading("Files")
        rep.html("<p class='note'>" + ", ".join(
            f"<a href='{html.escape(f)}'>{html.escape(f)}</a>" for f in files) +
            "; raw CLI outputs under raw/, peer/raw/, sweep/raw/.</p>")
    return rep.write(out / "report.html")


def publish(out: Path) -> Path:
    """`build(OUT)` and say where the report is."""
    path = build(out)
    print(f"wrote {path}")
    return path
