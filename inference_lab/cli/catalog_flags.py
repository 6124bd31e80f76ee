"""The user-catalog flag: `--catalog DIR` (repeatable) and INFERENCE_LAB_CATALOG; the
flags that change how every model is priced: `--timing`, `--kv-cache-dtype`.

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


def _timing(value: str) -> str:
    from inference_lab.engine.sim.generations import parse_timing

    try:
        parse_timing(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_timing_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timing", type=_timing, default=None,
        metavar="{roofline,calibrated,calibrated-vVERSION}",
        help="step timing model for every model: roofline (datasheet peaks, the default unless "
             "a hardware entry says `timing`), calibrated (the hardware preset's fitted "
             "[calibration]: achieved efficiencies, per-step and per-request overheads, fitted "
             "on the vLLM release its vllm_version names: 0.11 for b200, h200 and h100) or "
             "calibrated-vVERSION (the preset's fit of another vLLM generation, e.g. "
             "calibrated-v0.22 on h200; `inference-lab catalog show HARDWARE` lists them)")


KV_CACHE_DTYPE_CHOICES = ("auto", "bf16", "fp16", "fp8")


def add_kv_cache_dtype_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kv-cache-dtype", default=None, metavar="{auto,bf16,fp16,fp8}",
        help="what the KV cache stores, for every model, as vLLM's flag (replaces the "
             "config's [scheduler] kv_cache_dtype; auto = the model's own precision): fp8 "
             "halves a bf16 model's KV bytes per token, doubles its KV capacity and halves "
             "the KV a decode step reads (vLLM's spellings bfloat16, fp8_e4m3, fp8_e5m2 "
             "are taken too)")


def catalog_dirs(args: argparse.Namespace) -> list[str]:
    env = [d for d in os.environ.get(CATALOG_ENV, "").split(os.pathsep) if d]
    return env + list(getattr(args, "catalog", []) or [])


def build_catalog(args: argparse.Namespace):
    from inference_lab.engine.sim.catalog import Catalog

    return Catalog(catalog_dirs(args))
