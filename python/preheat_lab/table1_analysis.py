"""Table 1's analysis of one server's samples: the table rows (mean, median and p99 with CIs, the
share of the cold overhead each mode removes, working set and preheat time), where cold-start
time goes (decomposition), the headline beside the paper's Table 1, and the same per request
kind."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from . import stats
from .table1_run import AUTO, CONN_PRIMED
from .table1_samples import (
    COLD,
    CONTROL,
    DISPLAY,
    HOT,
    LINE_BYTES,
    WARM,
    floor_mode,
    loads_lines,
    mode_order,
    strategy_modes,
)

PAPER_LABEL = "paper (Odroid-XU3, ARM Cortex-A15)"
#: Table 1 of the paper (averages over 100000 requests).
PAPER = {
    "nginx": dict(warm=367.6, cold=498.0, preheated=388.5, cpi_warm=3.63, cpi_cold=5.78,
                  cpi_preheated=4.12, ws_kib=235.8, preheat_us=77.4),
    "memcached": dict(warm=178.8, cold=238.8, preheated=188.5, cpi_warm=3.81, cpi_cold=5.66,
                      cpi_preheated=4.30, ws_kib=142.3, preheat_us=53.0),
    "mariadb": dict(warm=3970.0, cold=4320.0, preheated=4069.0, cpi_warm=2.20, cpi_cold=2.44,
                    cpi_preheated=2.29, ws_kib=621.8, preheat_us=146.4),
}
PAPER_AVERAGE_REMOVED = 0.798  # "on average the overhead is reduced by 79.8%"
PAPER_NAME = {"nginx": "nginx", "memcached": "memcached", "mariadb": "MariaDB"}


def paper_removed(server: str) -> float:
    p = PAPER[server]
    return (p["cold"] - p["preheated"]) / (p["cold"] - p["warm"])


def cpi_text(meta: dict, topo: dict) -> tuple[str, dict | None]:
    """CPI column: the CLI's numbers when it has a PMU, else why not."""
    cpi = meta.get("cpi")
    pmu = meta.get("pmu", topo.get("pmu"))
    if cpi:
        return "measured", cpi
    if pmu is False:
        return "n/a (no PMU on this machine)", None
    if pmu is True:
        return "n/a (PMU present, but the demo reported no CPI)", None
    return "n/a (the demo reported no CPI)", None


def _cli_row(meta: dict, mode: str) -> dict:
    for r in meta.get("rows", []) or []:
        if r.get("mode") == mode:
            return r
    return {}


def _first(*vals: Any) -> Any:
    for v in vals:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            return v
    return None


def _removed(mat: np.ndarray, modes: list[str], stat: str, boot: int,
             floor: str = WARM) -> dict[str, stats.Derived]:
    """Share of the cold overhead (cold − FLOOR) each mode but FLOOR and cold removes, paired
    bootstrap over rounds; empty without both baselines."""
    if COLD not in modes or floor not in modes:
        return {}
    fns = {m: stats.share_fn(COLD, floor, m) for m in modes if m not in (floor, COLD)}
    return stats.paired_bootstrap(mat, modes, fns, stat, boot)


def _removed_within_rounds(mat: np.ndarray, modes: list[str], boot: int,
                           floor: str = WARM) -> dict[str, stats.Derived]:
    """Like `_removed` with the p50, but on per-round differences: median over rounds of
    (cold − mode) over the median of (cold − FLOOR), paired bootstrap over rounds. For mixed
    request kinds (every mode of a round runs the round's kind), where the p50s of two modes can
    fall in different kinds' clusters."""
    if COLD not in modes or floor not in modes:
        return {}
    cold = mat[:, modes.index(COLD)]
    diff = cold[:, None] - mat  # column j: cold − mode j, per round
    others = [m for m in modes if m not in (floor, COLD)]

    def share(m: str) -> stats.StatFn:
        def f(s: dict[str, np.ndarray]) -> np.ndarray:
            d = s[floor]
            with np.errstate(invalid="ignore", divide="ignore"):
                r = s[m] / d
            return np.where(d > 0, r, np.nan)
        return f

    return stats.paired_bootstrap(diff, modes, {m: share(m) for m in others}, "p50", boot)


