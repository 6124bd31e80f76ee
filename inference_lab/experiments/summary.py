"""summary.json: per phase (the stretch between two actions) what the run achieved, what
the oracle says was possible, and the controller's scores.

Per phase, over its steady half (the second half of the phase, after the controller had
time to react; the whole phase is reported too):
- limit_p50, inflight_p50 (time-weighted from the controller trace);
- goodput_tok_s: completion tokens of 200s that ended in the window, per second;
- n_529, frac_529: a full queue's refusals (529s, and SGLang's queue-full 503s:
  experiments.outcomes) / requests sent; shed_frac: refused by the controller itself;
- e2e / ttft p50 and p99 of 200s sent in the window (client-measured, modelled seconds);
- refusal_rtt_p50_s / _p99_s: a refusal's round trip (sent to refused), the delay before a
  loss-based controller hears that its limit went past the server's queue; and
  delivery_lag_p99_s: how much later than the engine's own e2e the client saw a stream
  end (gateway, loopback and client time). While either is long against the gap
  between completions, AIMD's +1 per success runs ahead of its refusals and then takes
  a x0.9 for each refusal of the overshoot (docs/benchmarks.md, "AIMD in the capacity step");
- cached_frac: the prompt tokens the server's prefix cache served (usage cached_tokens /
  prompt tokens, of 200s), beside the oracle's cache_hit_rate;
- scores: goodput / oracle goodput, e2e p50 / oracle e2e p50, and settle_s: seconds after
  the phase's action until the limit is within a band around where it ends up
  (+-max(2, 20 %) of the steady median) and spends at least 90 % of the rest of the phase
  there; band_settle_s: the same for the band below.
- fault: the faults in force ("" = none; the oracle models a slowdown only);
- band: [max_num_seqs, max_num_seqs + max_waiting] (the physical concurrency and the
  most the queue admits; only with max_waiting set), and the share of the steady half
  the limit spent inside it.

Knows numpy and the records' columns. Does not know HTTP or matplotlib.
"""

from __future__ import annotations

import math

import numpy as np

from inference_lab.experiments.outcomes import refused as refusals
from inference_lab.experiments.scenario import Scenario

__all__ = ["summarise", "step_series", "window_series", "pd_summary"]

SETTLE_BAND_FRAC = 0.2
SETTLE_BAND_MIN = 2.0
SETTLE_SHARE = 0.9


def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else None


