"""KV offloading's flags, as vLLM spells them: `--kv-offloading-size GIB`,
`--kv-offloading-backend native|lmcache`, `--kv-transfer-config JSON` (its
OffloadingConnector form) and the lab's `--kv-offloading-disk-size GIB` for the disk tier.

Knows the flags, their help, how `serve` hands them to its engine, and how they set
every deployment's offload (engine.sim.offload.config resolves and checks them). A bad
value is one line naming the flag (UsageError, exit 2).
"""

from __future__ import annotations

import argparse

from inference_lab.cli import UsageError


def add_offload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-offloading-size", type=float, default=None, metavar="GIB",
        help="KV offloading, as vLLM's flag: a host (CPU) tier of this many GiB, in total "
             "across the tensor-parallel GPUs of each replica, holding prompt KV chunks that "
             "fell out of the GPU prefix cache; a later prompt with that prefix loads them "
             "over the hardware preset's host_link instead of computing them (default: off)")
    p.add_argument(
        "--kv-offloading-backend", choices=("native", "lmcache"), default=None,
        help="vLLM's offloading backend: native (OffloadingConnector, the default) or lmcache "
             "(LMCacheMPConnector: modelled the same way, its capacity taken from "
             "--kv-offloading-size)")
    p.add_argument(
        "--kv-offloading-disk-size", type=float, default=None, metavar="GIB",
        help="a disk tier behind the host tier (vLLM's TieringOffloadingSpec with an fs tier): "
             "every chunk stored to the host is written through to it, and a disk hit is "
             "promoted to the host before it is loaded (needs --kv-offloading-size)")
    p.add_argument(
        "--kv-transfer-config", default=None, metavar="JSON",
        help="vLLM's --kv-transfer-config for offloading: "
             "'{\"kv_connector\":\"OffloadingConnector\",\"kv_connector_extra_config\":"
             "{\"cpu_bytes_to_use\":BYTES,\"eviction_policy\":\"lru\"}}' (also blocks_per_chunk, "
             "block_size, offload_prompt_only, spec_name TieringOffloadingSpec with "
             "secondary_tiers [{\"type\":\"fs\",\"capacity_bytes\":BYTES}])")


def offload_config(args: argparse.Namespace):
    """The OffloadConfig the flags ask for, or None (off); UsageError names a bad flag."""
    from inference_lab.engine.sim.offload import OffloadConfigError, from_flags

    try:
        return from_flags(getattr(args, "kv_offloading_size", None),
                          getattr(args, "kv_offloading_backend", None),
                          getattr(args, "kv_offloading_disk_size", None),
                          getattr(args, "kv_transfer_config", None))
    except OffloadConfigError as exc:
        raise UsageError(str(exc)) from None


def apply_offload(args: argparse.Namespace, deployments) -> None:
    """Give every deployment the flags' offloading (flags win over a config's [memory]
    tiers)."""
    config = offload_config(args)
    if config is None:
        return
    for dep in deployments:
        dep.offload = config


def flagged(args: argparse.Namespace, deployments: list) -> list:
    """The deployments as the flags run them: the engine profile's, then the offloading's
    (every command that builds deployments from flags goes through here)."""
    from inference_lab.cli.engine_profile_flags import profiled

    deployments = profiled(args, deployments)
    apply_offload(args, deployments)
    return deployments


def offload_argv(args: argparse.Namespace) -> list[str]:
    """The flags again, for the engine process `serve` starts."""
    argv: list[str] = []
    for flag, value in (("--kv-offloading-size", args.kv_offloading_size),
                        ("--kv-offloading-backend", args.kv_offloading_backend),
                        ("--kv-offloading-disk-size", args.kv_offloading_disk_size),
                        ("--kv-transfer-config", args.kv_transfer_config)):
        if value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv
