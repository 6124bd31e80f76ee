"""SGLang's scheduler, as a client sees it: the lab's batching with SGLang's rules.

Knows what makes SGLang's scheduler answer differently from vLLM's (sources in
docs/engines.md):
- a step is a prefill batch or a decode batch, never both (enable_mixed_chunk off): a
  round that can prefill (a chunked prompt to continue, or a waiting request admitted)
  runs as a prefill pass and the running decodes wait for the next step;
- admission reserves room for the running requests' remaining output (PrefillAdder): a
  request is admitted only while its prompt's uncached tokens plus its output, clipped at
  4096, fit below the free and evictable tokens less `min(remaining output, 4096) x
  new_token_ratio` for every running request and the clipped output of those admitted
  earlier in the round; the first misfit ends the round (fcfs keeps head-of-line order);
- the new-token ratio starts at 0.7 x schedule_conservativeness, falls linearly to 14 %
  of that over 600 decode passes, returns to its start when the engine idles, and after a
  retraction (the lab's recompute preemption) is re-estimated from the running requests'
  decoded tokens plus 20 steps each over their max_new_tokens;
- the prefix cache is token-granular (page_size 1: the profile's block size), so a hit is
  any token count; unreferenced entries are evicted least recently used.

Does not know time, costs or drivers; everything else (KV accounting, the cache, LoRA,
parallel sampling, preemption) is engine.sim.scheduler's.
"""

from __future__ import annotations

from inference_lab.engine.sim.scheduler import Decision, Scheduler
from inference_lab.engine.sim.request import Request

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # x schedule_conservativeness, capped at 1
MIN_RATIO_FACTOR = 0.14  # the floor: init x this
DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


class SglangScheduler(Scheduler):
    conservativeness = 1.0  # --schedule-conservativeness

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * self.conservativeness, 1.0)
        self.min_ratio = self.init_ratio * MIN_RATIO_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self._round_offset = 0.0  # tokens reserved this round: running and admitted requests

    # ---- the decision ----------------------------------------------------------------
    def schedule(self, now: float, max_num_seqs: int, width: int = 1, advance: int = 1,
                 admit: bool = True) -> Decision:
        decision = Decision(num_decodes=0, decode_width=width, decode_advance=advance)
        self._end_pulls(now)
        if not self.running:
            self.new_token_ratio = self.init_ratio  # idle: the estimate starts over
        budget = self._schedule_prefilling(decision, self.config.max_num_batched_tokens)
        if admit and not decision.preempted and budget > 0:
            self._round_offset = self._running_reserve()
            self._admit_waiting(decision, budget, now, max_num_seqs)
        if decision.chunks or decision.preempted:
            return decision  # a prefill pass: the decodes wait for the next step
        if self.group.n:
            self._schedule_decodes(decision)
            if decision.preempted:
                self._re_estimate()
            else:
                self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        return decision

    # ---- admission: PrefillAdder's reserve ---------------------------------------------
    def _running_reserve(self) -> float:
        """min(remaining output, 4096) x new_token_ratio, summed over the running requests."""
        live = self.group.live_output
        clip = CLIP_MAX_NEW_TOKENS
        total = 0
        for req in self.running.values():
            remaining = req.max_tokens - live(req)
            total += remaining if remaining < clip else clip
        return total * self.new_token_ratio

    def _fits(self, req: Request, start: int) -> bool:
        """The uncached prompt plus the clipped output below the free and evictable tokens
        less what the round has reserved; the request's own output is then reserved."""
        extend = req.prompt_len + req.num_output - start
        own = min(req.max_tokens - req.num_output, CLIP_MAX_NEW_TOKENS)
        if extend + own >= self.free_blocks * self.block_size - self._round_offset:
            return False
        self._round_offset += own
        return True

    def _re_estimate(self) -> None:
        """After a retraction: decoded tokens plus 20 steps each, over max_new_tokens, of
        the requests still running (at most 1)."""
        live = self.group.live_output
        decoded = total = 0
        for req in self.running.values():
            decoded += live(req)
            total += req.max_tokens
        if total:
            self.new_token_ratio = min(
                (decoded + RETRACT_DECODE_STEPS * len(self.running)) / total, 1.0)
