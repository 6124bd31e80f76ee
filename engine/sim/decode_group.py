"""The decode group: every running request that computes exactly one position per step.

Knows the group's aggregate state so that one step of N decodes costs O(1) Python work
plus O(log N) per event (a finish, a window saturation), never O(N):

- G counts the positions every member has advanced: one per step, or 1 + accepted draft
  tokens per step under speculative decoding (`advance(by)`). A member that joined at
  G = g with c computed positions and o output tokens stores comp_off = c - g and
  out_off = o - g; at any later G it has c' = comp_off + G computed positions and
  o' = out_off + G tokens (capped at max_tokens in the step that finishes it).
- Attention of a decode verifying w positions uses m = c' + ceil(w / 2) (mean causal
  context), so sum m = S + n (G + ceil(w / 2)) with S = sum comp_off; sliding windows keep
  the sum over members that have not reached the window yet and a heap of the G at
  which each will.
- A member needs a new KV block for each position p it advances over with
  p % block_size == 0: members are counted by comp_off % block_size, so the number
  needing one is a table lookup per position.
Does not know about budgets, preemption choice or the waiting queue (engine.scheduler).

This encoding stays inside this class: everything else asks it (through EngineCore) how
many tokens a request had at a progress mark (`output_at`), whether it is decoding
(`decoding`) and how many steps away the next finish is (`steps_to_next_finish`).
"""

from __future__ import annotations

import heapq

from inference_lab.engine.sim.request import Request


class DecodeGroup:
    def __init__(self, block_size: int, windows: tuple[int, ...]) -> None:
        self.G = 0  # steps taken by the group
        self.n = 0  # members
        self.comp_sum = 0  # S = sum of comp_off over members
        self.block_size = block_size
        self.phase_count = [0] * block_size  # members by comp_off % block_size
        self.windows = windows
        # Per window: members still below it, sum of their comp_off, heap of
        # (G at which the member reaches the window, seq, request, epoch).
        self.unsat_n = [0] * len(windows)
        self.unsat_sum = [0] * len(windows)
        self.sat_heaps: list[list[tuple[int, int, Request, int]]] = [[] for _ in windows]
        self.finish_heap: list[tuple[int, int, Request, int]] = []  # (G at finish, ...)
        self._seq = 0
        self._settled_g = -1  # windows processed up to this G
        self.last_advance = 1  # positions the latest step advanced
        self.max_advance = 1  # the most one step may advance (1 + the longest draft)

    # ---- membership -------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Join with req.num_computed / req.num_output as of now (after the step)."""
        g = self.G
        req.in_group = True
        req.group_epoch += 1
        req.comp_off = comp_off = req.num_computed - g
        req.out_off = req.num_output - g
        self.n += 1
        self.comp_sum += comp_off
        self.phase_count[comp_off % self.block_size] += 1
        self._seq += 1
        seq, epoch = self._seq, req.group_epoch
        heapq.heappush(self.finish_heap, (req.max_tokens - req.out_off, seq, req, epoch))
        for j, w in enumerate(self.windows):
            sat_g = w - 1 - comp_off  # first G at which comp_off + G + 1 >= w
            if sat_g > g:
                self.unsat_n[j] += 1
                self.unsat_sum[j] += comp_off
                heapq.heappush(self.sat_heaps[j], (sat_g, seq, req, epoch))

    def remove(self, req: Request) -> None:
        """Leave the group, writing the request's live counters back into it."""
        g = self.G
        self._settle(g)
        comp_off = req.comp_off
        req.num_computed = comp_off + g
        req.num_output = min(req.out_off + g, req.max_tokens)
        req.in_group = False  # heap entries of this epoch are now stale
        self.n -= 1
        self.comp_sum -= comp_off
        self.phase_count[comp_off % self.block_size] -= 1
        for j, w in enumerate(self.windows):
            if w - 1 - comp_off > g:
                self.unsat_n[j] -= 1
                self.unsat_sum[j] -= comp_off

    # ---- what one step of the group needs ----------------------------------------
    def blocks_needed(self, advance: int = 1) -> int:
        """New KV blocks the members need to advance `advance` positions next step."""
        if not self.n:
            return 0
        g, bs, phases = self.G, self.block_size, self.phase_count
        return sum(phases[(-g - k) % bs] for k in range(advance))

    def attention(self, width: int = 1) -> tuple[float, tuple[float, ...]]:
        """(sum m, per-window sum min(m, W)) for the next step, each member computing
        `width` positions (1, or 1 + draft tokens to verify)."""
        g = self.G
        self._settle(g)
        n = self.n
        off = g + (width + 1) // 2
        full = self.comp_sum + n * off
        wins = tuple(
            self.unsat_sum[j] + self.unsat_n[j] * off + (n - self.unsat_n[j]) * w
            for j, w in enumerate(self.windows)
        )
        return full, wins

    def advance(self, by: int = 1) -> tuple[list[Request], int]:
        """Take one step: every member advances `by` positions and samples as many
        tokens (fewer for one that reaches max_tokens). Returns the members that reached
        max_tokens (still members: remove them) and the tokens sampled."""
        old = self.G
        self.G = g = old + by
        self.last_advance = by
        done = []
        sampled = self.n * by
        heap = self.finish_heap
        while heap and heap[0][0] <= g:
            _, _, req, epoch = heapq.heappop(heap)
            if req.in_group and req.group_epoch == epoch:
                req.done_gain = req.max_tokens - (req.out_off + old)
                sampled -= by - req.done_gain
                done.append(req)
        return done, sampled

    # ---- what the rest of the engine may ask ------------------------------------------
    @property
    def mark(self) -> int:
        """The progress mark now: positions the group has advanced (see `output_at`)."""
        return self.G

    def output_at(self, req: Request, mark: int) -> int:
        """Tokens `req` had sampled at progress mark `mark`, for a mark no older than the
        step before the one that last changed it: a member counts from its offset; a
        request that finished in the step ending at its `done_mark` had what that step
        gave it (`done_gain`) less before it; any other request's own count is exact."""
        if req.in_group:
            return req.out_off + mark
        if req.finished and mark < req.done_mark:
            return req.num_output - req.done_gain
        return req.num_output

    def live_output(self, req: Request) -> int:
        return req.out_off + self.G if req.in_group else req.num_output

    @staticmethod
    def decoding(req: Request) -> bool:
        """True while `req` is a member (it gains a token every step)."""
        return req.in_group

    def steps_to_next_finish(self) -> int | None:
        """Group steps until the next member may reach max_tokens (None: no member); a
        lower bound when steps can advance several positions."""
        heap = self.finish_heap
        while heap and not (heap[0][2].in_group and heap[0][2].group_epoch == heap[0][3]):
            heapq.heappop(heap)  # stale: the member left (preempted or cancelled)
        return -(-(heap[0][0] - self.G) // self.max_advance) if heap else None

    def live_computed(self, req: Request) -> int:
        return req.comp_off + self.G if req.in_group else req.num_computed

    def _settle(self, g: int) -> None:
        if g == self._settled_g:
            return
        self._settled_g = g
        for j, heap in enumerate(self.sat_heaps):
            while heap and heap[0][0] <= g:
                _, _, req, epoch = heapq.heappop(heap)
                if req.in_group and req.group_epoch == epoch:
                    self.unsat_n[j] -= 1
                    self.unsat_sum[j] -= req.comp_off
