"""Prefill/decode disaggregation as vLLM's NixlConnector runs it: roles, the KV a prefill
hands over, and the modelled link it crosses.

Knows: a replica's role (vLLM's `kv_role`; NONE: no connector, as vLLM without
`--kv-transfer-config`), the blocks a producer holds for a consumer after a
`do_remote_decode` prefill (`Handoffs`: until the consumer pulls them or vLLM's abort
timeout frees them, under a cap on what one replica may hold), who may pull them (an
unguessable id, and the digest of the prompt they hold), and what a pull costs: setup latency + bytes / bandwidth, the
bytes being the blocks' positions x the KV bytes one position takes on each GPU (each GPU
of a tensor-parallel group moves its own shard over its own link, in parallel), on a link
that carries one pull's bytes at a time in the order the pulls start (`LinkQueue`:
concurrent pulls into one replica share its bandwidth; the last ends when it would under
an even share).

Does not know: the clock (told the time, as the core is), streams, the fleet. The block
pool is the scheduler's: `Handoffs` only counts what it asked it to hold.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from inference_lab.engine.sim.specs import Hardware

PRODUCER, CONSUMER, BOTH = "kv_producer", "kv_consumer", "kv_both"
ROLES = (PRODUCER, CONSUMER, BOTH)
# No KV connector (a replica started without --kv-roles): kv_transfer_params are ignored,
# as vLLM ignores them without --kv-transfer-config.
NONE = ""
_ALIASES = {"prefill": PRODUCER, "p": PRODUCER, "decode": CONSUMER, "d": CONSUMER, "both": BOTH}
# vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default: a producer frees unpulled blocks after it.
ABORT_TIMEOUT_S = 480.0
# Of a replica's KV cache, the share that handoffs may hold, those of admitted
# remote-decode requests not yet prefilled included: a prefill past it is refused, so the
# rest of the cache always serves other requests (vLLM has no such cap; its producers are
# reached by its router alone).
HOLD_SHARE = 0.5
# vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default; a replica's is this + its data-parallel rank.
SIDE_CHANNEL_PORT = 5600


def parse_roles(text: str, replicas: int) -> tuple[str, ...]:
    """A role per replica index from a layout: "P:D" (P prefill replicas, then D decode
    ones; P + D = replicas) or a comma list of roles (kv_producer / kv_consumer / kv_both,
    or prefill / decode / both), one per replica. ValueError names what is wrong."""
    text = text.strip()
    if ":" in text and "," not in text:
        left, _, right = text.partition(":")
        try:
            p, d = int(left), int(right)
        except ValueError:
            raise ValueError(f"a P:D layout is two counts, got {text!r}") from None
        if p < 0 or d < 0 or p + d != replicas:
            raise ValueError(f"the layout {text!r} has {p} + {d} replicas; "
                             f"--replicas is {replicas}")
        return (PRODUCER,) * p + (CONSUMER,) * d
    roles = []
    for item in text.split(","):
        name = _ALIASES.get(item.strip().lower(), item.strip().lower())
        if name not in ROLES:
            raise ValueError(f"unknown role {item.strip()!r}: one of {', '.join(ROLES)} "
                             "(or prefill, decode, both)")
        roles.append(name)
    if len(roles) != replicas:
        raise ValueError(f"{len(roles)} roles for {replicas} replicas")
    return tuple(roles)


# How a disaggregated deployment's router picks a replica of each pool.
PD_POLICIES = ("least_loaded", "round_robin")


@dataclass(frozen=True, slots=True)
class PdLayout:
    """A disaggregated deployment: `prefill` kv_producer replicas, `decode` kv_consumer
    replicas, the link into each decode replica (`link_preset`'s spec) and how the router
    picks a replica of each pool (PD_POLICIES)."""

    prefill: int
    decode: int
    link: str = "rdma"
    policy: str = "least_loaded"


def parse_pools(text: str) -> tuple[int, int]:
    """(prefill replicas, decode replicas) from "P:D", each at least 1. ValueError names
    what is wrong."""
    left, sep, right = str(text).strip().partition(":")
    try:
        p, d = int(left), int(right)
    except ValueError:
        raise ValueError(f"expected P:D, two counts of replicas (e.g. 1:3), got {text!r}") from None
    if not sep or p < 1 or d < 1:
        raise ValueError(f"expected P:D with at least one replica in each pool, got {text!r}")
    return p, d


@dataclass(frozen=True, slots=True)
class Link:
    """One GPU's path to its peer: bytes/s per direction, and the setup of one pull."""

    name: str
    bandwidth: float  # bytes/s per GPU
    latency: float  # seconds per pull

    def seconds(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


# A NIC where the hardware preset names none: 400 Gb/s (ConnectX-7) per GPU.
RDMA_FALLBACK = (5.0e10, 2e-5)


def link_preset(spec: str, hardware: Hardware) -> Link:
    """`nvlink` (within a node: the preset's scale-up fabric), `rdma` (across nodes: its
    scale-out NIC per GPU) or `GBPS[@LATENCY_MS]` (bytes in GB/s, e.g. `25@0.05`)."""
    spec = spec.strip().lower()
    if spec == "nvlink":
        return Link("nvlink", hardware.link_bandwidth, hardware.link_latency)
    if spec == "rdma":
        bandwidth, latency = RDMA_FALLBACK
        if hardware.scale_out_bandwidth:
            bandwidth, latency = hardware.scale_out_bandwidth, hardware.scale_out_latency
        return Link("rdma", bandwidth, latency)
    gbps, _, ms = spec.partition("@")
    try:
        bandwidth, latency = float(gbps) * 1e9, float(ms or 0) / 1e3
    except ValueError:
        raise ValueError(f"a KV link is nvlink, rdma or GBPS[@LATENCY_MS], got {spec!r}") from None
    if not bandwidth > 0 or not latency >= 0:
        raise ValueError(f"a KV link needs bandwidth > 0 and latency >= 0, got {spec!r}")
    return Link(spec, bandwidth, latency)


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """What a request asks of the connector (vLLM's kv_transfer_params, resolved)."""

    remote_decode: bool = False  # hold the prompt's KV for a consumer once prefilled
    remote_tokens: int = 0  # prompt positions to pull from a producer (0: none)
    # KV offloading (engine.sim.offload): tokens it may load from / store to the host
    # tier (-1: no cap; 0: none), vLLM's experimental max_load_tokens / max_offload_tokens
    max_load_tokens: int = -1
    max_offload_tokens: int = -1
    # the tiers it may load from (vLLM's kv_load_tiers' media, "CPU" / "STORAGE"; None:
    # every tier, an empty tuple: none)
    load_tiers: tuple[str, ...] | None = None


@dataclass(slots=True)
class LinkQueue:
    """The link into one replica: pulls' bytes cross it one after another."""

    link: Link
    free_at: float = 0.0  # when the bytes booked so far have crossed

    def book(self, start: float, nbytes: float) -> float:
        """A pull that may start at `start`: when its last byte has arrived. Alone on the
        link it takes exactly link.seconds(nbytes)."""
        begin = max(start + self.link.latency, self.free_at)
        end = begin + nbytes / self.link.bandwidth
        self.free_at = end
        return end


class HandoffsFull(Exception):
    """A remote-decode prefill whose blocks would take the replica's handoffs past their
    cap: refused at admission, before it runs."""

    def __init__(self, model: str, held: int, blocks: int, cap: int) -> None:
        self.model = model
        super().__init__(
            f"KV transfer capacity exhausted on this {model} replica: handoffs hold or "
            f"reserve {held} of the {cap} KV blocks they may take, and this prefill needs "
            f"{blocks}. Retry once the held handoffs are pulled.")


def prompt_digest(token_ids: bytes, prompt_len: int) -> bytes:
    """What binds a handoff to its prompt: a digest of its token IDs (packed uint32), or of
    its length alone when it has none."""
    return hashlib.blake2b(token_ids or prompt_len.to_bytes(8, "little"), digest_size=16).digest()


@dataclass(slots=True)
class Handoff:
    """A finished prefill's KV, held on its producer for a consumer to pull."""

    request_id: str  # unguessable (secrets.token_hex): the params' remote_request_id
    digest: bytes  # prompt_digest of the prompt it holds: a pull must present the same
    tokens: int  # prompt positions the blocks hold
    block_ids: list[int]
    expires: float  # sim time at which the abort timeout frees it
    pulling: bool = False  # a consumer took it: freed when its pull ends
    params: dict = field(default_factory=dict)  # the kv_transfer_params that name it


@dataclass(slots=True)
class TransferStats:
    """Counters as the metrics read them (tokens, blocks, requests)."""

    external_queries: int = 0  # prompt tokens of requests admitted with a connector
    external_hits: int = 0  # of which received from a producer
    recomputed: int = 0  # requests whose remote KV was gone: prefilled here instead
    expired: int = 0  # handoffs the abort timeout freed before any pull
    pulled: int = 0  # handoffs a consumer pulled


@dataclass(slots=True)
class Handoffs:
    """A producer's held handoffs, by their unguessable id; block ids from a counter (the
    simulation keeps no block table: the ids name the handoff's blocks, nothing more).
    `max_blocks` caps what they hold and what admitted remote-decode prefills reserve."""

    timeout: float = ABORT_TIMEOUT_S
    max_blocks: int = 0  # held + reserved blocks at most (0: no cap)
    held: dict[str, Handoff] = field(default_factory=dict)
    held_blocks: int = 0  # blocks of every handoff not freed yet (pulling ones included)
    reserved: int = 0  # blocks of admitted remote-decode requests not finished yet
    next_block: int = 1

    def reserve(self, model: str, blocks: int) -> None:
        """Book a remote-decode request's blocks at its admission, or HandoffsFull."""
        taken = self.held_blocks + self.reserved
        if self.max_blocks and taken + blocks > self.max_blocks:
            raise HandoffsFull(model, taken, blocks, self.max_blocks)
        self.reserved += blocks

    def unreserve(self, blocks: int) -> None:
        self.reserved -= blocks

    def hold(self, digest: bytes, tokens: int, blocks: int, now: float) -> Handoff:
        ids = list(range(self.next_block, self.next_block + blocks))
        self.next_block += blocks
        handoff = Handoff(secrets.token_hex(16), digest, tokens, ids, now + self.timeout)
        self.held[handoff.request_id] = handoff
        self.held_blocks += blocks
        return handoff

    def take(self, request_id: str, digest: bytes, now: float) -> Handoff | None:
        """The handoff a consumer pulls (its blocks stay held until `free`), or None when
        it is gone (never held here, pulled already, past its timeout) or holds another
        prompt than the one the consumer presents (a miss: the handoff stays)."""
        handoff = self.held.get(request_id)
        if handoff is None or handoff.pulling or handoff.expires <= now \
                or not secrets.compare_digest(handoff.digest, digest):
            return None
        handoff.pulling = True
        return handoff

    def free(self, handoff: Handoff) -> int:
        """Its blocks go back to the pool: how many (0 when freed already)."""
        if self.held.pop(handoff.request_id, None) is None:
            return 0
        self.held_blocks -= len(handoff.block_ids)
        return len(handoff.block_ids)

    def expired(self, now: float) -> list[Handoff]:
        """Handoffs whose timeout has passed (a pull that has not ended by then, which
        no modelled link comes near, is given up on too)."""
        return [h for h in self.held.values() if h.expires <= now]
