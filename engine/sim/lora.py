"""LoRA adapters, as vLLM serves them: which adapters a base model has, which are resident
on the GPU, and what they cost.

Knows: the adapters registered for one base model (name, path, rank, an integer id as
vLLM's LoRARequest has), the GPU slots (`max_loras`, vLLM's flag: at most that many
distinct adapters run in one batch, and that many are resident), and the modelled costs:

- an adapter of rank r adds r * (d_in + d_out) parameters per adapted projection; the lab
  adapts the four attention projections (q, k, v, o: 8 * hidden per layer and unit of
  rank, taking each projection as hidden x hidden), in bf16;
- loading an adapter that is not resident moves its weights host to device at
  `LOAD_BANDWIDTH` (a modelled PCIe 5.0 x16 figure) and is added to the step that admits
  its first request;
- a step reads every distinct resident adapter it uses once, and each token through an
  adapter costs 2 * its parameters in FLOPs (bf16), as one extra roofline term.

Does not know requests, the scheduler, time or files (the service reads an adapter's
rank from its adapter_config.json).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inference_lab.engine.sim.specs import BYTES_PER_VALUE, Deployment

DEFAULT_RANK = 16  # when an adapter's path holds no adapter_config.json
LOAD_BANDWIDTH = 32e9  # bytes/s host to device (half of PCIe 5.0 x16's 64 GB/s per direction)
MAX_ADAPTERS = 64  # adapters one base model may have registered (a documented limit)
MAX_NAME = 256  # characters of an adapter's name (it is a model name in the API and metrics)
_SHOWN = 80  # characters of a refused name echoed in a message


class LoraError(ValueError):
    """A bad adapter request: unknown name, duplicate, beyond the limit, bad rank."""


def shown(name: str) -> str:
    """A name as a message echoes it: printable, at most _SHOWN characters."""
    text = name if len(name) <= _SHOWN else name[:_SHOWN] + "..."
    return text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text


def check_adapter_name(name: str) -> None:
    """An adapter's name is a served model's name: 1..MAX_NAME printable characters, no
    whitespace (LoraError otherwise)."""
    if not name:
        raise LoraError("lora_name must not be empty")
    if len(name) > MAX_NAME:
        raise LoraError(f"lora_name is {len(name)} characters long; at most {MAX_NAME}")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise LoraError(f"lora_name {shown(name)!r} must be printable, without whitespace")


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str
    path: str
    rank: int
    id: int  # vLLM's lora_int_id: 1, 2, ... in registration order


class LoraRegistry:
    """One base model's adapters and GPU slots."""

    def __init__(self, deployment: Deployment, max_loras: int, max_adapters: int = MAX_ADAPTERS):
        if max_loras < 1:
            raise LoraError(f"max_loras must be at least 1, got {max_loras}")
        self.base = deployment.name
        self.max_loras = max_loras
        self.max_adapters = max_adapters
        self.adapters: dict[str, LoraAdapter] = {}
        self.resident: OrderedDict[int, LoraAdapter] = OrderedDict()  # GPU slots, LRU first
        self._next_id = 1
        model = deployment.model
        bpv = BYTES_PER_VALUE["bf16"]
        self.params_per_rank = 8.0 * model.hidden_size * model.num_layers / deployment.tp
        self.bytes_per_rank = self.params_per_rank * bpv
        self.rate = deployment.hardware.flops.get("bf16") or max(deployment.hardware.flops.values())
        self.bandwidth = deployment.hardware.hbm_bandwidth

    # ---- registration -------------------------------------------------------------------
    def check(self, name: str, rank: int = DEFAULT_RANK) -> None:
        """Raise the LoraError `load` would, registering nothing."""
        check_adapter_name(name)
        if name in self.adapters:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.")
        if len(self.adapters) >= self.max_adapters:
            raise LoraError(f"{self.base} has {len(self.adapters)} LoRA adapters loaded, the "
                            f"most it may hold ({self.max_adapters}); unload one first")
        if rank < 1:
            raise LoraError(f"the rank of a LoRA adapter must be at least 1, got {rank}")

    def load(self, name: str, path: str, rank: int = DEFAULT_RANK) -> LoraAdapter:
        self.check(name, rank)
        adapter = LoraAdapter(name, path, rank, self._next_id)
        self._next_id += 1
        self.adapters[name] = adapter
        return adapter

    def unload(self, name: str) -> LoraAdapter:
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise LoraError(f"The lora adapter '{name}' cannot be found.")
        self.resident.pop(adapter.id, None)
        return adapter

    # ---- GPU slots ------------------------------------------------------------------------
    def is_resident(self, adapter: LoraAdapter) -> bool:
        return adapter.id in self.resident

    def make_resident(self, adapter: LoraAdapter, running: set[int]) -> float:
        """Put `adapter` in a GPU slot (evicting the least recently used adapter no running
        request uses) and return the modelled load time (0 when it was resident)."""
        slots = self.resident
        if adapter.id in slots:
            slots.move_to_end(adapter.id)
            return 0.0
        while len(slots) >= self.max_loras:
            victim = next((i for i in slots if i not in running), None)
            if victim is None:
                break  # cannot happen while the batch holds at most max_loras adapters
            del slots[victim]
        slots[adapter.id] = adapter
        return self.bytes_per_rank * adapter.rank / LOAD_BANDWIDTH

    # ---- cost -----------------------------------------------------------------------------
    def step_seconds(self, tokens_by_adapter: dict[LoraAdapter, int]) -> float:
        """The roofline time of the adapters' work in one step: each distinct adapter's
        weights read once, 2 * params FLOPs per token through it."""
        flops = nbytes = 0.0
        for adapter, tokens in tokens_by_adapter.items():
            flops += 2.0 * self.params_per_rank * adapter.rank * tokens
            nbytes += self.bytes_per_rank * adapter.rank
        return max(flops / self.rate, nbytes / self.bandwidth)
