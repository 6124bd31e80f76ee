"""Fitting the `calibrated` timing model's parameters to measured points.

Knows: the parameters a fit may move (`PARAMETERS`: their bounds and the scale at which
a change is felt), which of them a set of points can say anything about, and the search:
damped Gauss-Newton (Levenberg-Marquardt) on the log of simulated / measured for every
point and metric, with a Jacobian by forward differences, steps solved by numpy.linalg
(the normal equations; the SVD for the dependence check), Huber weights (a few odd
points do not pull the rest), parameters moved in log space within their bounds and held
near where they started by a weak prior (a Cauchy loss on each move: a valley the points
leave flat is not wandered along). Before the first step it drops, and names, the
parameters the points cannot determine: those with no effect on any metric, and those
whose effect the others already explain (a near-zero singular value of the Jacobian).
Leave-one-out refits without each point in turn (held near the same start) and predicts
it; leave-largest-out refits without the largest concurrency and predicts it (the error
of extrapolating beyond the fit's range). Does not know file formats or how a point is
simulated beyond `simulate.simulate`.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from inference_lab.calibrate.simulate import DEFAULT_MAX_REQUESTS, Point, simulate
from inference_lab.common import lifeline
from inference_lab.engine.sim.specs import AS_ANOTHER_KEY, Calibration


@dataclass(frozen=True, slots=True)
class Parameter:
    """A fitted [calibration] key: p = exp(x) - offset within [low, high]."""

    name: str
    low: float
    high: float
    offset: float  # about the least value that is felt (0: a fraction, log scale)
    what: str

    def to_x(self, value: float) -> float:
        return math.log(max(value, self.low) + self.offset) if self.offset else math.log(max(value, self.low))

    def from_x(self, x: float) -> float:
        value = math.exp(x) - self.offset
        return min(max(value, self.low), self.high)


PARAMETERS: dict[str, Parameter] = {p.name: p for p in (
    Parameter("bandwidth_efficiency", 0.05, 1.0, 0.0, "fraction of the HBM peak"),
    Parameter("flops_efficiency", 0.02, 1.0, 0.0, "fraction of the FLOP peak"),
    Parameter("moe_flops_efficiency", 0.01, 1.0, 0.0, "fraction of the FLOP peak, expert GEMMs"),
    Parameter("flops_half_tokens", 0.0, 8192.0, 8.0, "tokens per step at half the FLOP fraction"),
    Parameter("comm_efficiency", 0.02, 1.0, 0.0, "fraction of the fabric's collective speed"),
    Parameter("comm_bandwidth_efficiency", 0.02, 1.0, 0.0,
              "fraction of the fabric's bandwidth on the collectives' token bytes"),
    Parameter("step_overhead", 0.0, 0.05, 100e-6, "seconds per step"),
    Parameter("layer_overhead", 0.0, 1e-3, 5e-6, "seconds per layer per step"),
    Parameter("expert_overhead", 0.0, 1e-4, 0.2e-6, "seconds per touched expert per MoE layer"),
    Parameter("fp4_expert_overhead", 0.0, 1e-4, 0.2e-6,
              "seconds per touched 4-bit (MXFP4, NVFP4) expert per MoE layer"),
    Parameter("mla_layer_overhead", 0.0, 1e-3, 10e-6, "seconds per MLA layer per step"),
    Parameter("sequence_overhead", 0.0, 1e-3, 10e-6, "seconds per sequence per step"),
    Parameter("sequence_kernel_overhead", 0.0, 1e-3, 10e-6,
              "GPU seconds per sequence per step, split over the TP GPUs"),
    Parameter("mixed_step_overhead", 0.0, 0.05, 1e-3, "seconds per step that carries prefill tokens"),
    Parameter("unoverlapped_fraction", 0.0, 1.0, 0.02,
              "share of the shorter of a stream's math and memory time not hidden under the longer"),
    Parameter("routing_skew", 0.0, 3.0, 0.05, "Zipf exponent of the routed experts' popularity"),
    Parameter("kv_bandwidth_efficiency", 0.05, 1.0, 0.0,
              "fraction of the HBM peak the decode attention reaches on the KV cache"),
    Parameter("request_overhead", 0.0, 1.0, 1e-3, "seconds from arrival to schedulable"),
    Parameter("prompt_token_overhead", 0.0, 1e-4, 1e-6, "seconds per prompt token before schedulable"),
    Parameter("stream_overhead", 0.0, 0.01, 10e-6,
              "seconds per request in the engine before a new one is schedulable"),
)}
HUBER = 0.15  # |log error| beyond which a residual's weight falls off
PRIOR = 0.1  # weight of log(parameter / its start value) as a residual of its own
PRIOR_SCALE = 0.5  # |log(parameter / start)| beyond which the prior's pull falls off
STEP = 0.07  # forward-difference step in x (about 7 % of a parameter)


def applicable(points: Sequence[Point], names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The parameters among `names` that could matter to these points, and why each
    other one cannot (no multi-GPU point: no collectives; no MoE model: no expert
    terms; no MLA model: no MLA floor)."""
    tp = any(p.deployment.tp > 1 for p in points)
    moe = any(s.num_experts for p in points for s in p.deployment.model.weight_streams)
    mla = any(c.kind == "mla" for p in points for c in p.deployment.model.layer_classes)
    fp4 = any(s.num_experts and s.precision == "fp4" for p in points for s in p.deployment.model.weight_streams)
    why = {}
    if not tp:
        why["comm_efficiency"] = why["comm_bandwidth_efficiency"] = "no point runs on more than one GPU"
    if not moe:
        why["moe_flops_efficiency"] = why["expert_overhead"] = "no point serves an MoE model"
    if not mla:
        why["mla_layer_overhead"] = "no point serves an MLA model"
    if not fp4:
        why["fp4_expert_overhead"] = "no point serves a model with 4-bit experts"
    return [n for n in names if n not in why], {n: w for n, w in why.items() if n in names}


