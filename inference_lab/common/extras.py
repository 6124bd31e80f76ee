"""The install's extras as the code meets them: which extra of pyproject.toml brings the
package a feature imports, and the one-line error naming that extra when it is missing.

`pip install inference-lab` serves; plots and Parquet records (`experiments`), Hugging
Face tokenizers (`tokenizer`) and KV-cache events over ZMQ (`kv-events`) come with their
extra, and `all` brings every one. Knows nothing of the features themselves: each import
site says what needs the package. The command line prints a `MissingExtra` as one line
and exits with status 2.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# extra -> {top-level module: the distribution that provides it}, as pyproject.toml's
# [project.optional-dependencies] lists them
EXTRAS: dict[str, dict[str, str]] = {
    "experiments": {"matplotlib": "matplotlib", "pyarrow": "pyarrow"},
    "tokenizer": {"tokenizers": "tokenizers"},
    "kv-events": {"zmq": "pyzmq"},
}


class MissingExtra(ImportError):
    """A feature's package is not installed. str() is one line naming the extra:
    `KV events need pyzmq: pip install 'inference-lab[kv-events]'`."""

    def __init__(self, needs: str, module: str, extra: str) -> None:
        package = EXTRAS[extra][module.partition(".")[0]]
        super().__init__(f"{needs} {package}: pip install 'inference-lab[{extra}]'",
                         name=module)


def require(module: str, needs: str, extra: str) -> ModuleType:
    """`import module` (a submodule too: "pyarrow.parquet"), or MissingExtra when it cannot
    be imported. `needs` is the subject and its verb: "KV events need"."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(needs, module, extra) from None


def require_extra(extra: str, needs: str) -> None:
    """Every module of `extra` importable, or MissingExtra naming the first that is not:
    a command refuses at its start rather than after its work."""
    for module in EXTRAS[extra]:
        require(module, needs, extra)
