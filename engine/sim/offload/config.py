"""What KV offloading is configured to do: vLLM's `--kv-offloading-size`,
`--kv-offloading-backend` and the OffloadingConnector's `--kv-transfer-config`, resolved
into one frozen `OffloadConfig`, and the host link it prices transfers with.

Knows vLLM v0.34's spellings and meanings: the size is GiB in total across the tensor-
parallel ranks of one replica (`cpu_bytes_to_use` = size x 2^30); the backend is
`native` (vLLM's OffloadingConnector) or `lmcache` (LMCacheMPConnector); the connector's
`kv_connector_extra_config` keys `cpu_bytes_to_use`, `block_size` / `blocks_per_chunk`,
`eviction_policy` (lru | arc), `offload_prompt_only`, and the disk tier as vLLM's
`TieringOffloadingSpec` with an `fs` secondary tier. Does not know requests, time or
the block pool (engine.sim.offload.manager).

The lmcache backend is modelled as the native one, with two differences stated: vLLM
does not hand the size to LMCache (its own server holds the capacity), so the lab takes
the same `--kv-offloading-size` as that server's capacity; and the kv_transfer_config it
reports names LMCacheMPConnector. LMCache's own chunking (256 tokens) and its
asynchronous layer-wise pipeline are not modelled: its chunks are the GPU blocks, priced
on the same host link.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

GIB = 2**30
BACKENDS = ("native", "lmcache")
POLICIES = ("lru", "arc")
CONNECTORS = {"native": "OffloadingConnector", "lmcache": "LMCacheMPConnector"}
# A host link where the hardware preset names none: PCIe Gen5 x16's effective DMA rate
# per direction (docs/kv-offload research: vLLM's offloading blog measured ~50 GB/s).
GIB_BYTES = GIB
HOST_LINK_FALLBACK = (5.0e10, 5e-5)
# A disk tier's read and write rate where none is given: Dynamo's mocker default for its
# G2<->G3 link (7 GB/s); its fixed latency per job is an assumption.
DISK_LINK_DEFAULT = (7.0e9, 1e-4)


class OffloadConfigError(ValueError):
    """A setting that cannot be used; the message names the flag or key."""


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """KV offloading of one replica (None anywhere = off)."""

    cpu_bytes: float  # host tier bytes, total across the TP ranks (vLLM's cpu_bytes_to_use)
    backend: str = "native"
    blocks_per_chunk: int = 1  # GPU blocks per host chunk
    chunk_tokens: int = 0  # vLLM's extra-config block_size: tokens per chunk (0: by blocks)
    eviction_policy: str = "lru"  # arc is taken and priced as lru (stated)
    offload_prompt_only: bool = True  # vLLM's default: decode-generated KV is not stored
    disk_bytes: float = 0.0  # the fs tier behind the host tier (0: none), total
    host_bandwidth: float = 0.0  # bytes/s per GPU per direction (0: the hardware's host_link)
    host_latency: float = -1.0  # seconds per transfer job (< 0: the hardware's)
    disk_bandwidth: float = DISK_LINK_DEFAULT[0]
    disk_latency: float = DISK_LINK_DEFAULT[1]

    @property
    def size_gib(self) -> float:
        return self.cpu_bytes / GIB

    def kv_transfer_config(self) -> dict:
        """The --kv-transfer-config vLLM derives from these settings (what /server_info
        shows)."""
        extra: dict = {"cpu_bytes_to_use": int(self.cpu_bytes)}
        if self.blocks_per_chunk != 1:
            extra["blocks_per_chunk"] = self.blocks_per_chunk
        if self.eviction_policy != "lru":
            extra["eviction_policy"] = self.eviction_policy
        if self.disk_bytes:
            extra["spec_name"] = "TieringOffloadingSpec"
            extra["secondary_tiers"] = [{"type": "fs", "capacity_bytes": int(self.disk_bytes)}]
        if self.backend == "lmcache":
            extra = {}
        return {"kv_connector": CONNECTORS[self.backend], "kv_role": "kv_both",
                "kv_connector_extra_config": extra}


def _nonneg(value, flag: str, what: str = "a number of GiB >= 0") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value < 0 or value == float("inf"):
        raise OffloadConfigError(f"{flag}: expected {what}, got {value!r}")
    return float(value)


def from_flags(size_gib: float | None, backend: str | None = None,
               disk_size_gib: float | None = None,
               kv_transfer_config: str | None = None) -> OffloadConfig | None:
    """The config of the flags (None: offloading off, vLLM's default). A
    --kv-transfer-config naming OffloadingConnector turns it on by itself;
    --kv-offloading-size wins over its cpu_bytes_to_use, as vLLM's flag does."""
    config = parse_kv_transfer_config(kv_transfer_config) if kv_transfer_config else None
    backend = backend or "native"
    if backend not in BACKENDS:
        raise OffloadConfigError(f"--kv-offloading-backend: expected one of "
                                 f"{', '.join(BACKENDS)}, got {backend!r}")
    if size_gib is not None:
        what = "a number of GiB > 0 (leave it out for no offloading)"
        size = _nonneg(size_gib, "--kv-offloading-size", what)
        if size == 0:
            raise OffloadConfigError(f"--kv-offloading-size: expected {what}, got {size_gib!r}")
        config = replace(config, cpu_bytes=size * GIB) if config else OffloadConfig(size * GIB)
    if config is None:
        if disk_size_gib:
            raise OffloadConfigError("--kv-offloading-disk-size needs --kv-offloading-size "
                                     "(the disk tier sits behind the host tier)")
        return None
    config = replace(config, backend=backend)
    if disk_size_gib is not None:
        config = replace(config, disk_bytes=_nonneg(disk_size_gib, "--kv-offloading-disk-size") * GIB)
    return config


_EXTRA_KEYS = ("cpu_bytes_to_use", "block_size", "blocks_per_chunk", "eviction_policy",
               "offload_prompt_only", "spec_name", "secondary_tiers", "store_threshold",
               "max_tracker_size")


def parse_kv_transfer_config(text: str) -> OffloadConfig:
    """vLLM's --kv-transfer-config JSON for its OffloadingConnector (or
    LMCacheMPConnector): cpu_bytes_to_use is required; blocks_per_chunk (block_size is
    taken as a multiple of the GPU block only through blocks_per_chunk), eviction_policy,
    offload_prompt_only; a TieringOffloadingSpec's first `fs` tier with `capacity_bytes`
    (the lab's: vLLM's fs tier has no size; llm-d's evictor bounds it)."""
    flag = "--kv-transfer-config"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffloadConfigError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise OffloadConfigError(f"{flag}: expected a JSON object")
    connector = raw.get("kv_connector")
    backends = {v: k for k, v in CONNECTORS.items()}
    if connector not in backends:
        raise OffloadConfigError(f"{flag}: kv_connector must be one of "
                                 f"{', '.join(backends)} for KV offloading, got {connector!r}")
    extra = raw.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        raise OffloadConfigError(f"{flag}: kv_connector_extra_config must be an object")
    unknown = sorted(set(extra) - set(_EXTRA_KEYS))
    if unknown:
        raise OffloadConfigError(f"{flag}: unknown kv_connector_extra_config key {unknown[0]!r} "
                                 f"(known: {', '.join(_EXTRA_KEYS)})")
    if "cpu_bytes_to_use" not in extra:
        raise OffloadConfigError(f"{flag}: kv_connector_extra_config.cpu_bytes_to_use is required")
    cpu = _nonneg(extra["cpu_bytes_to_use"], f"{flag}: cpu_bytes_to_use", "a number of bytes >= 0")
    bpc = extra.get("blocks_per_chunk", 1)
    if isinstance(bpc, bool) or not isinstance(bpc, int) or bpc < 1:
        raise OffloadConfigError(f"{flag}: blocks_per_chunk must be an integer >= 1, got {bpc!r}")
    chunk_tokens = extra.get("block_size", 0)
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 0:
        raise OffloadConfigError(f"{flag}: block_size must be an integer >= 1, got {chunk_tokens!r}")
    if chunk_tokens and "blocks_per_chunk" in extra:
        raise OffloadConfigError(f"{flag}: give block_size or blocks_per_chunk, not both")
    policy = extra.get("eviction_policy", "lru")
    if policy not in POLICIES:
        raise OffloadConfigError(f"{flag}: eviction_policy must be one of {', '.join(POLICIES)}, "
                                 f"got {policy!r}")
    prompt_only = extra.get("offload_prompt_only", True)
    if not isinstance(prompt_only, bool):
        raise OffloadConfigError(f"{flag}: offload_prompt_only must be true or false")
    disk = 0.0
    for tier in extra.get("secondary_tiers", []) or []:
        if not isinstance(tier, dict) or tier.get("type") not in ("fs", "fs_python"):
            raise OffloadConfigError(f"{flag}: secondary_tiers: only an `fs` tier is modelled")
        disk = _nonneg(tier.get("capacity_bytes", 0), f"{flag}: secondary_tiers capacity_bytes",
                       "a number of bytes >= 0")
        break
    return OffloadConfig(cpu, backends[connector], bpc, chunk_tokens, policy, prompt_only, disk)
