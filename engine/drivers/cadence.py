"""Stream cadence: how often a running stream may get a mid-stream token update.

Knows the policy only (plain numbers in, an interval out; no asyncio, no clock of its own:
the pacer passes the wall time of each wake-up). The pacer asks `interval(streams)` at each
delivery and reports every wake-up's lag.

- Default (`rate` 0, `when_late` True): every step's tokens go out at the step's end, one
  update per token (like vLLM's `--stream-interval 1`). Coalescing is a last resort driven
  by measured lateness: the pacer's wake-up lag, smoothed over the last ~LAG_TAU of wall
  time (an exponential mean; one wake-up counts as at most LAG_CLAMP late, so a stall is
  one late moment, not lasting lateness). When that mean exceeds LATE (2 ms), a stream's
  next update waits at least `current` after its previous one, starting at MIN_INTERVAL
  and doubling every ADJUST_EVERY late wake-ups up to MAX_INTERVAL. Lateness is the
  pacer's own wake-up lag, or the relaying process's: `relay`, a level the service sets
  (how late the gateway reads the Session's batches, as the gateway reports it, or the
  mean time a Session write waits for it to make room: `Pacer.relay_lateness`), judged by
  the lateness policy below.
- The lateness policy (the relay). The relay is late while its level is above RELAY_LATE
  (0.5 ms: the gateway reports its read lag only above that, so any report of lateness
  counts). Whether that matters is judged on wall time, not on a count of wake-ups:
  - switching on (from every step): `late_share`, the share of the last ~SHARE_TAU (1 s)
    of wall time during which the relay was late (an exponential weighting; each wake-up
    weighs the level by the wall time since the previous one, at most RELAY_FRESH, a
    level being no evidence for longer than the gateway's report cadence), must reach
    ENGAGE_SHARE (1/4), the relay being late at that wake-up too. From on time, one
    unbroken stretch of lateness needs SHARE_TAU x ln(4/3) ~ 0.29 s to get there; a
    gateway that cannot keep up is late in many short stretches (each 10 ms window whose
    best read comes in on time breaks a run) and gets there by their sum.
  - once on: every ADJUST_EVERY wake-ups the interval doubles when the relay was late for
    more than RAISE_SHARE (1/8) of the wall time of those wake-ups (or the pacer's mean
    lag is over LATE), and each such window starts afresh whatever it decided. It halves
    once neither the relay nor the pacer has been late (relay over RELAY_LATE, mean lag
    over ON_TIME) for RELAX_AFTER of wall time, and again every RELAX_STEP while that
    lasts, to every step below MIN_INTERVAL: from MAX_INTERVAL back to every step within
    RELAX_AFTER + 5 x RELAX_STEP (0.75 s) of the lateness ending, whatever caused it (a
    spike of streams, a stall, a busy client), while a gateway late now and then (more
    often than every RELAX_AFTER) keeps an interval it stays on time with.
  Why (BENCHMARKS.md): a gateway relaying many streams one token at a time can take a
  whole core, yet read each batch promptly (its read lag stays small): it is late in
  short stretches that add up to a large share of the wall time, while with a few dozen
  streams on a quiet machine the relay is hardly ever late. So lateness is judged by its
  share of the wall time, not by a run of late wake-ups. The rule does not weigh the
  number of open streams: what a gateway can relay one token at a time depends on the
  machine, and its lateness measures exactly that.
  `engaged` counts how often it switched on (the pacer logs the first).
- `when_late` False: every step, always (no coalescing even when late; a late pacer still
  retires several due steps in one wake-up, so their tokens go together).
- `rate` N > 0 (forced cap): with S live streams a stream's next update waits S / N
  seconds (never under MIN_INTERVAL) after its previous one, whatever the lag.
"""

from __future__ import annotations

import math

LATE = 0.002  # mean wake-up lag (wall s) above which updates are coalesced
ON_TIME = 0.0005  # mean lag below which the pacer counts as on time
LAG_WEIGHT = 1 / 32  # the mean's weight of a first wake-up (no gap to weigh it by)
LAG_TAU = 0.05  # wall s: the time constant of the mean wake-up lag
LAG_CLAMP = 0.05  # wall s: the most one wake-up's lag counts for in the mean
ADJUST_EVERY = 32  # wake-ups in each window that may double the interval
RELAX_AFTER = 0.25  # wall s on time before the interval first halves
RELAX_STEP = 0.1  # wall s on time between two later halvings
RELAY_LATE = 0.0005  # relay level (wall s) above which the relay is late
SHARE_TAU = 1.0  # wall s: the time constant of the relay's late share
ENGAGE_SHARE = 0.25  # late share that switches coalescing on (from every step)
RAISE_SHARE = 0.125  # once on: late this share of a window's time doubles the interval
RELAY_FRESH = 0.02  # wall s: the most wall time one wake-up weighs the relay's level by
MIN_INTERVAL = 0.001  # no coalesced interval under 1 ms (a lone decode steps every ~0.5 ms)
MAX_INTERVAL = 0.05