#: A share outside this range means the floor or the cold baseline is not what it claims.
SHARE_LIMIT = 1.0


def _odd(name: str, v: float) -> bool:
    """Whether share NAME = V is not what a share can be. Against warm (whose CPU slept through
    the lead) more than all of it is expected where a mode kept the CPU awake: only a loss beyond
    −100% is odd there (the CLI's rule)."""
    if name == "removed_vs_warm":
        return v < -SHARE_LIMIT
    return abs(v) > SHARE_LIMIT


def share_flag(mode: str, floor: str, **shares: float) -> str:
    """'' or why MODE's shares are suspect (outside ±100%; against warm below −100%): flagged,
    never printed silently."""
    bad = [f"{k.replace('_', ' ')} {v:.0%}" for k, v in shares.items()
           if v is not None and np.isfinite(v) and _odd(k, v)]
    if not bad:
        return ""
    return (f"{mode}: {', '.join(bad)} outside ±100%: the {floor} floor or the cold baseline is "
            "not what it claims for this mode")


def analyze_server(server: str, df: pd.DataFrame, meta: dict, topo: dict,
                   boot: int = stats.DEFAULT_BOOT) -> dict[str, pd.DataFrame]:
    """Table 1 rows, decomposition rows and the headline (beside the paper) for one server."""
    modes = mode_order(df["mode"].unique().tolist(), meta)
    strategies = strategy_modes(modes)
    cpi_label, cpi_vals = cpi_text(meta, topo)
    mat, rounds = stats.round_matrix(df, modes)
    floor = floor_mode(modes, meta)
    have_baseline = COLD in modes and floor in modes

    # Mixed request kinds: the p50 share on per-round differences (as `preheat demo` does).
    mixed = "kind" in df.columns and df["kind"].nunique(dropna=True) > 1
    shares = {st: _removed(mat, modes, st, boot, floor) for st in ("mean", "p50")}
    vs_warm = ({st: _removed(mat, modes, st, boot, WARM) for st in ("mean", "p50")}
               if floor != WARM else shares)
    if mixed:
        shares = {**shares, "p50": _removed_within_rounds(mat, modes, boot, floor)}
        vs_warm = {**vs_warm, "p50": _removed_within_rounds(mat, modes, boot, WARM)}

    rows = []
    for m in modes:
        lat = df.loc[df["mode"] == m, "latency_us"]
        s = stats.summarize(lat, boot)
        r = {"server": server, "server_name": DISPLAY.get(server, server), "mode": m,
             "label": meta.get("label", "measured"), "n": s.n,
             "rounds": int(df.loc[df["mode"] == m, "round"].nunique())}
        r.update({k: v for k, v in s.to_dict().items() if k != "n"})
        for st in ("mean", "p50"):
            d = shares.get(st, {}).get(m)
            r[f"removed_{st}"] = d.value if d else (np.nan if m != COLD else 0.0)
            r[f"removed_{st}_lo"] = d.lo if d else np.nan
            r[f"removed_{st}_hi"] = d.hi if d else np.nan
            r[f"removed_{st}_undefined_share"] = d.undefined_share if d else np.nan
        if m == floor:
            for st in ("mean", "p50"):
                r[f"removed_{st}"] = 1.0 if have_baseline else np.nan
        # Beside the floor's share: the same against warm (caches warm, CPUs not kept awake).
        for st in ("mean", "p50"):
            d = vs_warm.get(st, {}).get(m)
            r[f"removed_vs_warm_{st}"] = (d.value if d else
                                          1.0 if m == WARM else 0.0 if m == COLD else np.nan)
            r[f"removed_vs_warm_{st}_lo"] = d.lo if d else np.nan
            r[f"removed_vs_warm_{st}_hi"] = d.hi if d else np.nan
            r[f"removed_vs_warm_{st}_undefined_share"] = d.undefined_share if d else np.nan
        r["floor"] = floor
        r["removed_p50_method"] = "within rounds" if mixed else "p50s"
        r["flag"] = "" if m in (floor, COLD, WARM, HOT) else share_flag(
            m, floor, removed=r["removed_p50"], removed_mean=r["removed_mean"],
            removed_vs_warm=r["removed_vs_warm_p50"])
        cr = _cli_row(meta, m)
        r["cli_overhead_removed"] = cr.get("overhead_removed")
        # Profile facts (from the CLI's row for strategies that load lines).
        r["ws_kib"] = cr.get("ws_kib")
        r["runs"] = cr.get("runs")
        r["encoded_bytes"] = cr.get("encoded_bytes")
        sub = df[(df["mode"] == m) & (df["lines_total"].fillna(0) > 0)]
        if len(sub) and loads_lines(m):
            pre = stats.summarize(sub["preheat_us"], boot)
            r.update(preheat_n=pre.n, preheat_us_mean=pre.mean, preheat_us_p50=pre.p50,
                     preheat_us_p50_lo=pre.p50_lo, preheat_us_p50_hi=pre.p50_hi)
            done = sub["lines_done"].fillna(0)
            ok = (sub["preheat_us"] > 0) & (done > 0)
            gbps = done[ok] * LINE_BYTES / sub.loc[ok, "preheat_us"] / 1e3
            r["gb_per_s_p50"] = stats.quantile(gbps, 0.5) if len(gbps) else np.nan
            r["completed_share"] = float((done >= sub["lines_total"]).mean())
            r["lines_total_p50"] = stats.quantile(sub["lines_total"], 0.5)
            if r["ws_kib"] is None:
                r["ws_kib"] = r["lines_total_p50"] * LINE_BYTES / 1024
        else:
            r.update(preheat_n=0, preheat_us_mean=np.nan, preheat_us_p50=np.nan,
                     preheat_us_p50_lo=np.nan, preheat_us_p50_hi=np.nan, gb_per_s_p50=np.nan,
                     completed_share=cr.get("completed_share"), lines_total_p50=np.nan)
        r["cli_gb_per_s"] = cr.get("gb_per_s")
        r["cpi"] = (cpi_vals or {}).get(m) if isinstance(cpi_vals, dict) else None
        r["cpi_note"] = cpi_label
        for k in ("server_start_us_p50", "trigger_lead_us_p50", "worker_lead_us_p50"):
            r[k] = cr.get(k)
        rows.append(r)
    table = pd.DataFrame(rows)

    # Decomposition: where cold-start time goes.
    drows = []
    if have_baseline:
        for st in ("mean", "p50"):
            comps: list[tuple[str, str, str, str]] = [
                ("cold overhead", f"cold-sweep − {floor}", COLD, floor)]
            if CONTROL in modes:
                comps += [("wake-up / idle", f"control − {floor}", CONTROL, floor),
                          ("cache loss", "cold-sweep − control", COLD, CONTROL)]
            if floor == HOT and WARM in modes:
                comps += [("warm above the floor", "warm − hot", WARM, HOT)]
            if "cold-idle" in modes:
                comps += [("plain idle gap (no sweep)", f"cold-idle − {floor}", "cold-idle",
                           floor)]
            for sm in strategies:
                comps += [(f"removed by {sm}", f"cold-sweep − {sm}", COLD, sm)]
            if CONN_PRIMED in modes and AUTO in modes:
                # --connection-row: what auto leaves that one request on the connection restores.
                comps += [("auto − conn-primed (the connection)", f"{AUTO} − {CONN_PRIMED}",
                           AUTO, CONN_PRIMED)]
            fns = {}
            for name, _, a, b in comps:
                fns[name + "|us"] = stats.diff_fn(a, b)
                fns[name + "|share"] = stats.part_share_fn(a, b, COLD, floor)
            res = stats.paired_bootstrap(mat, modes, fns, st, boot)
            for name, formula, a, b in comps:
                us, sh = res[name + "|us"], res[name + "|share"]
                na = int(np.isfinite(mat[:, modes.index(a)]).sum())
                nb = int(np.isfinite(mat[:, modes.index(b)]).sum())
                drows.append({"server": server, "server_name": DISPLAY.get(server, server),
                              "stat": st, "component": name, "formula": formula,
                              "us": us.value, "us_lo": us.lo, "us_hi": us.hi,
                              "share": sh.value, "share_lo": sh.lo, "share_hi": sh.hi,
                              "share_undefined": sh.undefined_share,
                              "n": f"{a}: {na}, {b}: {nb}", "rounds": len(rounds),
                              "label": "measured"})
    decomp = pd.DataFrame(drows)

    # Headline beside the paper: warm / cold / preheated (= the paper's method: lines) means.
    head = []
    t = table.set_index("mode")
    if have_baseline:
        picks = []
        if "preheat:lines" in t.index:
            picks.append(("preheat:lines", "the paper's preheating (prefetch the working set)"))
        if strategies:
            finite = [m for m in strategies if np.isfinite(t.loc[m, "mean"])]
            best = min(finite, key=lambda m: t.loc[m, "mean"]) if finite else None
            if best and best != "preheat:lines":
                picks.append((best, "best strategy here (lowest mean)"))
        for sm, what in picks:
            lines_mode = sm if np.isfinite(t.loc[sm].get("preheat_us_mean", np.nan)) else (
                "preheat:lines" if "preheat:lines" in t.index else sm)
            head.append({
                "server": server, "server_name": DISPLAY.get(server, server),
                "source": f"measured here ({meta.get('machine', 'this machine')})",
                "preheated_mode": f"{sm}: {what}",
                "floor": floor, "hot": t.loc[HOT, "mean"] if HOT in t.index else None,
                "warm": t.loc[WARM, "mean"] if WARM in t.index else None,
                "cold": t.loc[COLD, "mean"],
                "preheated": t.loc[sm, "mean"],
                "removed": t.loc[sm, "removed_mean"],
                "removed_lo": t.loc[sm, "removed_mean_lo"],
                "removed_hi": t.loc[sm, "removed_mean_hi"],
                "cpi": cpi_label if cpi_vals is None else json.dumps(cpi_vals),
                "ws_kib": _first(t.loc[lines_mode, "ws_kib"]),
                "preheat_us": t.loc[lines_mode].get("preheat_us_mean"),
                "n": f"{floor} {t.loc[floor, 'n']}, cold {t.loc[COLD, 'n']}, {sm} {t.loc[sm, 'n']}",
                "label": "measured (mean)"})
    head.append(_paper_row(server))
    # Request kinds (MariaDB's TPC-C-like transaction types: every mode of a round measures the
    # same type): the same table per kind, so a mix of fast and slow types does not hide what
    # happens to each.
    kinds = []
    if "kind" in df.columns and df["kind"].nunique(dropna=True) > 1:
        for kind, dk in df.groupby("kind", sort=True):
            kmodes = [m for m in modes if m in set(dk["mode"])]
            kmat, krounds = stats.round_matrix(dk, kmodes)
            kshare = _removed(kmat, kmodes, "p50", boot, floor_mode(kmodes, meta))
            for m in kmodes:
                s_ = stats.summarize(dk.loc[dk["mode"] == m, "latency_us"], boot)
                d = kshare.get(m)
                kinds.append({"server": server, "server_name": DISPLAY.get(server, server),
                              "kind": kind, "mode": m, "n": s_.n, "rounds": len(krounds),
                              "mean": s_.mean, "mean_lo": s_.mean_lo, "mean_hi": s_.mean_hi,
                              "p50": s_.p50, "p50_lo": s_.p50_lo, "p50_hi": s_.p50_hi,
                              "removed_p50": d.value if d else (
                                  1.0 if m == floor_mode(kmodes, meta) else 0.0 if m == COLD
                                  else np.nan),
                              "removed_p50_lo": d.lo if d else np.nan,
                              "removed_p50_hi": d.hi if d else np.nan,
                              "removed_p50_undefined_share": d.undefined_share if d else np.nan,
                              "label": "measured"})
    return {"table": table, "decomposition": decomp, "headline": pd.DataFrame(head),
            "by_kind": pd.DataFrame(kinds)}


