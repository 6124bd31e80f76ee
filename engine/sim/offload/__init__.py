"""KV offloading, as vLLM's OffloadingConnector does it: a host (CPU) tier of KV chunks
behind the GPU's prefix cache, and an optional disk tier behind that (docs/kv-offload.md).

`config` resolves the flags and vLLM's kv_transfer_config; `tier` keeps one tier's
chunks; `manager` runs the copies and answers the scheduler; `admission` is the
scheduler's half (a request waiting for its load); `memory_tiers` maps a config's
[memory] tiers onto the host and disk tiers. Pure: told the time, as the core is.
"""

from inference_lab.engine.sim.offload.config import (
    GIB_BYTES, HOST_LINK_FALLBACK, OffloadConfig, OffloadConfigError, from_flags, parse_kv_transfer_config,
)
from inference_lab.engine.sim.offload.manager import HostOffload, OffloadRequest

__all__ = ["GIB_BYTES", "HOST_LINK_FALLBACK", "HostOffload", "OffloadConfig", "OffloadConfigError",
           "OffloadRequest", "from_flags", "host_link", "offload_request", "parse_kv_transfer_config"]


def offload_request(kv) -> OffloadRequest:
    """A request's offload state from what it asks of the connector (a KvTransfer, or
    None: no caps, every tier)."""
    if kv is None:
        return OffloadRequest()
    tiers = kv.load_tiers
    return OffloadRequest(kv.max_load_tokens, kv.max_offload_tokens,
                          load_host=tiers is None or "CPU" in tiers,
                          load_disk=tiers is None or "STORAGE" in tiers)


def host_link(hardware) -> tuple[float, float]:
    """(bytes/s per GPU per direction, seconds per job) of a hardware preset's host link,
    PCIe Gen5 x16's where it names none."""
    bandwidth, latency = HOST_LINK_FALLBACK
    if hardware.host_link_bandwidth > 0:
        bandwidth = hardware.host_link_bandwidth
    if hardware.host_link_latency >= 0:
        latency = hardware.host_link_latency
    return bandwidth, latency
