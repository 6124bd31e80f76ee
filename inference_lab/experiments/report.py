"""report.html: one self-contained page per run (or per comparison of runs), plots made
with matplotlib and embedded as PNG data URIs, plus the per-phase summary as a table.

Plots of one run: controller limit and in-flight over time with the timeline's actions
marked (faults in purple, the stretches with a fault in force shaded) and each phase's band [max_num_seqs, max_num_seqs + max_waiting] shaded; goodput
(tokens/s of 200s) and the 529 rate per window, with the oracle's goodput; TTFT and e2e
p50/p99 per window, with the oracle's e2e p50; the server's waiting and running.
A comparison overlays the runs' limits, goodput and e2e p50 and tables their scores.
A P/D run (or a sweep of P:D ratios) adds a table of TTFT, TPOT and the transfers per
ratio and a plot of TTFT against TPOT, one point per ratio.

Knows matplotlib (Agg, no display) and HTML. Does not know how the numbers were made.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

import numpy as np

from inference_lab.common.extras import require
from inference_lab.experiments.outcomes import refused as refusals
from inference_lab.experiments.summary import window_series

__all__ = ["write_report", "write_comparison", "write_pd_sweep"]

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
img { width: 100%; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.muted { color: #666; font-size: 0.9em; }
"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _plt():
    require("matplotlib", "experiment plots need", "experiments").use("Agg")
    import matplotlib.pyplot as plt

    return plt


ACTION_COLOR = "#d62728"
FAULT_COLOR = "#9467bd"


def _mark_actions(ax, actions: list[dict], label: bool = False,
                  phases: list[dict] | None = None) -> None:
    """Each action a dashed line (a fault's in purple; the end of a fault dotted, not
    labelled), and with `phases` each stretch with a fault in force shaded."""
    for p in phases or ():
        if p.get("fault"):
            ax.axvspan(p["start_s"], p["end_s"], color=FAULT_COLOR, alpha=0.08, linewidth=0)
    for i, a in enumerate(actions):
        kind = a.get("kind", "")
        color = FAULT_COLOR if kind.startswith("fault") else ACTION_COLOR
        ax.axvline(a["at"], color=color, linestyle=":" if kind == "fault_end" else "--", linewidth=1)
        if label and kind != "fault_end":
            ax.annotate(a["label"], (a["at"], 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -12 - 10 * (i % 2)), textcoords="offset points", fontsize=8,
                        color=color)


def _frame(ax, xmax: float, xlabel: str, ylabel: str, *, floor: bool = True,
           loc: str = "upper left", ncol: int = 1) -> None:
    """A time series' axes: x from 0 to `xmax`, y from 0 (`floor`), labels, the legend."""
    ax.set_xlim(0, xmax)
    if floor:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc=loc, fontsize=8, ncol=ncol)


def _fmt(v, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v * scale:,.{digits}f}{unit}"