def _paper_row(server: str) -> dict:
    """The headline row of the paper's Table 1 for SERVER (placeholders when it has none)."""
    p = PAPER.get(server)
    return {
        "server": server, "server_name": DISPLAY.get(server, server), "source": PAPER_LABEL,
        "preheated_mode": "preheated (paper)" if p else "—",
        "warm": p["warm"] if p else None, "cold": p["cold"] if p else None,
        "preheated": p["preheated"] if p else None,
        "removed": paper_removed(server) if p else None, "removed_lo": None, "removed_hi": None,
        "cpi": (f"{p['cpi_warm']} / {p['cpi_cold']} / {p['cpi_preheated']}" if p else "—"),
        "ws_kib": p["ws_kib"] if p else None, "preheat_us": p["preheat_us"] if p else None,
        "n": "100000 requests" if p else "—",
        "label": "paper (averages)" if p else "— (no row in the paper)"}


def analyze_server_paper_only(server: str) -> pd.DataFrame:
    return pd.DataFrame([_paper_row(server)])


# ---------------------------------------------------------------------------------------------
# Where each mode's time goes, and what the slowest requests have in common

#: The tail: a mode's slowest (1 − TAIL_Q) share of requests.
TAIL_Q = 0.95


def stages_table(server: str, df: pd.DataFrame, meta: dict | None = None) -> pd.DataFrame:
    """Per mode: the p50 of the two stages of a response (split where the server thread started
    on the request, as the agent saw): start = send (announced: the announced arrival) → server
    thread runs; serve = from then until the client has the reply. Requests without a seen start
    are left out (their n is said). Where the demo ran with `--syscall-stages`, also the split at
    the server's system calls (to read, compute, reply; `n_sys` requests had one)."""
    rows = []
    for m in mode_order(df["mode"].unique().tolist(), meta):
        d = df[df["mode"] == m]
        seen = d[np.isfinite(pd.to_numeric(d["server_start_us"], errors="coerce"))]
        start = seen["server_start_us"].clip(lower=0)
        row = {"server": server, "server_name": DISPLAY.get(server, server), "mode": m,
               "n": int(len(d)), "n_stages": int(len(seen)),
               "latency_p50": stats.quantile(d["latency_us"], 0.5) if len(d) else np.nan,
               "start_p50": stats.quantile(start, 0.5) if len(seen) else np.nan,
               "serve_p50": (stats.quantile(seen["latency_us"] - start, 0.5)
                             if len(seen) else np.nan),
               "label": "measured"}
        row.update(_syscall_stages(d))
        rows.append(row)
    return pd.DataFrame(rows)


