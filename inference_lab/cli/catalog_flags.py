"""The user-catalog flag: `--catalog DIR` (repeatable) and INFERENCE_LAB_CATALOG.

Knows: the flag, its variable (directories separated by the platform's path separator,
`:` on Linux) and their order: the bundled presets, then the variable's directories,
then each `--catalog` in the order given; a later directory's preset replaces an
earlier one of the same name. Does not know what a preset holds (engine.sim.catalog).
"""

from __future__ import annotations

import argparse
import os

CATALOG_ENV = "INFERENCE_LAB_CATALOG"


def add_catalog_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--catalog", metavar="DIR", action="append", default=[],
        help="a catalog directory with models/*.toml and/or hardware/*.toml presets that add "
             "to or replace the bundled ones (repeatable: a later one wins; also "
             f"${CATALOG_ENV}, colon-separated, read before the flags)")


def add_timing_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timing", choices=("roofline", "calibrated"), default=None,
        help="step timing model for every model: roofline (datasheet peaks, the default unless "
             "a hardware entry says `timing`) or calibrated (the hardware preset's fitted "
             "[calibration]: achieved efficiencies, per-step and per-request overheads)")


def catalog_dirs(args: argparse.Namespace) -> list[str]:
    env = [d for d in os.environ.get(CATALOG_ENV, "").split(os.pathsep) if d]
    return env + list(getattr(args, "catalog", []) or [])


def build_catalog(args: argparse.Namespace):
    from inference_lab.engine.sim.catalog import Catalog

    return Catalog(catalog_dirs(args))
