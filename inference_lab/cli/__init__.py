"""`inference-lab`: one command, a subcommand per way of running the engine.

Each subcommand lives in its own module (`inference_lab.cli.cmd_<name>`) exposing
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = ("serve", "engine", "gateway", "sim", "experiment", "catalog", "calibrate", "conformance")


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inference-lab",
        description=(
            "A lab for testing clients of LLM inference servers: an OpenAI-compatible API "
            "whose latencies come from a simulated GPU engine paced to the wall clock, which "
            "saturates like the modelled hardware and refuses with HTTP 529 when its waiting "
            "queue is full."
        ),
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"inference_lab.cli.cmd_{name}")
        except ModuleNotFoundError as exc:  # a subcommand not built yet
            if exc.name != f"inference_lab.cli.cmd_{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from inference_lab.common import lifeline

    # First: a child whose parent dies while this one is still starting ends too.
    lifeline.bind_to_parent()
    from inference_lab.common.extras import MissingExtra

    parser = build_parser()
    try:  # a flag's value may need an extra (--tokenizer, --kv-events-config)
        args = parser.parse_args(argv)
    except MissingExtra as exc:
        print(f"inference-lab: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from inference_lab.common.toml import ConfigError

    try:
        return int(args.func(args) or 0)
    except (UsageError, ConfigError, MissingExtra) as exc:
        print(f"inference-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