def step_series(t: np.ndarray, v: np.ndarray, start: float, end: float,
                step: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """A piecewise-constant trace (value v[i] from t[i] on; the first value before t[0])
    sampled every `step` s in [start, end): what a time-weighted median or a settle check
    needs."""
    grid = np.arange(start, end, step)
    if t.size == 0 or grid.size == 0:
        return grid, np.full(grid.shape, np.nan)
    idx = np.searchsorted(t, grid, side="right") - 1
    return grid, v[np.clip(idx, 0, None)]  # before the first sample: its value


def _binned_percentiles(idx: np.ndarray, values: np.ndarray, n: int, qs: tuple[float, ...]
                        ) -> list[np.ndarray]:
    """Per bin 0..n-1, the q-th percentiles (numpy's linear method) of the values in it;
    nan for an empty bin. One sort for every bin."""
    out = [np.full(n, np.nan) for _ in qs]
    keep = ~np.isnan(values)
    idx, values = idx[keep], values[keep]
    if not idx.size:
        return out
    order = np.lexsort((values, idx))
    idx, values = idx[order], values[order]
    counts = np.bincount(idx, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    for q, arr in zip(qs, out):
        pos = starts[has] + (counts[has] - 1) * q / 100.0
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, starts[has] + counts[has] - 1)
        arr[has] = values[lo] + (values[hi] - values[lo]) * (pos - lo)
    return out


def window_series(req: dict, start: float, end: float, window: float) -> dict[str, np.ndarray]:
    """Per window of `window` s: goodput, refusals/s (`rate_529`), sent/s, e2e/ttft
    p50/p99 (of 200s)."""
    edges = np.arange(start, end + 1e-9, window)
    if edges.size < 2:
        edges = np.array([start, end])
    n = edges.size - 1
    mids = (edges[:-1] + edges[1:]) / 2
    width = np.maximum(np.diff(edges), 1e-12)
    status, send, done = req["status"], req["send_s"], req["done_s"]
    ok = status == 200

    def bins(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(edges, t, side="right") - 1
        return np.where((i >= 0) & (i < n) & (t < edges[-1]), i, -1)

    sent_bin, done_bin = bins(send), bins(done)

    def count(sel: np.ndarray, where: np.ndarray, weights=None) -> np.ndarray:
        sel = sel & (where >= 0)
        w = None if weights is None else weights[sel]
        return np.bincount(where[sel], weights=w, minlength=n)[:n].astype(float)

    out = {"goodput": count(ok, done_bin, req["completion_tokens"].astype(float)) / width,
           "rate_529": count(refusals(status, req["error"]), sent_bin) / width,
           "sent": count(status != 0, sent_bin) / width}
    sel = ok & (sent_bin >= 0)
    for name, col in (("e2e", "e2e_s"), ("ttft", "ttft_s")):
        p50, p99 = _binned_percentiles(sent_bin[sel], req[col][sel].astype(float), n, (50, 99))
        out[f"{name}_p50"], out[f"{name}_p99"] = p50, p99
    out["t"] = mids
    return out


def _stats(req: dict, ctl: dict, a: float, b: float) -> dict:
    status, send, done = req["status"], req["send_s"], req["done_s"]
    sent = (send >= a) & (send < b)
    ok_sent = sent & (status == 200)
    ended_ok = (done >= a) & (done < b) & (status == 200)
    n_sent = int(np.count_nonzero(sent & (status != 0)))
    n_shed = int(np.count_nonzero(sent & (status == 0)))
    _, limits = step_series(ctl["t"], ctl["limit"], a, b)
    _, inflight = step_series(ctl["t"], ctl["inflight"].astype(float), a, b)
    finite = limits[np.isfinite(limits)]
    width = max(b - a, 1e-9)
    usage = ok_sent & (req["cached_tokens"] >= 0)
    prompted = int(req["prompt_tokens"][usage].sum())
    refused = sent & refusals(status, req["error"])
    refused_rtt = done[refused] - send[refused]
    return {
        "from_s": a, "to_s": b,
        "requests": n_sent,
        "ok": int(np.count_nonzero(ok_sent)),
        "n_529": int(np.count_nonzero(refused)),
        "frac_529": (np.count_nonzero(refused) / n_sent) if n_sent else 0.0,
        "shed_frac": n_shed / (n_sent + n_shed) if n_sent + n_shed else 0.0,
        "errors": int(np.count_nonzero(sent & (status != 200) & ~refused & (status != 0))),
        "goodput_tok_s": float(req["completion_tokens"][ended_ok].sum() / width),
        "limit_p50": float(np.median(finite)) if finite.size else None,
        "inflight_p50": float(np.nanmedian(inflight)) if inflight.size else None,
        "e2e_p50_s": _pct(req["e2e_s"][ok_sent], 50),
        "e2e_p99_s": _pct(req["e2e_s"][ok_sent], 99),
        "ttft_p50_s": _pct(req["ttft_s"][ok_sent], 50),
        "ttft_p99_s": _pct(req["ttft_s"][ok_sent], 99),
        "modelled_e2e_p50_s": _pct(req["m_e2e_s"][ok_sent], 50),
        "send_delay_p99_ms": _pct(req["send_delay_ms"][sent & (status != 0)], 99),
        "refusal_rtt_p50_s": _pct(refused_rtt, 50),
        "refusal_rtt_p99_s": _pct(refused_rtt, 99),
        "delivery_lag_p99_s": _pct(req["e2e_s"][ok_sent] - req["m_e2e_s"][ok_sent], 99),
        "cached_frac": (float(req["cached_tokens"][usage].sum()) / prompted) if prompted else None,
        "prompt_tokens_mean": float(req["prompt_tokens"][ok_sent].mean()) if ok_sent.any() else None,
    }


def settle_seconds(ctl: dict, start: float, end: float, low: float | None,
                   high: float | None) -> float | None:
    """Seconds after `start` until the limit is in [low, high] and stays there for at
    least SETTLE_SHARE of the rest of the phase (a sawtooth's dips are tolerated); None
    when it never does, or there is no finite limit."""
    if low is None or high is None:
        return None
    grid, limits = step_series(ctl["t"], ctl["limit"], start, end)
    if grid.size == 0 or not np.isfinite(limits).all():
        return None
    inside = (limits >= low) & (limits <= high)
    share = np.cumsum(inside[::-1])[::-1] / np.arange(grid.size, 0, -1)  # of [i, end)
    ok = np.nonzero(inside & (share >= SETTLE_SHARE))[0]
    return float(grid[ok[0]] - start) if ok.size else None


def summarise(scenario: Scenario, run: dict, oracles: list[dict], controller: str) -> dict:
    req, ctl = run["requests"], run["controller"]
    phases = []
    for phase, oracle in zip(scenario.phases(), oracles):
        mid = (phase.start + phase.end) / 2
        steady = _stats(req, ctl, mid, phase.end)
        whole = _stats(req, ctl, phase.start, phase.end)
        scores = {
            "goodput": (steady["goodput_tok_s"] / oracle["goodput_tok_s"]
                        if oracle["goodput_tok_s"] else None),
            "e2e_p50": (steady["e2e_p50_s"] / oracle["e2e_p50_s"]
                        if steady["e2e_p50_s"] is not None and oracle["e2e_p50_s"] else None),
            "e2e_p99": (steady["e2e_p99_s"] / oracle["e2e_p99_s"]
                        if steady["e2e_p99_s"] is not None and oracle["e2e_p99_s"] else None),
        }
        target = steady["limit_p50"]
        margin = max(SETTLE_BAND_MIN, SETTLE_BAND_FRAC * target) if target is not None else 0.0
        scores["settle_s"] = settle_seconds(ctl, phase.start, phase.end,
                                            target - margin if target is not None else None,
                                            target + margin if target is not None else None)
        band = [phase.max_num_seqs, phase.max_num_seqs + phase.max_waiting if phase.max_waiting else None]
        scores["band_settle_s"] = settle_seconds(ctl, phase.start, phase.end, band[0], band[1])
        grid, limits = step_series(ctl["t"], ctl["limit"], mid, phase.end)
        upper = band[1] if band[1] is not None else math.inf
        finite = np.isfinite(limits)
        in_band = (float(np.mean((limits >= band[0]) & (limits <= upper)))
                   if grid.size and finite.all() else None)  # None: no limit to place
        phases.append({
            "index": phase.index,
            "start_s": phase.start, "end_s": phase.end,
            "action": phase.action.describe() if phase.action else "start",
            "capacity": {"max_num_seqs": phase.max_num_seqs, "max_waiting": phase.max_waiting},
            "load": {"users": phase.users, "arrival_rate": phase.rate},
            "fault": phase.fault,
            "steady": steady,
            "whole": whole,
            "oracle": oracle,
            "scores": scores,
            "band": band,
            "limit_in_band": in_band,
        })
    total = _stats(req, ctl, 0.0, scenario.duration)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "controller": controller,
        "model": scenario.model,
        "duration_s": scenario.duration,
        "window_s": scenario.window,
        "time_scale": run.get("time_scale", 1.0),
        "requests": total["requests"],
        "frac_529": total["frac_529"],
        "errors": total["errors"],
        "send_delay_p99_ms": total["send_delay_p99_ms"],
        "phases": phases,
    }


def _dist_ms(values: np.ndarray) -> dict:
    values = values[np.isfinite(values)]
    return {q: (float(np.percentile(values, p)) * 1000.0 if values.size else None)
            for q, p in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "mean": float(values.mean()) * 1000.0 if values.size else None}


def pd_summary(run: dict) -> dict:
    """A P/D run's client view (experiments.pd): its layout; requests sent, completed (200)
    and failed; TTFT (the first send to the decode stream's first token), TPOT (the
    decode stream's time per output token after the first), e2e and the prefill's round
    trip, in ms (p50/p90/p99/mean of the completed); and the decode replicas' transfer
    counters (positions received by transfer, queried, prompts recomputed), summed.
    `model_ttft_ms` and `model_tpot_ms` are the engines' own: the prefill replica's
    modelled e2e + the decode replica's modelled TTFT, and the decode replica's modelled
    time per output token (what `sim --pd` computes: the client's figures minus the HTTP
    hops)."""
    facts = run["pd"]
    req = run["requests"]
    sent = req["status"] != 0
    ok = req["status"] == 200
    ttft, e2e = req["ttft_s"][ok], req["e2e_s"][ok]
    tokens = req["completion_tokens"][ok].astype(float)
    multi = tokens > 1
    tpot = (e2e[multi] - ttft[multi]) / (tokens[multi] - 1)
    m_ttft, m_e2e = req["m_ttft_s"][ok], req["m_e2e_s"][ok]
    model_ttft = (req["prefill_m_e2e_s"][ok] + m_ttft if "prefill_m_e2e_s" in req
                  else np.full(m_ttft.shape, np.nan))
    model_tpot = (m_e2e[multi] - m_ttft[multi]) / (tokens[multi] - 1)
    metrics = facts.get("decode_metrics", {})
    total = {k: float(sum(m.get(k, 0.0) for m in metrics.values()))
             for k in ("external_hits", "external_queries", "recomputed")}
    return {
        "kv_roles": facts["kv_roles"], "policy": facts["policy"],
        "prefill_replicas": facts["prefill_replicas"], "decode_replicas": facts["decode_replicas"],
        "requests": int(sent.sum()), "completed": int(ok.sum()), "failed": int((sent & ~ok).sum()),
        "ttft_ms": _dist_ms(ttft), "tpot_ms": _dist_ms(tpot), "e2e_ms": _dist_ms(e2e),
        "model_ttft_ms": _dist_ms(model_ttft), "model_tpot_ms": _dist_ms(model_tpot),
        "prefill_ms": _dist_ms(req["prefill_e2e_s"][ok]) if "prefill_e2e_s" in req else None,
        "prompt_tokens": int(req["prompt_tokens"][ok].sum()),
        "completion_tokens": int(tokens.sum()),
        **total, "decode_metrics": metrics,
    }