@dataclass(slots=True)
class Evaluator:
    """Simulates points under calibrations, remembering every answer (a search revisits
    points), in `jobs` processes when asked."""

    points: list[Point]
    max_requests: int = DEFAULT_MAX_REQUESTS
    jobs: int = 1
    memo: dict[tuple[int, Calibration], dict[str, float]] = field(default_factory=dict)
    runs: int = 0

    def sims(self, calibrations: Sequence[Calibration], subset: Sequence[int] | None = None
             ) -> list[list[dict[str, float]]]:
        """For each calibration, the simulated metrics of the points `subset` (indices)."""
        idx = list(range(len(self.points))) if subset is None else list(subset)
        todo = sorted({(i, c) for c in calibrations for i in idx if (i, c) not in self.memo},
                      key=lambda k: -self.points[k[0]].num_requests * self.points[k[0]].output_len)
        if todo:
            self.runs += len(todo)
            if self.jobs > 1 and len(todo) > 1:
                global _POOL_POINTS
                _POOL_POINTS = (self.points, self.max_requests)
                # Workers bound to this process: they end with it, however it ends (a
                # killed parent leaves a fork pool's workers waiting on its queue).
                # Ctrl-C held back while the workers are forked (each ignores it once
                # started); the parent takes it inside the pool, which then ends them all.
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                try:
                    with multiprocessing.get_context("fork").Pool(
                            min(self.jobs, len(todo)), _worker_start, (os.getpid(),)) as pool:
                        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                        results = pool.map(_pool_simulate, todo, chunksize=1)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            else:
                results = [simulate(self.points[i], c, self.max_requests) for i, c in todo]
            self.memo.update(zip(todo, results))
        return [[self.memo[(i, c)] for i in idx] for c in calibrations]


_POOL_POINTS: tuple[list[Point], int] = ([], DEFAULT_MAX_REQUESTS)


