"""The engine's LoRA flags, as vLLM spells them, and what it reads of an adapter.

Knows `--lora-modules` (each value `name=path`, or vLLM's JSON form
`{"name": ..., "path": ..., "base_model_name": ...}`), `--max-loras` and `--enable-lora`,
and that the only file of an adapter the lab reads is its `adapter_config.json` (for its
rank `r`; absent: rank 16, DEFAULT_RANK). Does not know scheduling or costs
(engine.sim.lora) or gRPC (engine.service.control).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inference_lab.engine.sim.lora import DEFAULT_RANK, LoraError


@dataclass(frozen=True, slots=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str  # "" = the only model served


def read_rank(path: str) -> int:
    """The rank `r` in `path`/adapter_config.json, or DEFAULT_RANK when there is none;
    LoraError for one that cannot be read."""
    config = Path(path) / "adapter_config.json" if path else None
    if config is None or not config.is_file():
        return DEFAULT_RANK
    try:
        doc = json.loads(config.read_text())
        rank = doc.get("r", DEFAULT_RANK) if isinstance(doc, dict) else None
    except (OSError, ValueError) as exc:
        raise LoraError(f"{config} is not a readable adapter_config.json: {exc}") from None
    if type(rank) is not int or rank < 1:
        raise LoraError(f"{config}: `r` must be an integer >= 1, got {rank!r}")
    return rank


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
