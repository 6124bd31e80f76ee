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
  Lateness is the pacer's own wake-up lag, or the relaying process's: `relay`, a level
  the service sets (how late the gateway reads the Session's batches, as the gateway
  reports it, or the mean time a Session write waits for it to make room:
  `Pacer.relay_lateness`). The relay counts as late once it has stayed above LATE for
  RELAY_PERSIST wake-ups in a row (~0.1 s at a step every 1.5 ms), so that a burst (a
  few dozen clients connecting at once, a collector pause) does not group anything but a
  gateway that stays behind does; it counts as on time below ON_TIME. `engaged` counts how
  often it switched on (the pacer logs the first).
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
RELAY_PERSIST = 64  # wake-ups in a row with the relay above LATE before it counts as late
MIN_INTERVAL = 0.001  # no coalesced interval under 1 ms (a lone decode steps every ~0.5 ms)
MAX_INTERVAL = 0.05


class Cadence:
    __slots__ = ("rate", "when_late", "current", "mean_lag", "relay", "relay_streak",
                 "engaged", "_since")

    def __init__(self, rate: float = 0.0, when_late: bool = True) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate}")
        self.rate = rate
        self.when_late = when_late and not rate
        self.current = 0.0  # the lateness-driven interval (wall s); 0 = every step
        self.mean_lag = 0.0
        self.relay = 0.0  # the relaying process's lateness now (wall s), set by on_relay
        self.relay_streak = 0  # wake-ups in a row that found `relay` above LATE
        self.engaged = 0  # times coalescing switched on
        self._since = 0  # wake-ups since the interval last changed

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

    def on_lag(self, lag: float) -> bool:
        """One wake-up's lag (wall s); True when the interval changed."""
        if not self.when_late:
            return False
        self.mean_lag += (max(lag, 0.0) - self.mean_lag) * LAG_WEIGHT
        self.relay_streak = self.relay_streak + 1 if self.relay > LATE else 0
        self._since += 1
        if self._since < ADJUST_EVERY:
            return False
        if self.mean_lag > LATE or self.relay_streak >= RELAY_PERSIST:
            if self.current >= MAX_INTERVAL:
                return False
            if not self.current:
                self.engaged += 1
            self.current = min(max(2 * self.current, MIN_INTERVAL), MAX_INTERVAL)
        elif (self.mean_lag < ON_TIME and self.relay < ON_TIME and self.current
              and self._since >= RELAX_EVERY):
            half = self.current / 2
            self.current = half if half >= MIN_INTERVAL else 0.0
        else:
            return False
        self._since = 0
        return True