#: The demo's per-request split at the server's system calls (`--syscall-stages`) → columns.
SYSCALL_STAGES = {"sys_to_read_us": "to_read_p50", "sys_compute_us": "compute_p50",
                  "sys_reply_us": "reply_p50"}
#: Added to the split later (records without it still give the three above).
SYSCALL_STAGES_OPTIONAL = {"sys_to_event_us": "to_event_p50"}


def _syscall_stages(d: pd.DataFrame) -> dict:
    """The p50s of the split at the server's system calls over the requests that have one
    (empty where the records have none: a demo run without `--syscall-stages`)."""
    if not all(c in d.columns for c in SYSCALL_STAGES):
        return {}
    num = {c: pd.to_numeric(d[c], errors="coerce") for c in SYSCALL_STAGES}
    ok = np.isfinite(num["sys_to_read_us"]) & np.isfinite(num["sys_compute_us"])
    if not ok.any():
        return {}
    out: dict = {"n_sys": int(ok.sum())}
    for c, name in SYSCALL_STAGES.items():
        out[name] = stats.quantile(num[c][ok], 0.5)
    for c, name in SYSCALL_STAGES_OPTIONAL.items():
        if c in d.columns:
            out[name] = stats.quantile(pd.to_numeric(d[c], errors="coerce")[ok], 0.5)
    return out


