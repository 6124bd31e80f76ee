"""Stream cadence: how often a running stream may get a mid-stream token update.

Knows the policy only (plain numbers in, an interval out; no asyncio, no clock of its own:
the pacer passes the wall time of each wake-up). The pacer asks `interval(streams)` at each
delivery and reports every wake-up's lag.

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
  `Pacer.relay_lateness`), judged by the lateness policy below.
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
  - once on: the interval doubles every ADJUST_EVERY wake-ups when the relay was late for
    more than RAISE_SHARE (1/8) of the wall time since the interval last changed, and
    halves after RELAX_EVERY wake-ups only if the relay was not late at all since then
    (and is not now, and the pacer's mean lag is under ON_TIME). So a saturated gateway
    keeps a working interval, one it stays on time with, instead of relaxing into one it
    cannot keep up with; it switches off only by halving below MIN_INTERVAL, after which
    switching on needs the share again.
  Why (BENCHMARKS.md, issue #12, "lateness policy"): a gateway relaying 256 streams one
  token at a time runs at ~1 core on this machine, yet reads each batch promptly (over
  the same-host lane its read lag sits at 0.5-1.5 ms, over 2 ms ~1 % of the time): it is
  late in short stretches making 25-40 % of the wall time, which a rule of 2 ms for 64
  wake-ups in a row (the previous one) hardly ever saw, while at 24 and 64 streams on a
  quiet machine the relay is late 0-1 % of the time. The rule does not weigh the number
  of open streams: what a gateway can relay one token at a time depends on the machine,
  and its lateness measures exactly that. `engaged` counts how often it switched on (the
  pacer logs the first).
- `when_late` False: every step, always (no coalescing even when late; a late pacer still
  retires several due steps in one wake-up, so their tokens go together).
- `rate` N > 0 (forced cap): with S live streams a stream's next update waits S / N
  seconds (never under MIN_INTERVAL) after its previous one, whatever the lag.
"""

from __future__ import annotations

import math

LATE = 0.002  # mean wake-up lag (wall s) above which updates are coalesced
ON_TIME = 0.0005  # mean lag below which coalescing relaxes
LAG_WEIGHT = 1 / 32  # the mean's weight of each new wake-up
ADJUST_EVERY = 32  # wake-ups between two doublings of the interval
RELAX_EVERY = 512  # wake-ups on time between two halvings (~0.3-1 s: relaxing too soon
# overloads the relaying process again)
RELAY_LATE = 0.0005  # relay level (wall s) above which the relay is late
SHARE_TAU = 1.0  # wall s: the time constant of the relay's late share
ENGAGE_SHARE = 0.25  # late share that switches coalescing on (from every step)
RAISE_SHARE = 0.125  # once on: late this share of the time since the last change doubles
RELAY_FRESH = 0.02  # wall s: the most wall time one wake-up weighs the relay's level by
MIN_INTERVAL = 0.001  # no coalesced interval under 1 ms (a lone decode steps every ~0.5 ms)
MAX_INTERVAL = 0.05


class Cadence:
    __slots__ = ("rate", "when_late", "current", "mean_lag", "relay", "late_share",
                 "engaged", "_since", "_seen", "_late_for", "_span")

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
        self._since = 0  # wake-ups since the interval last changed
        self._seen: float | None = None  # wall time of the previous wake-up
        self._late_for = 0.0  # wall s the relay was late since the interval last changed
        self._span = 0.0  # wall s (each wake-up's gap at most RELAY_FRESH) since then

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
        self.mean_lag += (max(lag, 0.0) - self.mean_lag) * LAG_WEIGHT
        seen, self._seen = self._seen, now
        if seen is not None and now > seen:
            late = 1.0 if self.relay > RELAY_LATE else 0.0
            gap = min(now - seen, RELAY_FRESH)
            self.late_share += (late - self.late_share) * -math.expm1(-gap / SHARE_TAU)
            self._span += gap
            self._late_for += gap * late
        self._since += 1
        if self._since < ADJUST_EVERY:
            return False
        if self.current:  # on: late for a share of the time since the last change
            relay_late = self._late_for > RAISE_SHARE * self._span
        else:  # off: late now, and for a lasting share of the last ~SHARE_TAU
            relay_late = self.relay > RELAY_LATE and self.late_share >= ENGAGE_SHARE
        if self.mean_lag > LATE or relay_late:
            if self.current >= MAX_INTERVAL:
                return False
            if not self.current:
                self.engaged += 1
            self.current = min(max(2 * self.current, MIN_INTERVAL), MAX_INTERVAL)
        elif (self.mean_lag < ON_TIME and self.relay <= RELAY_LATE and self.current
              and self._since >= RELAX_EVERY and not self._late_for):
            half = self.current / 2
            self.current = half if half >= MIN_INTERVAL else 0.0
        else:
            return False
        self._since = 0
        self._late_for = self._span = 0.0
        return True
