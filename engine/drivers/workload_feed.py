"""A workload as the offline drivers see it: the requests it sends and when.

Knows the workload spec: open-loop arrivals (the spec's pattern, or arrivals a caller
hands in), closed-loop users (their first requests spread over the jitter, each next one
when a driver says its user is free again), the request limit and the deadline, the
dataset, and the conversations that turn a request's lengths into token IDs. Every draw
comes from the one seeded stream, in the order the requests are sent.

Does not know the engine, the clock or what a refusal costs: a driver asks when the next
request is due (`next_time`), hands `take` or `users_arrive` its `submit` (which says
whether the engine took the request) and counts the refusals they return.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator

from inference_lab.common.conversations import Conversations
from inference_lab.common.dataset import Dataset
from inference_lab.common.workload import WorkloadSpec, draw_request, open_loop_arrivals

__all__ = ["Submit", "WorkloadFeed"]

# submit(now, prompt_len, output_len, key, token_ids[, named rank]) -> taken by the engine
Submit = Callable[..., bool]


class WorkloadFeed:
    """The requests of `spec`; `arrivals` (time, prompt tokens, output tokens, token IDs
    or b"", optionally a rank) replaces its open-loop arrivals, and makes it open loop."""

    def __init__(self, spec: WorkloadSpec, *, seed: int | None = None, tokenizer=None,
                 arrivals: Iterator[tuple] | None = None) -> None:
        seed = spec.seed if seed is None else seed
        self.spec = spec
        self.rng = random.Random(seed)
        self.convs = (Conversations(spec.shared_prefix_len, spec.num_shared_prefixes,
                                    spec.num_turns, seed) if spec.structured else None)
        self.limit = math.inf if spec.num_requests is None else spec.num_requests
        self.deadline = math.inf if spec.duration_secs is None else spec.duration_secs
        self.closed = spec.arrival_pattern == "closed_loop" and arrivals is None
        self.dataset = Dataset(spec.dataset_path, tokenizer).prompts() if spec.dataset_path else None
        if arrivals is None and not self.closed:
            arrivals = open_loop_arrivals(spec, self.rng, self.dataset)
        self._arrivals = arrivals
        self._next = next(arrivals, None) if arrivals is not None else None
        self.sent = 0  # requests handed to submit
        self._opened = 0  # open-loop arrivals (request i is in conversation i // num_turns)
        idle = list(range(spec.num_concurrent_users, 0, -1)) if self.closed else []  # user ids
        # closed loop: users about to send, (time, user) in a heap: the first requests
        # spread over [0, closed_loop_jitter_secs), then each user when a driver frees it
        jitter = spec.closed_loop_jitter_secs
        self._coming = [(self.rng.uniform(0.0, jitter), user) for user in idle] if jitter else []
        heapq.heapify(self._coming)
        self._idle = [] if self._coming else idle

    # ---- when ------------------------------------------------------------------------------
    def next_time(self) -> float | None:
        """When the next open-loop arrival or waiting user is due (None: none is)."""
        coming, nxt = self._coming, self._next
        if coming and (nxt is None or coming[0][0] <= nxt[0]):
            return coming[0][0]
        return nxt[0] if nxt is not None else None

    def more_to_come(self) -> bool:
        """Whether any request may still be sent."""
        return self._next is not None or bool(self._coming) or (self.closed and self.sent < self.limit)

    # ---- what ------------------------------------------------------------------------------
    def start(self, submit: Submit) -> int:
        """Closed loop without jitter: every user sends at 0. The refusals."""
        return self.users_arrive(0.0, submit) if self.closed and not self._coming else 0

    def take(self, submit: Submit) -> int:
        """Send what `next_time` named: a waiting user's request, or the next arrival.
        The refusals (0 or 1)."""
        coming, nxt = self._coming, self._next
        if coming and (nxt is None or coming[0][0] <= nxt[0]):
            t, user = heapq.heappop(coming)
            self._idle.append(user)
            return self.users_arrive(t, submit)
        at, prompt_len, output_len, token_ids, *named = nxt
        key = self._opened // self.spec.num_turns
        self._opened += 1
        self._next = next(self._arrivals, None)
        return 0 if self._send(submit, at, prompt_len, output_len, key, token_ids, *named) else 1

    def user_free(self, user: object, at: float | None = None) -> None:
        """`user`'s request ended (or was refused past the first hop): it sends its next at
        `at` (when `next_time` comes to it), or when `users_arrive` is next called."""
        if at is None:
            self._idle.append(user)
        else:
            heapq.heappush(self._coming, (at, user))

    def users_arrive(self, now: float, submit: Submit) -> int:
        """The free users send their next requests at `now`, within the limit and the
        deadline; the first refused one stops the others until the next call (refused
        users retry after the next completion). The refusals (0 or 1)."""
        idle = self._idle
        while idle and self.sent < self.limit and now <= self.deadline:
            request = draw_request(self.spec, self.rng, self.dataset)
            if request is None:  # the dataset has ended
                idle.clear()
                break
            user = idle.pop()
            if not self._send(submit, now, request[0], request[1], user, request[2]):
                idle.append(user)
                return 1
        return 0

    def _send(self, submit: Submit, now: float, prompt_len: int, output_len: int, key: object,
              token_ids: bytes, *named) -> bool:
        self.sent += 1
        tokens = self.convs.next_prompt(key, prompt_len, output_len) if self.convs else token_ids
        return submit(now, prompt_len, output_len, key, tokens, *named)
