"""vLLM generations of the calibrated timing model: which engine release a fit imitates.

A hardware preset's `[calibration]` is one fit, made on measurements of one vLLM
generation (its `vllm_version`, e.g. "0.11"). A newer release runs other kernels and
another scheduler loop, so a preset may carry more fits, one per generation, as
`[calibration.generations."0.22"]` tables. `--timing calibrated` (or a hardware entry's
`timing = "calibrated"`) takes the preset's own `[calibration]`, as before;
`--timing calibrated-v0.22` takes the generation fitted on vLLM 0.22's measurements, and
is refused by name on a preset that has none.

Knows: how a timing name is spelt and which fit it picks from a Hardware. Does not know
how a fit is made (inference_lab.calibrate) nor how a step is priced (engine.sim.cost).
"""

from __future__ import annotations

import re
from dataclasses import replace

from inference_lab.engine.sim.specs import Calibration, Hardware

TIMING_NAMES = ("roofline", "calibrated", "calibrated-v<VERSION>")
_GENERATION = re.compile(r"calibrated-v(\d+(?:\.\d+)*)")
TIMING_HELP = "'roofline', 'calibrated' or 'calibrated-v<vLLM version>' (e.g. calibrated-v0.22)"


def parse_timing(value: str) -> tuple[str, str]:
    """('roofline' | 'calibrated', the vLLM version asked for or ''); ValueError if
    `value` is none of TIMING_NAMES."""
    if value in ("roofline", "calibrated"):
        return value, ""
    match = _GENERATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected {TIMING_HELP}, got {value!r}")
    return "calibrated", match.group(1)


def is_timing(value: object) -> bool:
    try:
        parse_timing(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def versions(hardware: Hardware) -> list[str]:
    """The vLLM generations the preset has fits for, its own [calibration]'s first."""
    cal = hardware.calibration
    own = [cal.vllm_version or "unstated"] if cal is not None else []
    return own + [g.vllm_version for g in hardware.generations]


def calibration_for(hardware: Hardware, version: str) -> Calibration | None:
    """The fit of vLLM `version` ('' : the preset's own [calibration]), or None."""
    cal = hardware.calibration
    if not version or (cal is not None and cal.vllm_version == version):
        return cal
    return next((g for g in hardware.generations if g.vllm_version == version), None)


def select(hardware: Hardware, version: str) -> Hardware:
    """`hardware` timed by the fit of vLLM `version`; ValueError naming the generations
    it has when it has no such fit."""
    cal = calibration_for(hardware, version)
    if cal is None:
        have = ", ".join(f"calibrated-v{v}" for v in versions(hardware) if v != "unstated")
        raise ValueError(f"the {hardware.name} hardware preset has no calibration for vLLM {version}"
                         f" (it has: {have or 'none by version'})")
    return hardware if cal is hardware.calibration else replace(hardware, calibration=cal)