def _share(mask: pd.Series) -> float:
    return float(mask.mean()) if len(mask) else np.nan


def tail_table(server: str, df: pd.DataFrame) -> pd.DataFrame:
    """Per preheat mode: the requests at or above the mode's TAIL_Q latency quantile against the
    rest, feature by feature — announcement acted on late or not at all, lines not all issued in
    time, when the server thread started, what was left of the lead when the worker started."""
    rows = []
    for m in [m for m in df["mode"].unique() if str(m).startswith("preheat:")]:
        d = df[df["mode"] == m]
        if len(d) < 20:
            continue
        k = max(1, round((1 - TAIL_Q) * len(d)))
        tail = d.nlargest(k, "latency_us")
        rest = d.drop(tail.index)
        lead_t, lead_r = tail["worker_lead_us"], rest["worker_lead_us"]
        lines = loads_lines(m)

        def incomplete(x: pd.DataFrame) -> pd.Series:
            return (x["lines_total"].fillna(0) > 0) & (x["lines_done"] < x["lines_total"])

        rows.append({
            "server": server, "server_name": DISPLAY.get(server, server), "mode": m,
            "tail_q": TAIL_Q, "n_tail": int(len(tail)), "n_rest": int(len(rest)),
            "latency_tail_p50": stats.quantile(tail["latency_us"], 0.5),
            "latency_rest_p50": stats.quantile(rest["latency_us"], 0.5),
            "not_acted_tail": _share(lead_t.isna()), "not_acted_rest": _share(lead_r.isna()),
            "late_tail": _share(lead_t < 0), "late_rest": _share(lead_r < 0),
            "lines_incomplete_tail": _share(incomplete(tail)) if lines else np.nan,
            "lines_incomplete_rest": _share(incomplete(rest)) if lines else np.nan,
            "server_start_tail_p50": stats.quantile(stats.clean(tail["server_start_us"]), 0.5),
            "server_start_rest_p50": stats.quantile(stats.clean(rest["server_start_us"]), 0.5),
            "worker_lead_tail_p50": stats.quantile(stats.clean(lead_t), 0.5),
            "worker_lead_rest_p50": stats.quantile(stats.clean(lead_r), 0.5),
            "label": "measured"})
    return pd.DataFrame(rows)


