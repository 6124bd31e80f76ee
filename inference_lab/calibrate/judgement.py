"""Whether a fit fits its own points, and what likely went wrong when it does not.

Knows: the error above which `inference-lab calibrate` writes no preset
(`MAX_FIT_ERROR`, the mean |simulated / measured - 1| over the fit points' metrics), and
the input mistakes that leave a signature in the fitted errors:
- TTFT medians given as means: the simulated mean TTFT above every measured TTFT under
  load while TPOT fits (a mean carries the opening burst and the queueing a median
  leaves out);
- random lengths taken as exact (range ratio 1): the same excess under load, since
  requests of one length end together and the clients' next prompts queue for prefill
  in waves, where random lengths spread them;
- an opening burst or cold start: the measured TTFT at the lowest concurrency far above
  what the fit's steady state gives there;
- a KV cache smaller than the lab's pool: the measured TPOT stops growing at the top
  concurrencies (the extra clients queue) while the fit's keeps growing;
- a decode that is not the one simulated: TPOT off (server settings, model, GPU).
Works on points and their simulated metrics under the fit; simulates nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from inference_lab.calibrate.fitting import relative_errors
from inference_lab.calibrate.simulate import Point

MAX_FIT_ERROR = 0.25  # mean |error| on the fit's own points above which no preset is written
SETTINGS_FLAGS = "--tp, --max-num-seqs, --max-num-batched-tokens, --kv-cache-dtype, --no-prefix-caching"
PLATEAU = 0.05  # measured TPOT growth below which a doubling of the clients counts as flat


def fit_error(points: Sequence[Point], sims: Sequence[dict[str, float]]) -> float:
    """Mean |simulated / measured - 1| over every point's measured metrics."""
    errs = [abs(e) for p, s in zip(points, sims) for e in relative_errors(p, s).values()]
    return statistics.mean(errs) if errs else 0.0


def _ttft_key(point: Point) -> str | None:
    return next((k for k in ("ttft_p50_ms", "ttft_ms") if k in point.measured), None)


def _span(errs: Sequence[float]) -> str:
    lo, hi = min(errs), max(errs)
    return f"{lo:+.0%}" if abs(hi - lo) < 0.005 else f"{lo:+.0%} to {hi:+.0%}"


def _pool_plateau(points: Sequence[Point], errors: Sequence[dict[str, float]],
                  max_error: float) -> str | None:
    """The sentence for a measured TPOT that stops growing at the top while the fit's
    grows past it (the server's KV cache full before the lab's), or None."""
    rows = sorted(((p, e) for p, e in zip(points, errors) if "tpot_ms" in p.measured and "tpot_ms" in e),
                  key=lambda pe: pe[0].concurrency)
    for i, ((lo, _), (hi, e_hi)) in enumerate(zip(rows, rows[1:])):
        grew = hi.measured["tpot_ms"] / lo.measured["tpot_ms"] - 1
        # the fit's error climbs into the plateau: above its best up to there by half the bound
        climbed = e_hi["tpot_ms"] - min(e["tpot_ms"] for _, e in rows[:i + 1])
        if hi.concurrency >= 2 * lo.concurrency and abs(grew) < PLATEAU and climbed > max_error / 2:
            return (f"a KV cache smaller than the lab's: the measured TPOT stops growing from {lo.label} "
                    f"to {hi.label} ({lo.measured['tpot_ms']:.1f} -> {hi.measured['tpot_ms']:.1f} ms) while "
                    f"the fit's keeps growing ({e_hi['tpot_ms']:+.0%} at {hi.label}): the server ran fewer "
                    "sequences than the clients and queued the rest. Give its memory settings "
                    "(--gpu-memory-utilization, or --kv-cache-memory-bytes: the KV cache size per GPU "
                    "vLLM logs at start) or leave those rows out.")
    return None


def likely_causes(points: Sequence[Point], sims: Sequence[dict[str, float]],
                  max_error: float = MAX_FIT_ERROR) -> list[str]:
    """The causes whose signature the fitted errors show, each one sentence naming what
    to change; one sentence saying none was recognised when none is."""
    errors = [relative_errors(p, s) for p, s in zip(points, sims)]
    tpot = [abs(e[k]) for e in errors for k in ("tpot_ms", "tpot_p50_ms") if k in e]
    tpot_fits = bool(tpot) and statistics.mean(tpot) <= max_error
    # TTFT under load: one client never queues behind another, whatever its lengths
    loaded = [(p, e[_ttft_key(p)]) for p, e in zip(points, errors) if p.concurrency > 1 and _ttft_key(p)]
    over = [e for _, e in loaded]
    ttft_over = bool(over) and min(over) > 0 and statistics.mean(over) > max_error
    causes = []
    if ttft_over and tpot_fits and all(_ttft_key(p) == "ttft_ms" for p, _ in loaded):
        causes.append(
            f"TTFT given as means (ttft_ms) that behave as medians: the fit's mean TTFT is above every "
            f"measured one under load ({_span(over)}) while TPOT fits (mean |error| "
            f"{statistics.mean(tpot):.0%}). If these are medians, put them in the ttft_p50_ms column "
            "(the median TTFT; the JSON formats' medians are read by themselves), not in ttft_ms.")
    if ttft_over and all(p.range_ratio >= 1.0 for p, _ in loaded):
        causes.append(
            f"lengths taken as exact (--range-ratio 1): every simulated request has the mean lengths, "
            f"so the clients finish together and queue their next prefills in waves, and TTFT under "
            f"load comes out high ({_span(over)}). If the benchmark drew random lengths (vllm bench "
            "serve --random-range-ratio R), pass --range-ratio R.")
    low = min((p.concurrency for p in points if _ttft_key(p)), default=0)
    burst = [(p, e[_ttft_key(p)]) for p, e in zip(points, errors)
             if p.concurrency == low and _ttft_key(p) and e[_ttft_key(p)] < -max_error]
    if burst:
        p, e = min(burst, key=lambda pe: pe[1])
        key = _ttft_key(p)
        measured, fitted = p.measured[key], p.measured[key] * (1 + e)
        fixes = ["warm the server up before measuring"]
        if not p.requests:  # the simulated burst weighs 1 / 10 of a run of 10 x c prompts
            fixes.append("give num_prompts if the run had other than 10 x the concurrency")
        if key == "ttft_ms":
            fixes.append("give the median TTFT (ttft_p50_ms)")
        causes.append(
            f"an opening burst or a cold start: at the lowest concurrency ({p.label}) the measured "
            f"TTFT {measured:.0f} ms is far above the fit's steady state ({fitted:.0f} ms, {e:+.0%}). "
            "First requests that pay compilation or CUDA-graph capture, or a burst of clients "
            f"arriving at once, do this; {', '.join(fixes[:-1])}{', or ' if len(fixes) > 1 else ''}"
            f"{fixes[-1]}.")
    plateau = _pool_plateau(points, errors, max_error)
    if plateau:
        causes.append(plateau)
    if tpot and not tpot_fits:
        causes.append(
            f"TPOT does not fit (mean |error| {statistics.mean(tpot):.0%}): the decode measured is not "
            f"the one simulated. Check the server settings given ({SETTINGS_FLAGS}), --model and "
            "--hardware, and that TPOT is the time per output token after the first.")
    if not causes:
        causes.append(
            "none of the causes calibrate recognises (TTFT medians given as means, random lengths "
            "taken as exact, an opening burst, a KV cache smaller than the lab's, a TPOT that does "
            "not fit); check the server settings "
            f"given ({SETTINGS_FLAGS}), --model, --hardware and --fit.")
    return causes
