"""The engine's LoRA flags, as vLLM spells them, and what it reads of an adapter.

Knows `--lora-modules` (each value `name=path`, or vLLM's JSON form
`{"name": ..., "path": ..., "base_model_name": ...}`), `--max-loras` and `--enable-lora`,
and that the only file of an adapter the lab reads is its `adapter_config.json` (for its
rank `r`; absent: rank 16, DEFAULT_RANK): a regular file of at most MAX_CONFIG_BYTES, read
at once on the caller's loop (a PEFT config is about 1 KB), whose content no error quotes
(a path can name any file the engine may read). Does not know scheduling or costs
(engine.sim.lora) or gRPC (engine.service.control).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from inference_lab.engine.sim.lora import DEFAULT_RANK, LoraError

CONFIG_NAME = "adapter_config.json"
MAX_CONFIG_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str  # "" = the only model served


def read_rank(path: str) -> int:
    """The rank `r` in `path`/adapter_config.json, or DEFAULT_RANK when there is none;
    LoraError for one that cannot be read, is larger than MAX_CONFIG_BYTES, or has no
    valid `r`. The error names the file and the field, never what the file holds."""
    config = Path(path) / CONFIG_NAME if path else None
    if config is None or not config.is_file():
        return DEFAULT_RANK
    text = _read_config(config)
    try:
        doc = json.loads(text)
    except ValueError:
        raise LoraError(f"{config} is not a JSON object (a PEFT {CONFIG_NAME})") from None
    if not isinstance(doc, dict):
        raise LoraError(f"{config} is not a JSON object (a PEFT {CONFIG_NAME})")
    rank = doc.get("r", DEFAULT_RANK)
    if type(rank) is not int or rank < 1:
        raise LoraError(f"{config}: `r` must be an integer >= 1")
    return rank


def _read_config(config: Path) -> bytes:
    """The file's bytes, if it is a regular file of at most MAX_CONFIG_BYTES (opened
    without blocking, so a FIFO swapped in after the check cannot hang the loop)."""
    unreadable = LoraError(f"{config} is not a readable {CONFIG_NAME}")
    try:
        fd = os.open(config, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        raise unreadable from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise unreadable
        if info.st_size > MAX_CONFIG_BYTES:
            raise LoraError(f"{config} is larger than {MAX_CONFIG_BYTES} bytes: not a PEFT "
                            f"{CONFIG_NAME}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        raise unreadable from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:  # (it grew after fstat)
        raise LoraError(f"{config} is larger than {MAX_CONFIG_BYTES} bytes: not a PEFT "
                        f"{CONFIG_NAME}")
    return data


def parse_lora_module(text: str) -> LoraModule:
    """One --lora-modules value; LoraError says what is malformed."""
    text = text.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise LoraError(f"--lora-modules {text!r}: not JSON: {exc}") from None
        unknown = set(doc) - {"name", "path", "base_model_name"}
        if unknown:
            raise LoraError(f"--lora-modules {text!r}: unknown key(s) {', '.join(sorted(unknown))}")
        name, path, base = doc.get("name"), doc.get("path"), doc.get("base_model_name") or ""
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path \
                or not isinstance(base, str):
            raise LoraError(f"--lora-modules {text!r}: needs string `name` and `path`")
        return LoraModule(name, path, base)
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise LoraError(f"--lora-modules {text!r}: expected name=path or a JSON object "
                        '{"name": ..., "path": ..., "base_model_name": ...}')
    return LoraModule(name, path, "")
