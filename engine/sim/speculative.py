"""Speculative decoding: the `[speculative]` table, expected acceptance, draft cost.

Knows inference-lab's speculative config (gamma, policy, acceptance kinds constant /
per_position / trace_rounds, drafter kinds, measured_cost, switch) and the arithmetic:
- a draft of g tokens with conditional acceptance a_d at depth d (accept depth d given
  depth d-1 was accepted) has E[accepted] = sum_{d<g} prod_{i<=d} a_i; constant alpha is
  a_d = alpha for all d (Leviathan et al. 2023, eq. 1: (1 - alpha^(g+1)) / (1 - alpha) - 1);
- a bank of measured rounds (CSV `commits,category,a0..`) gives E[accepted | g] =
  mean over rounds of min(commits, g);
- the drafter's time for g draft tokens over a decode batch of B sequences (`draft_seconds`).
Does not know batches or clocks: engine.sim.core chooses the draft length per step and
advances the decode group by 1 + accepted (in expectation, as whole tokens).
"""

from __future__ import annotations

import csv
from pathlib import Path

from inference_lab.common.toml import ConfigError, Table
from inference_lab.engine.sim.cost import expected_distinct_experts
from inference_lab.engine.sim.specs import Drafter, Speculative

POLICIES = ("fixed", "goodput_budget", "gated_budget", "gated_aggregate")
_KEYS = ("gamma", "acceptance", "policy", "measured_cost", "switch", "drafter")
_DRAFTER_KEYS = {
    "fraction": ("kind", "frac"),
    "autoregressive": ("kind", "dense_params", "expert_params", "num_experts", "experts_per_tok",
                       "shared_experts"),
    "block_parallel": ("kind", "params", "block"),
}


def expected_accepted(a: list[float] | tuple[float, ...], gamma: int) -> float:
    """E[accepted draft tokens] of a draft of `gamma` with conditional acceptance `a`
    per depth (depths beyond `a` never accepted); the bonus token is not counted."""
    prefix = 1.0
    total = 0.0
    for d in range(gamma):
        prefix *= a[d] if d < len(a) else 0.0
        total += prefix
    return total


def bank_curve(commits: list[int], gamma: int) -> tuple[float, ...]:
    """E[accepted | g] for g = 0..gamma from measured rounds' committed draft tokens."""
    n = len(commits)
    return tuple(sum(min(c, g) for c in commits) / n for g in range(gamma + 1))


def draft_seconds(drafter: Drafter, g: int, batch: int, peak: float, bandwidth: float,
                  verify_seconds: float) -> float:
    """Time to draft `g` tokens for each of `batch` sequences. The roofline kinds stream
    bf16 weights (2 bytes per parameter) at `peak` FLOP/s and `bandwidth` bytes/s."""
    if g <= 0 or batch <= 0:
        return 0.0
    if drafter.kind == "fraction":
        return drafter.frac * g * verify_seconds
    if drafter.kind == "autoregressive":
        k, shared = drafter.experts_per_tok, drafter.shared_experts
        loaded = (expected_distinct_experts(drafter.num_experts, k, batch)
                  if drafter.num_experts else 0.0)
        resident = drafter.dense_params + (shared + loaded) * drafter.expert_params
        active = drafter.dense_params + (k + shared) * drafter.expert_params
        per_pass = max(2.0 * active * batch / peak, 2.0 * resident / bandwidth)
        return g * per_pass
    # block_parallel: one pass over a fixed block, however deep the verify goes
    return max(2.0 * drafter.params * batch * drafter.block / peak, 2.0 * drafter.params / bandwidth)


def _resolve(path: str, base: Path) -> Path | None:
    for candidate in (base / path, Path(path)):
        if candidate.is_file():
            return candidate
    return None


def _read_bank(path: Path, where: str, key: str) -> list[int]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise ConfigError(where, key, f"cannot read trace bank {path}: {exc.strerror or exc}") from None
    if not rows or not rows[0] or rows[0][0] != "commits":
        raise ConfigError(where, key, f"trace bank {path}: expected a header commits,category,a0,...")
    commits = []
    for i, row in enumerate(rows[1:], start=2):
        try:
            commits.append(int(row[0]))
        except (ValueError, IndexError):
            raise ConfigError(where, key, f"trace bank {path}: row {i}: expected an integer "
                              f"commits, got {row[:1]!r}") from None
    if not commits:
        raise ConfigError(where, key, f"trace bank {path}: no rounds")
    return commits


