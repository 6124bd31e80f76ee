"""Stream cadence: how often a running stream may get a mid-stream token update.

Knows the policy only (plain numbers in, an interval out; no asyncio, no clock of its own:
the pacer passes the wall time of each wake-up). The pacer asks `interval(streams)` at each
delivery and reports every wake-up's lag.

- Default (`rate` 0, `when_late` True): every step's tokens go out at the step's end, one
  update per token (like vLLM's `--stream-interval 1`). Grouping is a last resort driven
  by measured lateness, and it groups as little as keeps up: a controller looks for the
  smallest interval (a running stream's next update waits at least `current` after its
  previous one) at which the relay's lag stays under RELAY_TARGET.
- Lateness, two sources: the pacer's own wake-up lag, smoothed over the last ~LAG_TAU of
  wall time (an exponential mean; one wake-up counts as at most LAG_CLAMP late, so a stall
  is one late moment, not lasting lateness), late above LATE (2 ms); and the relaying
  process's: `relay`, a level the service sets (how late the gateway reads the Session's
  batches, as the gateway reports it, or the mean time a Session write waits for it to
  make room: `Pacer.relay_lateness`), late above RELAY_TARGET (1 ms). Both are judged on
  wall time, not on a count of wake-ups: each wake-up weighs the relay's level by the
  wall time since the previous one, at most RELAY_FRESH (a level is no evidence for
  longer than the gateway's report cadence).
- The control period: every PERIOD (50 ms) of wall time (a long sleep counts as one
  PERIOD) the controller judges the period's `pressure`: the relay's mean level over it
  / RELAY_TARGET, or the pacer's mean lag / LATE, the larger (over 1: late; under 1: on
  time, with headroom 1 - pressure). `judged` holds the period's mean relay level, for
  the metrics. Each octave of the interval (every step; 1-2 ms; 2-4 ms; ...; 32-50 ms;
  MAX_INTERVAL: `_band`) keeps the geometric mean pressure of its periods over the last
  RESPONSE_HOLD (2 s): what grouping that much did lately.
  - off (every step): it switches on at MIN_INTERVAL when the period is late and the
    relay was late for a lasting share of the wall time: `late_share`, the share of the
    last ~SHARE_TAU (1 s) of wall time during which the relay's level was over
    RELAY_TARGET (an exponential weighting), reaches ENGAGE_SHARE (1/4), the relay being
    late at that wake-up too (or the pacer's mean lag alone is over LATE). From on time,
    one unbroken stretch of lateness needs SHARE_TAU x ln(4/3) ~ 0.29 s to get there; a
    gateway that cannot keep up is late in many short stretches and gets there by their
    sum; a start-up burst shorter than that does not.
  - on, a late period: multiplicative increase, by the pressure (at least 1 + MARGIN,
    at most 2x), up to MAX_INTERVAL. The interval it was late at is remembered as
    insufficient (`floor`). When the last interval found on time (`ceiling`) is above
    it, the increase goes no further than that: the smallest sufficient interval is
    bracketed between the two. But grouping more must help: an increase into the next
    octave is made only when that octave was not judged lately, or it or an octave
    above it was at least a quarter (GAIN) less late (a plateau of lateness under a
    sufficient interval is crossed). Otherwise the lateness is one grouping does not
    cure (a busy host: the gateway waits for a core, not for its backlog), and unless
    the octave below was judged clearly worse (SLACK: 1.5x as late) the interval comes
    down (x (1 - DECAY / 2)) and is held to the octave below (`cap`, which doubles
    again every CAP_HOLD, 2 s, so a load that grows is tried again; an octave above it
    judged clearly less late stays open); also at MAX_INTERVAL.
  - on, an on-time period: a gentle decrease proportional to the headroom: x (1 - DECAY x
    headroom), so far under the target it falls fast (x 0.7 per period on a relay lag
    near 0), and near the target it hardly moves, but never to within MARGIN of the
    floor while the floor holds: FLOOR_HOLD (1 s) of wall time after it was found,
    while the period's pressure stays over RELEASE (1/4: a relay far under its target
    has room to spare) and the open streams are at least 3/4 of what they were then (a
    smaller load is not bound by it). Once the floor lapses it probes lower; a probe that goes late
    costs one period and renews the floor. Under MIN_INTERVAL it delivers every step
    again.
  So under a steady load the interval settles between the largest interval found
  insufficient and 1 + MARGIN times that (it converges; it does not sit at MAX_INTERVAL
  unless even that is late and less would be worse), and once the load ends it falls back to every step within
  about a second (x 0.7 per 50 ms from MAX_INTERVAL: ~0.6 s, after the floor is
  released). Why (BENCHMARKS.md): a gateway relaying many streams one token at a time
  can take a whole core; grouping a few tokens per write relieves it, and grouping more
  than needed only delays tokens (inter-token latency at the client) without helping.
  A lateness that is the same whatever the interval keeps it at every step most of the
  time, trying an octave more now and then.
  The rule does not weigh the number of open streams to set the interval: what a gateway
  can relay one token at a time depends on the machine, and its lateness measures
  exactly that (the streams only release the floor when the load falls).
  `engaged` counts how often it switched on (the pacer logs the first).
- `when_late` False: every step, always (no coalescing even when late; a late pacer still
  retires several due steps in one wake-up, so their tokens go together).
- `rate` N > 0 (forced cap): with S live streams a stream's next update waits S / N
  seconds (never under MIN_INTERVAL) after its previous one, whatever the lag.
"""