def tail_summary(t: pd.DataFrame) -> list[str]:
    """One sentence per mode: what its tail requests have in common (the features where the
    tail differs most from the rest), or that nothing recorded sets them apart."""
    out = []
    for r in t.itertuples():
        found = []
        for what, a, b in (("the announcement was not acted on", r.not_acted_tail,
                            r.not_acted_rest),
                           ("the worker started after the arrival", r.late_tail, r.late_rest),
                           ("not all lines were issued in time", r.lines_incomplete_tail,
                            r.lines_incomplete_rest)):
            if np.isfinite(a) and np.isfinite(b) and a - b >= 0.2:
                found.append(f"{what} in {a:.0%} of them (rest {b:.0%})")
        st, sr = r.server_start_tail_p50, r.server_start_rest_p50
        if np.isfinite(st) and np.isfinite(sr) and st - sr >= max(10.0, 0.5 * abs(sr)):
            found.append(f"the server thread started {st:.0f} µs after the arrival (p50; rest "
                         f"{sr:.0f} µs)")
        lead = ("; ".join(found) if found else
                "nothing recorded sets them apart (not the lead, the lines or the start: the "
                "time went elsewhere — the serve stage)")
        out.append(f"{DISPLAY.get(r.server, r.server)} {r.mode}: the slowest "
                   f"{1 - r.tail_q:.0%} ({r.n_tail} requests, p50 {r.latency_tail_p50:.0f} µs "
                   f"vs {r.latency_rest_p50:.0f}): {lead}. Measured.")
    return out