def _parse_drafter(t: Table) -> Drafter:
    kind = t.get("kind", str, "'fraction', 'autoregressive' or 'block_parallel'",
                 ok=lambda v: v in _DRAFTER_KEYS)
    t.refuse_unknown(_DRAFTER_KEYS[kind])
    nonneg = "a number >= 0"
    if kind == "fraction":
        d = Drafter(kind, frac=t.get("frac", float, nonneg, ok=lambda v: v >= 0))
    elif kind == "autoregressive":
        d = Drafter(kind, dense_params=t.get("dense_params", float, nonneg, ok=lambda v: v >= 0),
                    expert_params=t.get("expert_params", float, nonneg, 0.0, ok=lambda v: v >= 0),
                    num_experts=t.get("num_experts", int, "an integer >= 0", 0, ok=lambda v: v >= 0),
                    experts_per_tok=t.get("experts_per_tok", int, "an integer >= 0", 0,
                                          ok=lambda v: v >= 0),
                    shared_experts=t.get("shared_experts", int, "an integer >= 0", 0,
                                         ok=lambda v: v >= 0))
    else:
        d = Drafter(kind, params=t.get("params", float, "a positive number", ok=lambda v: v > 0),
                    block=t.get("block", int, "an integer >= 1", ok=lambda v: v >= 1))
    t.done()
    return d


def parse_speculative(t: Table, base: Path) -> tuple[Speculative | None, list[str]]:
    """The Speculative of a `[speculative]` table (relative paths are looked up next to
    the config file `base` is the directory of, then in the working directory), and the
    notes on what is parsed but not modelled. None when decoding cannot be speculative
    (its acceptance trace is missing): the notes say so."""
    t.refuse_unknown(_KEYS)
    gamma = t.get("gamma", int, "an integer >= 1", ok=lambda v: v >= 1)
    policy = t.get("policy", str, " | ".join(POLICIES), "fixed", ok=lambda v: v in POLICIES)
    notes: list[str] = []
    acc = t.table("acceptance", keys=("kind", "alpha", "a", "path"))
    kind = acc.get("kind", str, "'constant', 'per_position' or 'trace_rounds'",
                   ok=lambda v: v in ("constant", "per_position", "trace_rounds"))
    expected: tuple[float, ...] | None = None
    if kind == "constant":
        alpha = acc.get("alpha", float, "a number in [0, 1]", ok=lambda v: 0 <= v <= 1)
        expected = tuple(expected_accepted([alpha] * gamma, g) for g in range(gamma + 1))
    elif kind == "per_position":
        a = acc.get("a", list, "a list of numbers in [0, 1]", ok=lambda v: bool(v) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in v))
        expected = tuple(expected_accepted([float(x) for x in a], g) for g in range(gamma + 1))
    else:
        path = acc.get("path", str, "a file path", ok=bool)
        found = _resolve(path, base)
        if found is None:
            notes.append(f"speculative acceptance trace {path!r} not found (looked next to the "
                         "config and in the working directory): speculative decoding off")
        else:
            expected = bank_curve(_read_bank(found, t.where, acc.key("path")), gamma)
    acc.done()
    if policy in ("gated_budget", "gated_aggregate"):
        notes.append(f"speculative policy {policy!r}: per-sequence gating not modelled, "
                     "priced as goodput_budget on the mean acceptance")
    measured = t.table("measured_cost", None, ("path", "ref_seq_len"))
    if measured is not None:
        path = measured.get("path", str, "a file path", ok=bool)
        measured.get("ref_seq_len", int, "an integer >= 1", None, ok=lambda v: v >= 1)
        measured.done()
        notes.append(f"speculative measured_cost {path!r}: parsed, not modelled (the roofline "
                     "prices every step)")
    switch = t.table("switch", None, ("cooldown_rounds", "max_step", "cost_ms"))
    if switch is not None:
        switch.get("cooldown_rounds", int, "an integer >= 0", 0, ok=lambda v: v >= 0)
        switch.get("max_step", int, "an integer >= 0", None, ok=lambda v: v >= 0)
        switch.get("cost_ms", float, "a number >= 0", 0.0, ok=lambda v: v >= 0)
        switch.done()
        notes.append("speculative switch constraints: parsed, not modelled")
    d = t.table("drafter", None)
    drafter = _parse_drafter(d) if d is not None else Drafter()
    t.done()
    if expected is None:
        return None, notes
    simple = "fixed" if policy == "fixed" else "goodput_budget"
    return Speculative(gamma, expected, simple, drafter), notes
