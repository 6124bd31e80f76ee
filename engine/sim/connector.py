"""KvConnector: the P/D disaggregation half of EngineCore (vLLM's NixlConnector's role).

Knows a replica's KV role (engine.sim.kv_transfer: producer, consumer, both, none), the
handoffs a producer holds for consumers, the link a consumer's pulls cross, and the
kv_transfer_params a remote-decode prefill answers with (docs/pd.md).
Does not know steps or admission: EngineCore (core.py) calls `_connect` as it queues a
request and `_hand_off` when a remote-decode prefill finishes, and the drivers take,
free and expire handoffs on their clock.
"""

from __future__ import annotations

from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.engine.sim.kv_transfer import (
    BOTH, CONSUMER, NONE, Handoff, Handoffs, KvTransfer, LinkQueue, link_preset, prompt_digest,
)
from inference_lab.engine.sim.request import Request
from inference_lab.engine.sim.scheduler import Scheduler
from inference_lab.engine.sim.specs import Deployment


class KvConnector:
    """Mixed into EngineCore, which has set `deployment`, `name`, `block_size` and
    `scheduler` before it calls `_start_connector`."""

    deployment: Deployment
    name: str
    block_size: int
    scheduler: Scheduler

    def _start_connector(self) -> None:
        # This replica's role, the handoffs it holds for consumers, the link its pulls
        # cross, and who it is in the params it gives (engine id, side-channel host and
        # port: set by whoever runs it).
        self.kv_role = BOTH
        self.handoffs = Handoffs()
        self.link = LinkQueue(link_preset("rdma", self.deployment.hardware))
        self.kv_identity: dict = {"remote_engine_id": "", "remote_host": "localhost",
                                  "remote_port": 0}
        self.transfers = self.scheduler.transfers

    def _connect(self, req: Request, kv: KvTransfer, token_ids: bytes) -> None:
        """A producer holds a remote-decode request's KV once prefilled (its blocks booked
        against the handoffs' cap now: HandoffsFull past it); a consumer pulls a remote
        prefill's KV over its link, from when the request may be scheduled, and schedules
        it once the last byte has come. Without a connector (NONE) nothing happens."""
        if self.kv_role == NONE:
            return
        if kv.remote_decode and self.kv_role != CONSUMER and req.n == 1 and not req.pooling:
            self.handoffs.reserve(self.name, -(-req.prompt_len // self.block_size))
            req.remote_decode = True
            req.kv_digest = prompt_digest(token_ids, req.prompt_len)
        if kv.remote_tokens:
            tokens = min(kv.remote_tokens, req.prompt_len)
            blocks = -(-tokens // self.block_size)
            start = req.ready
            end = self.link.book(start, blocks * self.block_size * bytes_per_token(self.deployment))
            req.external_tokens = tokens
            req.transfer_s = end - start
            req.ready = end

    def transfer_seconds(self, tokens: int) -> float:
        """What a pull of `tokens` prompt positions takes alone on this replica's link."""
        blocks = -(-tokens // self.block_size)
        return self.link.link.seconds(blocks * self.block_size * bytes_per_token(self.deployment))

    def _hand_off(self, req: Request, now: float) -> None:
        """A remote-decode prefill finished: its prompt's blocks stay held for a consumer
        (its reservation becomes the hold)."""
        need = -(-req.prompt_len // self.block_size)
        self.handoffs.unreserve(need)
        blocks = self.scheduler.hold_blocks(need)
        if blocks:
            req.handoff = self.handoffs.hold(req.kv_digest, req.prompt_len, blocks, now)
            req.handoff.params = self.kv_params(req)

    def kv_params(self, req: Request) -> dict | None:
        """The kv_transfer_params a remote-decode prefill answers with (NixlConnector's
        request_finished), or None."""
        handoff = req.handoff
        if handoff is None:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": handoff.block_ids, **self.kv_identity,
                "remote_request_id": handoff.request_id, "tp_size": self.deployment.tp}

    def take_handoff(self, request_id: str, digest: bytes, now: float) -> Handoff | None:
        """A consumer pulls a handoff (its blocks are held until `free_handoff`), or None
        when it is gone (never held, pulled already, timed out) or `digest` (the consumer's
        prompt_digest) is not its prompt's."""
        self.expire_handoffs(now)
        return self.handoffs.take(request_id, digest, now)

    def free_handoff(self, handoff: Handoff, pulled: bool = True) -> None:
        freed = self.handoffs.free(handoff)
        if freed:
            self.scheduler.free_blocks += freed
            if pulled:
                self.transfers.pulled += 1

    def expire_handoffs(self, now: float) -> int:
        """Free the handoffs nobody pulled within the abort timeout: how many."""
        expired = self.handoffs.expired(now)
        for handoff in expired:
            self.scheduler.free_blocks += self.handoffs.free(handoff)
            if not handoff.pulling:
                self.transfers.expired += 1
        return len(expired)

    def drop_handoffs(self) -> None:
        """Every handoff's blocks are gone (the replica slept or stopped)."""
        for handoff in list(self.handoffs.held.values()):
            self.scheduler.free_blocks += self.handoffs.free(handoff)
