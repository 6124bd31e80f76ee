"""The secrets' flags: `--api-key` and `--control-token`, and their environment variables.

Knows: flag names, the variables that stand in for them (INFERENCE_LAB_API_KEY,
INFERENCE_LAB_CONTROL_TOKEN: a flag wins over its variable; an empty value is unset),
and that a secret never appears in `--help` defaults or in logs. Prefer the variables:
a flag's value is visible to anyone who can list processes.

Also: the warning for a listener beyond loopback that lacks a secret (`warn_exposure`).

Does not know: how the secrets are checked (gateway.middleware, engine.service.access).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os

API_KEY_ENV = "INFERENCE_LAB_API_KEY"
CONTROL_TOKEN_ENV = "INFERENCE_LAB_CONTROL_TOKEN"


def add_control_token_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--control-token", metavar="TOKEN", default=argparse.SUPPRESS,
        help=f"require TOKEN on {what} (default: ${CONTROL_TOKEN_ENV}; unset: no check)",
    )


def add_api_key_argument(parser: argparse.ArgumentParser,
                         what: str = "/v1/* as `Authorization: Bearer KEY`") -> None:
    parser.add_argument(
        "--api-key", metavar="KEY", default=argparse.SUPPRESS,
        help=f"require KEY on {what} (default: ${API_KEY_ENV}; unset: no check)",
    )


def _resolve(value: str | None, env: str) -> str | None:
    return value or os.environ.get(env) or None


def api_key(args: argparse.Namespace) -> str | None:
    return _resolve(getattr(args, "api_key", None), API_KEY_ENV)


def control_token(args: argparse.Namespace) -> str | None:
    return _resolve(getattr(args, "control_token", None), CONTROL_TOKEN_ENV)


def is_loopback(host: str) -> bool:
    """`host` is a loopback address or `localhost` (a name or a wildcard is not)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def warn_exposure(log: logging.Logger, host: str, what: str, missing: list[str]) -> None:
    """One warning when `what` listens beyond loopback while secrets are `missing` (the
    flags' names)."""
    if missing and not is_loopback(host):
        log.warning("%s listening on %s without %s: anyone who can reach the port may use it "
                    "(docs/security.md)", what, host, " or ".join(missing))
