"""Stream cadence: how often a running stream may get a mid-stream token update.

Knows the policy only (plain numbers in, an interval out; no asyncio, no clock of its own).
The pacer asks `interval(streams)` at each delivery and reports every wake-up's lag.

- Default (`rate` 0, `when_late` True): every step's tokens go out at the step's end, one
  update per token (like vLLM's `--stream-interval 1`). Coalescing is a last resort driven
  by measured lateness: the pacer's wake-up lag, smoothed over the last ~32 wake-ups
  (an exponential mean). When that mean exceeds LATE (2 ms), a stream's next update waits
  at least `current` after its previous one, starting at MIN_INTERVAL and doubling every
  ADJUST_EVERY late wake-ups up to MAX_INTERVAL; when the mean has stayed below ON_TIME
  for RELAX_EVERY wake-ups it halves back, and below MIN_INTERVAL returns to every step.
  Lateness is the pacer's own wake-up lag and, reported by the service, the time a
  Session write waited for its reader (the gateway) to make room (`Pacer.relay_late`). `engaged` counts how often
  it switched on (the pacer logs the first).
- `when_late` False: every step, always (no coalescing even when late; a late pacer still
  retires several due steps in one wake-up, so their tokens go together).
- `rate` N > 0 (forced cap): with S live streams a stream's next update waits S / N
  seconds (never under MIN_INTERVAL) after its previous one, whatever the lag.
"""

from __future__ import annotations

LATE = 0.002  # mean wake-up lag (wall s) above which updates are coalesced
ON_TIME = 0.0005  # mean lag below which coalescing relaxes
LAG_WEIGHT = 1 / 32  # the mean's weight of each new wake-up
ADJUST_EVERY = 32  # wake-ups between two doublings of the interval
RELAX_EVERY = 512  # wake-ups on time between two halvings (~0.3-1 s: relaxing too soon
# overloads the relaying process again)
MIN_INTERVAL = 0.001  # no coalesced interval under 1 ms (a lone decode steps every ~0.5 ms)
MAX_INTERVAL = 0.05


class Cadence:
    __slots__ = ("rate", "when_late", "current", "mean_lag", "engaged", "_since")

    def __init__(self, rate: float = 0.0, when_late: bool = True) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate}")
        self.rate = rate
        self.when_late = when_late and not rate
        self.current = 0.0  # the lateness-driven interval (wall s); 0 = every step
        self.mean_lag = 0.0
        self.engaged = 0  # times coalescing switched on
        self._since = 0  # wake-ups since the interval last changed

    def interval(self, streams: int) -> float:
        """Wall seconds a running stream waits after one update before the next."""
        if self.rate:
            return max(streams / self.rate, MIN_INTERVAL)
        return self.current

    def on_lag(self, lag: float) -> bool:
        """One wake-up's lag (wall s); True when the interval changed."""
        if not self.when_late:
            return False
        self.mean_lag += (max(lag, 0.0) - self.mean_lag) * LAG_WEIGHT
        self._since += 1
        if self._since < ADJUST_EVERY:
            return False
        if self.mean_lag > LATE:
            if self.current >= MAX_INTERVAL:
                return False
            if not self.current:
                self.engaged += 1
            self.current = min(max(2 * self.current, MIN_INTERVAL), MAX_INTERVAL)
        elif self.mean_lag < ON_TIME and self.current and self._since >= RELAX_EVERY:
            half = self.current / 2
            self.current = half if half >= MIN_INTERVAL else 0.0
        else:
            return False
        self._since = 0
        return True