from __future__ import annotations

import math

LATE = 0.002  # mean wake-up lag (wall s) above which the pacer is late
LAG_WEIGHT = 1 / 32  # the mean's weight of a first wake-up (no gap to weigh it by)
LAG_TAU = 0.05  # wall s: the time constant of the mean wake-up lag
LAG_CLAMP = 0.05  # wall s: the most one wake-up's lag counts for in the mean
RELAY_TARGET = 0.001  # wall s: the relay's lag the interval is set to keep under
RELAY_LATE = RELAY_TARGET  # relay level (wall s) above which the relay is late
RELAY_FRESH = 0.02  # wall s: the most wall time one wake-up weighs the relay's level by
PERIOD = 0.05  # wall s (weighed as above) between two decisions of the controller
SHARE_TAU = 1.0  # wall s: the time constant of the relay's late share
ENGAGE_SHARE = 0.25  # late share that switches coalescing on (from every step)
MARGIN = 0.25  # the least increase, and how far above an insufficient interval to stay
DECAY = 0.3  # an on-time period's decrease, per unit of headroom
PRESSURE_CAP = 2.0  # the most one late period multiplies the interval by
FLOOR_HOLD = 1.0  # wall s an interval found insufficient bounds the decrease
FLOOR_STREAMS = 0.75  # ... while the open streams are at least this share of theirs then
RELEASE = 0.25  # ... and while a period's pressure stays above this (far under: released)
RESPONSE_HOLD = 2.0  # wall s a band's mean pressure is evidence of what grouping there does
RESPONSE_WEIGHT = 0.2  # a period's weight in its band's mean log pressure
PRESSURE_RANGE = (0.05, 20.0)  # what one period's pressure counts for in that mean, at most
GAIN = math.log(1 / 0.75)  # grouping more must cut the (geometric) mean pressure by 1/4 ...
SLACK = math.log(1.5)  # ... and grouping less is taken when it was not 1.5x as late
CAP_HOLD = 2.0  # wall s a cap set by futile grouping holds before it doubles
BANDS = 8  # every step, octaves of the interval from MIN_INTERVAL, then MAX_INTERVAL alone
MIN_INTERVAL = 0.001  # no coalesced interval under 1 ms (a lone decode steps every ~0.5 ms)
MAX_INTERVAL = 0.05


def _band(interval: float) -> int:
    """0 for every step, else 1 + the octave of the interval over MIN_INTERVAL (1-2 ms: 1,
    2-4 ms: 2, ..., 32-50 ms: 6), and MAX_INTERVAL alone (BANDS - 1)."""
    if not interval:
        return 0
    if interval >= MAX_INTERVAL:
        return BANDS - 1
    return 1 + min(max(int(math.log2(interval / MIN_INTERVAL) + 1e-9), 0), BANDS - 3)