class Cadence:
    __slots__ = ("rate", "when_late", "current", "mean_lag", "relay", "late_share",
                 "engaged", "_since", "_seen", "_late_for", "_span", "_late_at", "_changed_at")

    def __init__(self, rate: float = 0.0, when_late: bool = True) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate}")
        self.rate = rate
        self.when_late = when_late and not rate
        self.current = 0.0  # the lateness-driven interval (wall s); 0 = every step
        self.mean_lag = 0.0
        self.relay = 0.0  # the relaying process's lateness now (wall s), set by on_relay
        self.late_share = 0.0  # share of the last ~SHARE_TAU of wall time the relay was late
        self.engaged = 0  # times coalescing switched on
        self._since = 0  # wake-ups in the current window
        self._seen: float | None = None  # wall time of the previous wake-up
        self._late_for = 0.0  # wall s the relay was late in the current window
        self._span = 0.0  # wall s (each wake-up's gap at most RELAY_FRESH) of that window
        self._late_at = float("-inf")  # wall time of the last late wake-up
        self._changed_at = float("-inf")  # wall time the interval last changed

    def interval(self, streams: int) -> float:
        """Wall seconds a running stream waits after one update before the next."""
        if self.rate:
            return max(streams / self.rate, MIN_INTERVAL)
        return self.current

    @property
    def lateness(self) -> float:
        """The pacer's mean lag or the relay's lateness, the larger (wall s)."""
        return max(self.mean_lag, self.relay)

    def on_relay(self, lateness: float) -> None:
        """The relaying process is `lateness` wall seconds late now (a level, not a
        sample: it holds until the next report; each wake-up looks at it)."""
        self.relay = lateness if lateness > 0 else 0.0  # (NaN: 0)

    def on_lag(self, lag: float, now: float) -> bool:
        """One wake-up's lag (wall s) at wall time `now` (any clock in seconds, the same
        every call); True when the interval changed."""
        if not self.when_late:
            return False
        lag = min(lag, LAG_CLAMP) if lag > 0 else 0.0  # (NaN: 0)
        seen, self._seen = self._seen, now
        gap = now - seen if seen is not None and now > seen else 0.0
        weight = -math.expm1(-gap / LAG_TAU) if gap else LAG_WEIGHT
        self.mean_lag += (lag - self.mean_lag) * weight
        relay_late = self.relay > RELAY_LATE
        if gap:
            fresh = min(gap, RELAY_FRESH)
            self.late_share += ((1.0 if relay_late else 0.0) - self.late_share) * \
                -math.expm1(-fresh / SHARE_TAU)
            self._span += fresh
            if relay_late:
                self._late_for += fresh
        if relay_late or self.mean_lag >= ON_TIME:
            self._late_at = now
        if (self.current and now - self._late_at > RELAX_AFTER - 1e-6
                and now - self._changed_at > RELAX_STEP - 1e-6):  # (1e-6: clock rounding)
            half = self.current / 2  # on time for long enough: relax
            return self._change(half if half >= MIN_INTERVAL else 0.0, now)
        self._since += 1
        if self._since < ADJUST_EVERY:
            return False
        if self.current:  # on: late for a share of this window's time
            late = self._late_for > RAISE_SHARE * self._span
        else:  # off: late now, and for a lasting share of the last ~SHARE_TAU
            late = relay_late and self.late_share >= ENGAGE_SHARE
        self._since = 0  # each window starts afresh, whatever it decided
        self._late_for = self._span = 0.0
        if (self.mean_lag > LATE or late) and self.current < MAX_INTERVAL:
            if not self.current:
                self.engaged += 1
            return self._change(min(max(2 * self.current, MIN_INTERVAL), MAX_INTERVAL), now)
        return False

    def _change(self, interval: float, now: float) -> bool:
        self.current = interval
        self._changed_at = now
        self._since = 0
        self._late_for = self._span = 0.0
        return True