def _phase_table(summary: dict) -> str:
    rows = ["<tr><th class=l>phase</th><th class=l>fault</th><th>from–to s</th>"
            "<th>max_num_seqs / max_waiting</th>"
            "<th>limit p50</th><th>in band</th><th>goodput tok/s</th><th>oracle tok/s</th>"
            "<th>refused %</th><th>e2e p50 / p99 ms</th><th>oracle e2e p50 ms</th>"
            "<th>score goodput</th><th>score e2e p50</th><th>settle s</th><th>into band s</th>"
            "<th>cached % / oracle</th></tr>"]
    for p in summary["phases"]:
        s, o, sc = p["steady"], p["oracle"], p["scores"]
        rows.append(
            f"<tr><td class=l>{html.escape(p['action'])}</td>"
            f"<td class=l>{html.escape(p.get('fault') or '–')}</td>"
            f"<td>{p['start_s']:.0f}–{p['end_s']:.0f}</td>"
            f"<td>{p['capacity']['max_num_seqs']} / {p['capacity']['max_waiting']}</td>"
            f"<td>{_fmt(s['limit_p50'])}</td><td>{_fmt(p['limit_in_band'], ' %', 100, 0)}</td>"
            f"<td>{_fmt(s['goodput_tok_s'], digits=0)}</td><td>{_fmt(o['goodput_tok_s'], digits=0)}</td>"
            f"<td>{_fmt(s['frac_529'], '', 100)}</td>"
            f"<td>{_fmt(s['e2e_p50_s'], '', 1000, 0)} / {_fmt(s['e2e_p99_s'], '', 1000, 0)}</td>"
            f"<td>{_fmt(o['e2e_p50_s'], '', 1000, 0)}</td>"
            f"<td>{_fmt(sc['goodput'], digits=2)}</td><td>{_fmt(sc['e2e_p50'], digits=2)}</td>"
            f"<td>{_fmt(sc['settle_s'])}</td><td>{_fmt(sc.get('band_settle_s'))}</td>"
            f"<td>{_fmt(s.get('cached_frac'), '', 100)} / {_fmt(o.get('cache_hit_rate'), '', 100)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _run_figures(run: dict, summary: dict, window: float) -> list[tuple[str, str]]:
    plt = _plt()
    req, ctl, srv = run["requests"], run["controller"], run["server"]
    actions = run.get("actions", [])
    duration = summary["duration_s"]
    w = window_series(req, 0.0, duration, window)
    figs = []

    fig, ax = plt.subplots(figsize=(11, 3.4))
    for p in summary["phases"]:
        lo, hi = p["band"]
        ax.axhspan(lo, hi if hi is not None else lo, xmin=p["start_s"] / duration,
                   xmax=p["end_s"] / duration, color="#2ca02c", alpha=0.12, linewidth=0)
        ax.hlines(p["oracle"]["concurrency"], p["start_s"], p["end_s"], colors="#2ca02c",
                  linestyles=":", linewidth=1.5)
    limit = np.where(np.isfinite(ctl["limit"]), ctl["limit"], np.nan)
    ax.step(ctl["t"], limit, where="post", label="controller limit", color="#1f77b4")
    ax.step(ctl["t"], ctl["inflight"], where="post", label="in flight", color="#ff7f0e",
            alpha=0.6, linewidth=0.8)
    _mark_actions(ax, actions, label=True, phases=summary["phases"])
    if any(p.get("fault") for p in summary["phases"]):
        ax.plot([], [], color=FAULT_COLOR, alpha=0.3, linewidth=6, label="fault in force")
    ax.set_xlim(0, duration)
    ax.set_xlabel("modelled seconds")
    ax.set_ylabel("requests")
    ax.plot([], [], color="#2ca02c", alpha=0.4, linewidth=6, label="max_num_seqs .. + max_waiting")
    ax.plot([], [], color="#2ca02c", linestyle=":", label="oracle concurrency")
    ax.legend(loc="upper right", fontsize=8)
    figs.append(("Controller limit and in-flight requests", _png(fig)))

    fig, ax = plt.subplots(figsize=(11, 3.0))
    ax.plot(w["t"], w["goodput"], label="goodput (tokens/s of 200s)", color="#1f77b4")
    for p in summary["phases"]:
        ax.hlines(p["oracle"]["goodput_tok_s"], p["start_s"], p["end_s"], colors="#2ca02c",
                  linestyles=":", linewidth=1.5)
    ax.plot([], [], color="#2ca02c", linestyle=":", label="oracle goodput")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(w["t"], w["rate_529"], color="#d62728", alpha=0.7, label="refused/s")
    ax2.set_ylabel("refused per second", color="#d62728")
    ax2.set_ylim(bottom=0)
    _mark_actions(ax, actions, phases=summary["phases"])
    ax.set_xlim(0, duration)
    ax.set_xlabel("modelled seconds")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower left", fontsize=8)
    figs.append(("Goodput and refusal rate", _png(fig)))

    fig, ax = plt.subplots(figsize=(11, 3.0))
    for name, color in (("e2e", "#1f77b4"), ("ttft", "#9467bd")):
        ax.plot(w["t"], w[f"{name}_p50"] * 1000, color=color, label=f"{name} p50")
        ax.plot(w["t"], w[f"{name}_p99"] * 1000, color=color, linestyle="--", alpha=0.7,
                label=f"{name} p99")
    for p in summary["phases"]:
        if p["oracle"]["e2e_p50_s"] is not None:  # (a P/D fleet's phases have no oracle)
            ax.hlines(p["oracle"]["e2e_p50_s"] * 1000, p["start_s"], p["end_s"], colors="#2ca02c",
                      linestyles=":", linewidth=1.5)
    ax.plot([], [], color="#2ca02c", linestyle=":", label="oracle e2e p50")
    _mark_actions(ax, actions, phases=summary["phases"])
    ax.set_xlim(0, duration)
    ax.set_ylabel("ms (modelled)")
    ax.set_xlabel("modelled seconds")
    positive = np.concatenate([w["ttft_p50"], w["e2e_p99"]]) * 1000
    positive = positive[np.isfinite(positive) & (positive > 0)]
    if positive.size:
        ax.set_yscale("log")
        ax.set_ylim(positive.min() / 1.5, positive.max() * 1.5)
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    figs.append((f"TTFT and end-to-end latency per {window:g} s window", _png(fig)))

    fig, ax = plt.subplots(figsize=(11, 2.8))
    if srv["t"].size:
        ax.step(srv["t"], srv["running"], where="post", label="running", color="#1f77b4")
        ax.step(srv["t"], srv["waiting"], where="post", label="waiting", color="#ff7f0e")
        ax.step(srv["t"], srv["max_num_seqs"], where="post", label="max_num_seqs",
                color="#7f7f7f", linestyle=":")
    _mark_actions(ax, actions, phases=summary["phases"])
    _frame(ax, duration, "modelled seconds", "requests", loc="upper right")
    figs.append(("Server queue (scraped every 250 ms)", _png(fig)))
    return figs


def _fleet_figures(run: dict, summary: dict, window: float) -> list[tuple[str, str]]:
    """A fleet's run: replicas, arrivals, latency against the SLO, refusals."""
    plt = _plt()
    req, fleet = run["requests"], run.get("fleet")
    actions = run.get("actions", [])
    duration = summary["duration_s"]
    auto = summary["autoscaling"]
    slo = auto.get("slo") or {}
    w = window_series(req, 0.0, duration, window)
    hours = duration >= 4 * 3600
    scale, unit = (1 / 3600, "modelled hours") if hours else (1.0, "modelled seconds")
    figs = []

    fig, ax = plt.subplots(figsize=(11, 3.4))
    if fleet is not None and fleet["t"].size:
        t = fleet["t"] * scale
        ax.step(t, fleet["desired"], where="post", label="desired", color="#1f77b4")
        ax.step(t, fleet["ready"], where="post", label="ready", color="#2ca02c")
        ax.step(t, fleet["replicas"] + fleet["draining"], where="post", label="existing (GPU cost)",
                color="#7f7f7f", linestyle=":", linewidth=1)
    oracle = auto.get("oracle") or {}
    windows = auto.get("windows") or {}
    if oracle.get("replicas") is not None:
        starts = np.array(windows["start_s"] + [duration]) * scale
        ax.step(starts, oracle["replicas"] + oracle["replicas"][-1:], where="post",
                label="oracle (fewest meeting the SLO)", color="#d62728", linestyle="--", linewidth=1)
    _mark_actions(ax, [dict(a, at=a["at"] * scale) for a in actions])
    _frame(ax, duration * scale, unit, "replicas")
    figs.append(("Replicas: desired, ready, and the oracle's", _png(fig)))

    fig, ax = plt.subplots(figsize=(11, 3.0))
    ax.plot(w["t"] * scale, w["sent"], color="#1f77b4", label=f"arrivals/s (per {window:g} s)")
    _frame(ax, duration * scale, unit, "requests/s")
    figs.append(("Arrival rate", _png(fig)))

    fig, ax = plt.subplots(figsize=(11, 3.0))
    for name, color in (("ttft", "#9467bd"), ("e2e", "#1f77b4")):
        ax.plot(w["t"] * scale, w[f"{name}_p50"], color=color, label=f"{name} p50")
        ax.plot(w["t"] * scale, w[f"{name}_p99"], color=color, linestyle="--", alpha=0.7, label=f"{name} p99")
        bound = slo.get(f"{name}_s")
        if bound:
            ax.axhline(bound, color=color, linestyle=":", linewidth=1.5, label=f"SLO {name} {bound:g} s")
    positive = np.concatenate([w["ttft_p50"], w["e2e_p99"]])
    positive = positive[np.isfinite(positive) & (positive > 0)]
    if positive.size:
        ax.set_yscale("log")
    _frame(ax, duration * scale, unit, "seconds (modelled)", floor=False, ncol=3)
    figs.append((f"Latency against the SLO per {window:g} s window", _png(fig)))

    fig, ax = plt.subplots(figsize=(11, 2.8))
    ax.plot(w["t"] * scale, w["rate_529"], color="#d62728", label="refused/s (a replica's queue full)")
    status, send = req["status"], req["send_s"]
    edges = np.arange(0.0, duration + 1e-9, window)
    if edges.size >= 2:
        unrouted = (status == 503) & ~refusals(status, req["error"])
        counts, _ = np.histogram(send[unrouted], bins=edges)
        ax.plot(w["t"][:counts.size] * scale, counts / window, color="#ff7f0e",
                label="503/s (no ready replica)")
    _frame(ax, duration * scale, unit, "per second")
    figs.append(("Refusals: 529s and 503s", _png(fig)))
    return figs


def _fleet_table(summary: dict) -> str:
    a = summary["autoscaling"]
    oracle = a.get("oracle") or {}
    slo = a.get("slo") or {}
    bounds = ", ".join(f"{k[:-2]} <= {v:g} s" for k, v in slo.items() if k in ("ttft_s", "e2e_s") and v)
    rows = [("autoscaler", html.escape(str(summary.get("autoscaler") or "none (fixed)"))),
            ("SLO", f"{html.escape(bounds)} for {_fmt(slo.get('attainment'), ' %', 100)} of requests"
             if slo else "–"),
            ("attainment", _fmt(a.get("attainment"), " %", 100, 2)),
            ("requests (529 / 503 / shed)", f"{a['requests']:,} ({a['n_529']:,} / {a['n_503']:,} / {a['shed']:,})"),
            ("GPU-hours (GPUs per replica)", f"{_fmt(a['gpu_hours'], digits=2)} ({a['gpus_per_replica']})"),
            ("mean / peak replicas", f"{_fmt(a.get('mean_replicas'), digits=2)} / {a.get('peak_replicas')}"),
            ("cold starts (start-up delay)", f"{a['cold_starts']} ({_fmt(a.get('startup_delay_s'), ' s')})"),
            ("oracle GPU-hours (capacity per replica)",
             f"{_fmt(oracle.get('gpu_hours'), digits=2)} ({_fmt(oracle.get('capacity_rps'), ' req/s', digits=2)})"),
            ("cost vs oracle", _fmt(a.get("cost_vs_oracle"), " x", digits=2))]
    return "<table>" + "".join(f"<tr><th class=l>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body>{body}</body></html>")


def write_report(out: Path, run: dict, summary: dict, window: float) -> Path:
    fleet = "autoscaling" in summary
    figs = _fleet_figures(run, summary, window) if fleet else _run_figures(run, summary, window)
    head = (f"<h1>{html.escape(summary['scenario'])}: controller "
            f"<code>{html.escape(summary['controller'])}</code></h1>"
            f"<p>{html.escape(summary.get('description') or '')}</p>"
            f"<p class=muted>model {html.escape(summary['model'])}, {summary['duration_s']:g} "
            f"modelled s at time scale {summary['time_scale']:g}; {summary['requests']} requests, "
            f"{_fmt(summary['frac_529'], ' %', 100)} refused (full queue), {summary['errors']} other errors. "
            f"Latencies are client-measured in modelled seconds; phase figures are over each "
            f"phase's second half (summary.json has both halves).</p>")
    body = head + (("<h2>Autoscaling</h2>" + _fleet_table(summary)) if fleet else "")
    if "pd" in summary:
        body += _pd_section([summary["pd"]])
    body += "<h2>Phases</h2>" + _phase_table(summary)
    for title, uri in figs:
        body += f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='{uri}'>"
    path = out / "report.html"
    path.write_text(_page(f"{summary['scenario']} – {summary['controller']}", body))
    return path


def write_comparison(out: Path, runs: list[tuple[str, dict, dict]], window: float = 2.0) -> Path:
    """runs: (label, run, summary) each; one page overlaying them."""
    plt = _plt()
    duration = max(s["duration_s"] for _, _, s in runs)
    figs = []
    panels = (("Controller limit", "limit"), ("Goodput (tokens/s of 200s)", "goodput"),
              ("End-to-end p50 (ms, modelled)", "e2e_p50"))
    for title, what in panels:
        fig, ax = plt.subplots(figsize=(11, 3.0))
        for label, run, summary in runs:
            if what == "limit":
                ctl = run["controller"]
                limit = np.where(np.isfinite(ctl["limit"]), ctl["limit"], np.nan)
                ax.step(ctl["t"], limit, where="post", label=label)
            else:
                w = window_series(run["requests"], 0.0, summary["duration_s"], window)
                ax.plot(w["t"], w[what] * (1000 if what == "e2e_p50" else 1), label=label)
        _mark_actions(ax, runs[0][1].get("actions", []), label=True)
        ax.set_xlim(0, duration)
        ax.set_xlabel("modelled seconds")
        ax.legend(loc="upper right", fontsize=8)
        figs.append((title, _png(fig)))
    rows = ["<tr><th class=l>run</th><th class=l>phase</th><th>limit p50</th><th>goodput tok/s</th>"
            "<th>refused %</th><th>e2e p50 ms</th><th>score goodput</th><th>score e2e p50</th>"
            "<th>settle s</th></tr>"]
    for label, _, s in runs:
        for p in s["phases"]:
            st, sc = p["steady"], p["scores"]
            rows.append(f"<tr><td class=l>{html.escape(label)}</td><td class=l>{html.escape(p['action'])}</td>"
                        f"<td>{_fmt(st['limit_p50'])}</td><td>{_fmt(st['goodput_tok_s'], digits=0)}</td>"
                        f"<td>{_fmt(st['frac_529'], '', 100)}</td><td>{_fmt(st['e2e_p50_s'], '', 1000, 0)}</td>"
                        f"<td>{_fmt(sc['goodput'], digits=2)}</td><td>{_fmt(sc['e2e_p50'], digits=2)}</td>"
                        f"<td>{_fmt(sc['settle_s'])}</td></tr>")
    body = (f"<h1>Comparison of {len(runs)} runs</h1><p class=muted>"
            + html.escape(", ".join(f"{label}: {s['scenario']} / {s['controller']}" for label, _, s in runs))
            + "</p><h2>Scores per phase</h2><table>" + "".join(rows) + "</table>")
    for title, uri in figs:
        body += f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='{uri}'>"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    path.write_text(_page("comparison", body))
    (out / "summary.json").write_text(json.dumps(
        {"runs": [{"label": label, **s} for label, _, s in runs]}, indent=1))
    return path


def _pd_table(rows: list[dict]) -> str:
    head = ["<tr><th class=l>P:D</th><th class=l>policy</th><th>requests</th><th>completed</th>"
            "<th>failed</th><th>TTFT p50 / p99 ms</th><th>TPOT p50 / p99 ms</th>"
            "<th>e2e p50 / p99 ms</th><th>prefill p50 ms</th>"
            "<th>engines' TTFT p50 / p99 ms</th><th>engines' TPOT p50 / p99 ms</th>"
            "<th>received by transfer %</th>"
            "<th>recomputed</th></tr>"]
    for r in rows:
        t, tp, e, pre = r["ttft_ms"], r["tpot_ms"], r["e2e_ms"], r.get("prefill_ms") or {}
        mt, mp = r.get("model_ttft_ms") or {}, r.get("model_tpot_ms") or {}
        share = r["external_hits"] / r["external_queries"] if r["external_queries"] else None
        head.append(
            f"<tr><td class=l>{html.escape(r['kv_roles'])}</td><td class=l>{html.escape(r['policy'])}</td>"
            f"<td>{r['requests']}</td><td>{r['completed']}</td><td>{r['failed']}</td>"
            f"<td>{_fmt(t['p50'])} / {_fmt(t['p99'])}</td>"
            f"<td>{_fmt(tp['p50'], digits=2)} / {_fmt(tp['p99'], digits=2)}</td>"
            f"<td>{_fmt(e['p50'], digits=0)} / {_fmt(e['p99'], digits=0)}</td>"
            f"<td>{_fmt(pre.get('p50'))}</td>"
            f"<td>{_fmt(mt.get('p50'))} / {_fmt(mt.get('p99'))}</td>"
            f"<td>{_fmt(mp.get('p50'), digits=2)} / {_fmt(mp.get('p99'), digits=2)}</td>"
            f"<td>{_fmt(share, '', 100)}</td>"
            f"<td>{r['recomputed']:.0f}</td></tr>")
    return "<table>" + "".join(head) + "</table>"


def _pd_figure(rows: list[dict]) -> str:
    """TTFT against TPOT: per ratio its p50 (filled) and p99 (hollow), joined."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, r in enumerate(rows):
        t, tp = r["ttft_ms"], r["tpot_ms"]
        if t["p50"] is None or tp["p50"] is None:
            continue
        color = f"C{i % 10}"
        ax.plot([t["p50"], t["p99"]], [tp["p50"], tp["p99"]], color=color, linewidth=1, alpha=0.6)
        ax.plot(t["p50"], tp["p50"], "o", color=color, label=f"{r['kv_roles']} (p50 filled, p99 hollow)")
        ax.plot(t["p99"], tp["p99"], "o", color=color, markerfacecolor="none")
        ax.annotate(r["kv_roles"], (t["p50"], tp["p50"]), xytext=(5, 5), textcoords="offset points",
                    fontsize=9, color=color)
    ax.set_xlabel("TTFT ms (modelled, client-measured: first send to the decode stream's first token)")
    ax.set_ylabel("TPOT ms (modelled)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def _pd_section(rows: list[dict]) -> str:
    title = "TTFT against TPOT per P:D ratio"
    return ("<h2>Prefill/decode</h2><p class=muted>Each request's prefill (max_tokens 1, "
            "do_remote_decode) went to a prefill replica, then the request with the returned "
            "kv_transfer_params to a decode replica. TTFT counts from the prefill's send; "
            "TPOT is the decode stream's time per output token after the first (both "
            "client-measured); the engines' figures are their modelled timings (the prefill "
            "replica's e2e + the decode replica's TTFT; its time per output token): the "
            "client's without the HTTP hops, as <code>sim --pd</code> computes them; "
            "'received by transfer' is the decode replicas' external prefix-cache hits over "
            "the prompt positions they queried.</p>" + _pd_table(rows)
            + f"<h2>{title}</h2><img alt='{title}' src='{_pd_figure(rows)}'>")


def write_pd_sweep(out: Path, scenario: str, description: str, rows: list[dict],
                   runs: list[str]) -> Path:
    """The page of a sweep of P:D ratios: the table, the plot, and each ratio's own report
    (`runs`: their directories, relative to `out`)."""
    links = ", ".join(f"<a href='{html.escape(d)}/report.html'>{html.escape(r['kv_roles'])}</a>"
                      for d, r in zip(runs, rows))
    body = (f"<h1>{html.escape(scenario)}: P:D ratios</h1><p>{html.escape(description)}</p>"
            f"<p class=muted>One run per ratio, each on its own server; latencies are "
            f"client-measured in modelled seconds. Each ratio's report: {links}.</p>"
            + _pd_section(rows))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    path.write_text(_page(f"{scenario} – P:D ratios", body))
    return path
