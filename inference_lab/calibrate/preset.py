"""A hardware preset written with a fitted [calibration].

Knows the layout of a catalog directory (`DIR/hardware/NAME.toml`, what `--catalog DIR`
reads) and how to copy a preset's TOML text with its [calibration] table, and the
comment block just above it, replaced by a new one. Everything else in the preset
(peaks, memory, fabric) is kept as written.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from inference_lab.calibrate.fitting import PARAMETERS
from inference_lab.engine.sim.specs import Calibration

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def _without_calibration(text: str) -> str:
    """`text` without its [calibration] table and the comment lines right above it."""
    lines = text.splitlines()
    out: list[str] = []
    skipping = False
    for line in lines:
        stripped = line.strip()
        if stripped == "[calibration]":
            skipping = True
            while out and (out[-1].lstrip().startswith("#") or not out[-1].strip()):
                out.pop()
            continue
        if skipping and stripped.startswith("["):
            skipping = False
            out.append("")
        if not skipping:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def calibration_table(cal: Calibration, comment: list[str]) -> str:
    lines = [f"# {c}" if c else "#" for c in comment] + ["[calibration]"]
    for f in fields(Calibration):
        if f.name in PARAMETERS and getattr(cal, f.name) is not None:  # None: the key is unset
            lines.append(f"{f.name} = {float(f'{getattr(cal, f.name):.4g}')!r}")
    if cal.memory_reserve:  # not fitted here: the start's, carried so the KV pool stays its size
        lines.append(f"memory_reserve = {float(f'{cal.memory_reserve:.4g}')!r}")
    lines.append(f"fit = {json.dumps(cal.fit)}")  # a JSON string is a TOML basic string
    return "\n".join(lines) + "\n"


def write_preset(directory: Path, name: str, base_text: str, base_name: str, cal: Calibration,
                 comment: list[str]) -> Path:
    """Write DIR/hardware/NAME.toml: the `base_name` preset's text with `cal` as its
    [calibration], and return the path."""
    target = directory / "hardware" / f"{name}.toml"
    target.parent.mkdir(parents=True, exist_ok=True)
    head = f"# {name}: the {base_name} preset with a [calibration] fitted by inference-lab calibrate.\n"
    target.write_text(head + _without_calibration(base_text) + "\n" + calibration_table(cal, comment),
                      encoding="utf-8")
    return target