def _worker_start(parent: int) -> None:
    """A pool worker: bound to its parent (it ends with it, however it ends), and deaf to
    Ctrl-C, which the parent answers by ending the pool (a terminal's SIGINT reaches the
    whole process group: without this every worker printed its own traceback)."""
    lifeline.bind_to(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (forked with it blocked)


def _pool_simulate(job: tuple[int, Calibration]) -> dict[str, float]:
    points, max_requests = _POOL_POINTS
    i, cal = job
    return simulate(points[i], cal, max_requests)


def log_errors(points: Sequence[Point], sims: Sequence[dict[str, float]]) -> list[float]:
    """log(simulated / measured) for every point and measured metric, in order."""
    out = []
    for point, sim in zip(points, sims):
        for key, measured in point.measured.items():
            out.append(math.log(max(sim[key], 1e-9) / measured))
    return out


def _weighted(r: list[float]) -> list[float]:
    """Huber-weighted residuals: quadratic within HUBER, linear beyond."""
    return [x if abs(x) <= HUBER else math.copysign(math.sqrt(HUBER * (2 * abs(x) - HUBER)), x)
            for x in r]


def _cost(r: list[float]) -> float:
    return sum(x * x for x in _weighted(r))


def prior_cost(moves: np.ndarray, weight: float) -> float:
    """What the prior adds to the fit's cost for these moves in log scale: a Cauchy loss,
    weight**2 * move**2 near the start, growing only as the log of the move beyond
    PRIOR_SCALE."""
    c2 = PRIOR_SCALE ** 2
    return float(weight ** 2 * c2 * np.sum(np.log1p(np.square(moves) / c2)))


def prior_weights(moves: np.ndarray, weight: float) -> np.ndarray:
    """The prior's diagonal in the normal equations at these moves (IRLS): its cost's
    gradient is 2 * weights * moves."""
    return weight ** 2 / (1.0 + np.square(moves) / PRIOR_SCALE ** 2)


@dataclass(slots=True)
class FitResult:
    calibration: Calibration
    fitted: list[str]  # parameters moved by the fit
    undetermined: dict[str, str]  # parameter -> why the points could not determine it
    mean_abs_error: float  # over the fit points' metrics, |simulated / measured - 1|
    iterations: int
    center: Calibration | None = None  # where the prior holds the parameters (the start)
    prior: float = PRIOR  # its weight


def _smallest_singular(cols: list[list[float]]) -> tuple[float, list[float]]:
    """The smallest singular value of the matrix with these (unit) columns and its right
    singular vector. When more than one singular value is zero (fewer rows than columns,
    or columns that repeat), the vector of that null space nearest the all-equal
    direction (its projection there), so that which one is picked does not depend on the
    SVD's choice of basis."""
    n = len(cols)
    _, s, vt = np.linalg.svd(np.array(cols).T)  # vt: n right singular vectors, rows < n too
    sigma = np.zeros(n)
    sigma[:len(s)] = s
    null = vt[sigma < 1e-6]
    if len(null) > 1:
        v = null.T @ (null @ np.full(n, 1.0 / math.sqrt(n)))
        return 0.0, list(v / np.linalg.norm(v))
    return float(sigma[-1]), list(vt[-1])


def identify(names: list[str], jac: list[list[float]], rows: int) -> tuple[list[str], dict[str, str]]:
    """Which of `names` (Jacobian columns `jac`, d log(metric) / d log(parameter)) the
    points determine. A parameter whose effect on every metric stays below 1 % per
    doubling is dropped; then, while the columns are nearly dependent (smallest
    singular value of the unit columns below 0.08), the one that leans most on the
    others is dropped, naming them."""
    keep = list(range(len(names)))
    why: dict[str, str] = {}
    for j in list(keep):
        if max((abs(x) for x in jac[j]), default=0.0) * math.log(2) < 0.01:
            why[names[j]] = "no effect on any measured metric of these points"
            keep.remove(j)
    while len(keep) > 1:
        unit = []
        for j in keep:
            norm = float(np.linalg.norm(jac[j])) or 1.0
            unit.append([x / norm for x in jac[j]])
        sigma, v = _smallest_singular(unit)
        if sigma >= 0.08 and len(keep) < rows:
            break
        worst = max(range(len(keep)), key=lambda k: abs(v[k]))
        partners = sorted((k for k in range(len(keep)) if k != worst), key=lambda k: -abs(v[k]))
        named = [names[keep[k]] for k in partners if abs(v[k]) > 0.2] or [names[keep[partners[0]]]]
        why[names[keep[worst]]] = ("its effect on these points is explained by "
                                   + ", ".join(named) if sigma < 0.08 else
                                   "more parameters than measured values")
        keep.pop(worst)
    return [names[j] for j in keep], why


def _explicit(cal: Calibration, names: Sequence[str]) -> Calibration:
    """`cal` with the fitted keys left at "as another key" (AS_ANOTHER_KEY: an expert
    FLOP fraction of 0, an unset 4-bit expert floor, ...) set to that key's value, so the
    search starts, and the prior is centred, where the model already is."""
    return replace(cal, **{n: cal.resolved(n) for n in names if n in AS_ANOTHER_KEY})


def fit(evaluator: Evaluator, start: Calibration, names: Sequence[str], fit_idx: Sequence[int],
        max_iter: int = 12, log: Callable[[str], None] | None = None,
        check: bool = True, prior: float | None = None,
        center: Calibration | None = None) -> FitResult:
    """Move the parameters `names` of `start` to fit the points `fit_idx` of the
    evaluator. With `check`, first drop the parameters the points cannot determine.

    Each moved parameter also pays for its distance from `center` (default `start`):
    `prior` (default PRIOR) times its move in log scale is one more residual, whose pull
    fades beyond PRIOR_SCALE (a Cauchy loss). That holds where they began the parameters
    a few points cannot tell apart (a fit that would trade one for another along a flat
    valley) and costs little a move the points ask for: at the default, a parameter
    doubled costs what a 5 % error on one measured value does, a tenfold move a 9 %
    one."""
    points = [evaluator.points[i] for i in fit_idx]
    names, undetermined = applicable(points, list(names))
    start = _explicit(start, names)
    origin = start if center is None else _explicit(center, names)
    params = [PARAMETERS[n] for n in names]
    x = [p.to_x(getattr(start, p.name)) for p in params]
    x0 = [p.to_x(getattr(origin, p.name)) for p in params]
    weight = PRIOR if prior is None else prior

    def total(r: list[float], xs: Sequence[float]) -> float:
        return _cost(r) + prior_cost(np.subtract(xs, x0), weight)

    def calibration(xs: Sequence[float]) -> Calibration:
        return replace(start, **{p.name: p.from_x(v) for p, v in zip(params, xs)})

    def residuals(cals: Sequence[Calibration]) -> list[list[float]]:
        return [log_errors(points, sims) for sims in evaluator.sims(cals, fit_idx)]

    def jacobian(xs: list[float], r0: list[float]) -> tuple[list[list[float]], list[float]]:
        steps, cals = [], []
        for j, p in enumerate(params):
            h = STEP if p.from_x(xs[j] + STEP) != p.from_x(xs[j]) else -STEP
            steps.append(h)
            cals.append(calibration([v + (h if k == j else 0.0) for k, v in enumerate(xs)]))
        cols = residuals(cals)
        return [[(a - b) / h for a, b in zip(col, r0)] for col, h in zip(cols, steps)], steps

    r = residuals([calibration(x)])[0]
    cost = total(r, x)
    lam = 1e-2
    it = 0
    fitted = list(names)
    for it in range(1, max_iter + 1):
        if not params:
            break
        jac, _ = jacobian(x, r)
        if check and it == 1:
            keep, why = identify([p.name for p in params], jac, len(r))
            undetermined.update(why)
            sel = [j for j, p in enumerate(params) if p.name in keep]
            params = [params[j] for j in sel]
            x = [x[j] for j in sel]
            x0 = [x0[j] for j in sel]
            jac = [jac[j] for j in sel]
            fitted = [p.name for p in params]
            start = calibration(x)  # the dropped ones stay at their start values
            if not params:
                break
        # the normal equations, with Huber IRLS weights on the current residuals
        res, jm = np.array(r), np.array(jac).T  # jm: a row per residual, a column per parameter
        w = np.where(np.abs(res) <= HUBER, 1.0, HUBER / np.maximum(np.abs(res), HUBER))
        dx = np.subtract(x, x0)
        wp = prior_weights(dx, weight)
        jtj = jm.T @ (w[:, None] * jm) + np.diag(wp)
        jtr = jm.T @ (w * res) + wp * dx
        improved = False
        for _ in range(6):
            damped = jtj + np.diag(lam * (np.diag(jtj) + 1e-6))  # positive definite
            delta = np.clip(np.linalg.solve(damped, -jtr), -1.5, 1.5)  # at most e^1.5 a step
            x_new = [params[j].to_x(params[j].from_x(float(v + d)))
                     for j, (v, d) in enumerate(zip(x, delta))]
            r_new = residuals([calibration(x_new)])[0]
            c_new = total(r_new, x_new)
            if c_new < cost - 1e-9:
                x, r, cost, improved = x_new, r_new, c_new, True
                lam = max(lam / 3, 1e-4)
                break
            lam *= 4
        if log:
            log(f"  step {it}: mean |error| {statistics.mean(abs(math.exp(v) - 1) for v in r):.1%}")
        if not improved:
            break
    final = calibration(x)
    err = statistics.mean(abs(math.exp(v) - 1) for v in r) if r else 0.0
    return FitResult(final, fitted, undetermined, err, it, origin, weight)


def relative_errors(point: Point, sim: dict[str, float]) -> dict[str, float]:
    """simulated / measured - 1 per metric."""
    return {k: sim[k] / v - 1.0 for k, v in point.measured.items()}


def leave_one_out(evaluator: Evaluator, result: FitResult, fit_idx: Sequence[int],
                  max_iter: int = 3) -> dict[int, dict[str, float]]:
    """For each fit point, the relative errors of its metrics predicted by a refit on
    the others (from the full fit, only the parameters it moved, at most `max_iter`
    steps)."""
    out = {}
    for i in fit_idx:
        rest = [j for j in fit_idx if j != i]
        refit = fit(evaluator, result.calibration, result.fitted, rest, max_iter, check=False,
                    prior=result.prior, center=result.center)
        sim = evaluator.sims([refit.calibration], [i])[0][0]
        out[i] = relative_errors(evaluator.points[i], sim)
    return out


def leave_largest_out(evaluator: Evaluator, result: FitResult, fit_idx: Sequence[int],
                      loo: dict[int, dict[str, float]] | None = None,
                      max_iter: int = 3) -> dict[int, dict[str, float]] | None:
    """The extrapolation error: for the fit points at the largest concurrency, the
    relative errors predicted by a refit on the others (as `leave_one_out` refits; its
    answer is reused when one point alone has that concurrency). None when under 2
    points lie below that concurrency, or the fit moved nothing."""
    top = max(evaluator.points[i].concurrency for i in fit_idx)
    held = [i for i in fit_idx if evaluator.points[i].concurrency == top]
    rest = [i for i in fit_idx if i not in held]
    if len(rest) < 2 or not result.fitted:
        return None
    if len(held) == 1 and loo and held[0] in loo:
        return {held[0]: loo[held[0]]}
    refit = fit(evaluator, result.calibration, result.fitted, rest, max_iter, check=False,
                prior=result.prior, center=result.center)
    sims = evaluator.sims([refit.calibration], held)[0]
    return {i: relative_errors(evaluator.points[i], s) for i, s in zip(held, sims)}