class Cadence:
    __slots__ = ("rate", "when_late", "current", "mean_lag", "relay", "late_share",
                 "engaged", "judged", "floor", "ceiling", "_seen", "_span", "_weight", "_relay_sum",
                 "_floor_at", "_floor_streams", "_streams", "_est", "_est_at", "cap", "_cap_at")

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
        self.judged: float | None = None  # the relay's mean level over the period just judged
        self.floor = 0.0  # the largest interval found insufficient lately (0: none)
        self.ceiling = 0.0  # the last interval found on time (0: none)
        self._seen: float | None = None  # wall time of the previous wake-up
        self._span = 0.0  # wall s of the current period (each gap at most PERIOD)
        self._weight = 0.0  # ... each gap at most RELAY_FRESH: what the relay's level weighs
        self._relay_sum = 0.0  # the relay's level x that weight, over the period
        self._floor_at = float("-inf")  # wall time the floor was found
        self._floor_streams = 0  # open streams then
        self._streams = 0  # open streams at the last delivery
        self._est = [0.0] * BANDS  # each band's mean pressure, lately (see _band)
        self._est_at = [float("-inf")] * BANDS  # wall time each was last judged
        self.cap = MAX_INTERVAL  # grouping more than this did not help lately
        self._cap_at = float("-inf")  # wall time the cap last moved

    def interval(self, streams: int) -> float:
        """Wall seconds a running stream waits after one update before the next."""
        self._streams = streams
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
        every call); True when the interval changed. `judged` is the relay's mean level
        when this wake-up ended a control period, else None."""
        self.judged = None
        if not self.when_late:
            return False
        lag = min(lag, LAG_CLAMP) if lag > 0 else 0.0  # (NaN: 0)
        seen, self._seen = self._seen, now
        gap = now - seen if seen is not None and now > seen else 0.0
        weight = -math.expm1(-gap / LAG_TAU) if gap else LAG_WEIGHT
        self.mean_lag += (lag - self.mean_lag) * weight
        relay = self.relay
        relay_late = relay > RELAY_LATE
        if gap:
            fresh = min(gap, RELAY_FRESH)
            self.late_share += ((1.0 if relay_late else 0.0) - self.late_share) * \
                -math.expm1(-fresh / SHARE_TAU)
            self._span += min(gap, PERIOD)
            self._weight += fresh
            self._relay_sum += relay * fresh
        if self._span < PERIOD - 1e-9:  # (1e-9: clock rounding)
            return False
        level = self._relay_sum / self._weight
        self._span = self._weight = self._relay_sum = 0.0
        self.judged = level
        pressure = max(level / RELAY_TARGET, self.mean_lag / LATE)
        current = self.current
        band = _band(current)
        here = self._judge(band, pressure, now)
        if self.cap < MAX_INTERVAL and now - self._cap_at > CAP_HOLD:
            self.cap = min(max(2 * self.cap, MIN_INTERVAL), MAX_INTERVAL)  # try one more band
            self._cap_at = now
        if not current:  # off: late now, and for a lasting share of the last ~SHARE_TAU
            if (self.mean_lag > LATE or (pressure > 1.0 and relay_late
                                         and self.late_share >= ENGAGE_SHARE)) \
                    and (self.cap >= MIN_INTERVAL or self._better(1, here, now)) \
                    and not self._futile(1, here, now):
                self.engaged += 1
                self.floor = self.ceiling = 0.0
                return self._change(MIN_INTERVAL)
            return False
        if pressure > 1.0:  # late: multiplicative increase, bracketed by the last on time
            raised = current * min(max(pressure, 1.0 + MARGIN), PRESSURE_CAP)
            if self.ceiling > current:
                raised = min(raised, self.ceiling)
            raised = min(raised, MAX_INTERVAL)
            if raised > self.cap and not self._better(_band(raised), here, now):
                raised = self.cap  # (grouping more than that did not help lately)
            if raised > current and (_band(raised) == band or not self._futile(band + 1, here, now)):
                self.floor, self._floor_at, self._floor_streams = current, now, self._streams
                return self._change(raised)
            # grouping more did not help lately (or may not): lateness grouping does not
            # cure (a busy host rather than a relay behind). Unless grouping less was
            # clearly worse lately, group less, and no more than that band for a while.
            if self._known(band, now) and not (
                    self._known(band - 1, now) and self._est[band - 1] > here + SLACK):
                self.cap = MIN_INTERVAL * 2 ** (band - 1) if band > 1 else 0.0
                self._cap_at = now
                self.floor = 0.0
                return self._lower(min(current, max(self.cap, MIN_INTERVAL)) * (1.0 - DECAY / 2))
            return False
        self.ceiling = current  # on time: a gentle decrease, by the headroom
        lowered = current * (1.0 - DECAY * (1.0 - pressure))
        if self.floor and (now - self._floor_at > FLOOR_HOLD or pressure < RELEASE
                           or self._streams < FLOOR_STREAMS * self._floor_streams):
            self.floor = 0.0  # lapsed (or the load fell): probe lower
        if self.floor:
            lowered = max(lowered, self.floor * (1.0 + MARGIN))
        if lowered >= current:
            return False
        return self._lower(lowered)

    def _judge(self, band: int, pressure: float, now: float) -> float:
        """A period's pressure at `band`, into that band's mean of log pressure (a busy
        host's lateness is heavy-tailed: a geometric mean); the mean."""
        low, high = PRESSURE_RANGE
        pressure = math.log(min(max(pressure, low), high))
        if now - self._est_at[band] > RESPONSE_HOLD:
            self._est[band] = pressure  # (stale: afresh)
        else:
            self._est[band] += (pressure - self._est[band]) * RESPONSE_WEIGHT
        self._est_at[band] = now
        return self._est[band]

    def _known(self, band: int, now: float) -> bool:
        return 0 <= band < BANDS and now - self._est_at[band] <= RESPONSE_HOLD

    def _better(self, band: int, here: float, now: float) -> bool:
        """Grouping up to `band` was judged lately and was clearly less late than here."""
        return self._known(band, now) and self._est[band] <= here - GAIN

    def _futile(self, band: int, here: float, now: float) -> bool:
        """Grouping up to `band` was judged lately and was not less late than here, and no
        band above it was either (a plateau of lateness below a sufficient interval is
        crossed, not given up at)."""
        if not self._known(band, now) or self._better(band, here, now):
            return False
        return not any(self._better(above, here, now) for above in range(band + 1, BANDS))

    def _lower(self, interval: float) -> bool:
        if interval < MIN_INTERVAL:
            self.floor = self.ceiling = 0.0
            interval = 0.0
        return self._change(interval)

    def _change(self, interval: float) -> bool:
        self.current = interval
        return True
