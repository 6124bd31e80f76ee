"""The real-time driver: paces one EngineCore to the wall clock and delivers progress.

Knows the mapping sim time = (wall time - epoch) x time_scale, the step in flight, and the streams
(sinks) waiting for each request's tokens; the arrivals not judged yet wait in
`arrivals.Arrivals`, by instant. Does not know gRPC: sinks are plain objects
with `on_tokens(stream, total)` / `on_finished(stream, request)` / `flush()`.

Rules (docs/architecture.md, "Pacing"):
- No cold-start deficit: an arrival at an idle engine moves the sim clock to the present
  (EngineCore.submit), so the first burst after idle is paced like every other.
- Arrivals are judged in the order of their instants, with every step in between, as the
  offline driver judges them: an arrival is booked at the instant its sender stamped
  (`arrive(arrived=...)`, a time.monotonic() reading of this machine:
  inference_lab.common.clock), after every step that starts before it has been booked and
  before any step that starts after it. So a burst is admitted or refused on the modelled
  queue, not on how fast this host forwarded it.
- The hold: on a bounded queue (max_waiting > 0, where the order decides who is refused),
  a step is decided (booked) only once no arrival before its start can still come. The
  process forwarding arrivals (the gateway) says how far that is (`hold`: the oldest stamp
  among the requests it has read and not yet sent, None when it holds none); until then
  the modelled clock trails the wall clock, at most MAX_TRAIL behind. An
  arrival that comes later than that, or stamped before the step booked last (its start
  was decided without it), is booked late: at the earliest instant the clock can still
  honour, counted (`on_late`, how much later than its stamp) and logged once. A stamp
  from the future is now.
- A step is booked at its start and its tokens are delivered at its end: token counts
  handed out are those of the last step that has *ended* (read from the core at that
  step's progress mark, `due_mark`), never of the step in flight.
- When late, every due step is taken in one wake-up and each stream gets one message
  with all its new tokens; the lag (wall clock minus the instant the wake-up was planned
  for) is measured for every wake-up.
- Every step's tokens go out at the step's end, one update per stream per step (vLLM's
  `--stream-interval 1`). Grouping mid-stream tokens is a last resort, decided by
  `Cadence` (cadence.py): while the pacer or the gateway relaying the tokens stays late it
  sets the smallest interval a running stream waits between updates (its tokens then go
  together) that keeps them on time; `update_rate` N > 0 forces
  a cap of N updates per second across all streams instead. Held updates are counted
  (`on_cadence`). First tokens are never held back, and neither is the token before the
  last: a stream's last token always goes alone with its completion.
- Wake-ups cost the CPU the lab is measuring with, so the pacer wakes at a step's end
  only when that end matters: the step samples a first token or finishes a request, it
  prefills, a waiting request could be admitted at the next step, or a held stream's
  update falls due. Otherwise (a small batch decoding under the update cap) it sleeps
  until the earliest held update, then books the steps it slept through with their own
  start times, so the simulation is the same; only undeliverable wake-ups are skipped.
  An arrival, a cancel or a capacity change wakes it at once (`poke`).
- `time_scale` K runs the modelled clock K times faster than the wall clock (every step
  takes 1/K of its modelled time on the wall); times reported stay modelled. Only the
  sim/wall conversions (`sim_now`, `wall_of`) know K; update intervals stay in wall time,
  since they protect the relaying process's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from inference_lab.engine.drivers.alarm import Alarm
from inference_lab.engine.drivers.arrivals import Arrival, Arrivals
from inference_lab.engine.drivers.delivery import Delivery, Stream
from inference_lab.engine.drivers.lockstep import SAME as SAME_STEP
from inference_lab.engine.drivers.lockstep import Lockstep
from inference_lab.engine.sim.core import (
    EngineCore, HandoffsFull, QueueSaturated, StepResult, SubmitError,
)
from inference_lab.engine.sim.request import Request, Status

log = logging.getLogger(__name__)

__all__ = ["Pacer", "Stream"]


class Pacer(Delivery):
    # How far (wall s) the modelled clock may trail the wall clock while a sender holds
    # it (arrivals it has read and not yet sent), and how far back a stamp is believed:
    # a gateway behind by more than this gets its arrivals booked late.
    MAX_TRAIL = 1.0
    # An arrival booked later than its stamp by more than this (wall s) is logged, once.
    LATE_LOG = 0.001
    # The longest (modelled s) a "full" announcement promises beyond the next step boundary:
    # a hang-up from the batch or a raised cap in that time frees its place that much later.
    FULL_SPAN = 0.02

    def __init__(self, core: EngineCore, *, on_step: Callable[[StepResult], None] | None = None,
                 on_lag: Callable[[float], None] | None = None,
                 on_finished: Callable[[Request, int, float], None] | None = None,
                 on_change: Callable[[], None] | None = None,
                 on_cadence: Callable[[int, float], None] | None = None,
                 on_cadence_period: Callable[[float, float], None] | None = None,
                 on_late: Callable[[float], None] | None = None,
                 hold=None,
                 update_rate: float = 0.0, coalesce_when_late: bool = True,
                 time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.core = core
        self._start_delivery(on_lag=on_lag, on_finished=on_finished, on_change=on_change,
                             on_cadence=on_cadence, on_cadence_period=on_cadence_period,
                             update_rate=update_rate, coalesce_when_late=coalesce_when_late)
        self.time_scale = time_scale  # modelled seconds per wall second
        self.loop = asyncio.get_running_loop()
        # The wall clock: time.monotonic(), not loop.time() (uvloop's counts whole ms).
        self.monotonic = time.monotonic  # arrival stamps are read on it too
        self.epoch = self.monotonic()  # sim time 0
        self._frozen_at: float | None = None  # sim time the clock stopped at (a stall)
        self._frozen_wall = 0.0  # wall time the stall began
        self.inflight: StepResult | None = None
        self.due_mark = 0  # the core's progress mark as of the last step that ended
        self.last_end = -1.0  # sim time at which the last retired step ended
        # No arrival is booked before this sim time: the start of the step booked last
        # (decided without it), the latest arrival booked, or the instant a stall ended.
        self._not_before = 0.0
        self._arrivals = Arrivals()  # not judged yet, by instant
        self._hold = hold  # the senders' hold: `.oldest` (wall s; None when none holds)
        self._on_late = on_late
        self._late_logged = False
        self._trail_logged = False
        self._renew: float | None = None  # sim time to renew a "full" announcement by
        self._wake = asyncio.Event()
        self._stalled = False
        self._target: float | None = None  # sim time the current sleep was planned to end
        self._on_step = on_step
        self._task: asyncio.Task | None = None
        self._alarm = Alarm(self.loop)  # wakes at step ends to the microsecond
        # An MoE model's data-parallel rank steps with its group (engine.drivers.lockstep):
        # set by the service; `on_dummy` is told of each group step this rank sat out.
        self.lockstep: Lockstep | None = None
        self.on_dummy: Callable[[], None] | None = None

    # ---- clock -------------------------------------------------------------------------
    def sim_now(self) -> float:
        if self._frozen_at is not None:
            return self._frozen_at
        return (self.monotonic() - self.epoch) * self.time_scale

    def freeze(self) -> None:
        """A stalled replica: the modelled clock stops; nothing is stepped or delivered
        until `thaw` (arrivals still queue, at the frozen instant)."""
        if self._frozen_at is None:
            self._frozen_at = self.sim_now()
            self._frozen_wall = self.monotonic()
            self.poke()

    def thaw(self) -> None:
        """The clock runs again from where it stopped: every step in flight ends as much
        later on the wall clock as the stall lasted."""
        if self._frozen_at is not None:
            self.epoch += self.monotonic() - self._frozen_wall
            self._not_before = max(self._not_before, self._frozen_at)  # none in the stall
            self._frozen_at = None
            self.poke()

    def wall_of(self, sim_time: float) -> float:
        """The wall time (time.monotonic) at which the sim clock reads `sim_time`."""
        return self.epoch + sim_time / self.time_scale

    def sim_of(self, wall: float) -> float:
        """The sim time the clock reads at wall time `wall` (time.monotonic)."""
        return (wall - self.epoch) * self.time_scale

    def peer_step(self, start: float, end: float) -> None:
        """A peer rank of this MoE model's data-parallel group booked a step [start, end)
        (wall instants): the step in flight that started with it lasts until the later
        end; with none in flight this rank sits the group's step out in a dummy pass, and
        its next step starts no earlier than that end."""
        lockstep = self.lockstep
        if lockstep is None or self._frozen_at is not None:
            return
        new = lockstep.peer(start, end)
        step = self.inflight
        if step is not None:
            if abs(self.wall_of(step.start) - start) <= SAME_STEP and self.sim_of(end) > step.end:
                self.core.hold_until(self.sim_of(end), step)
        elif new:
            at = self.sim_of(start) + SAME_STEP * self.time_scale
            due = None if self._stalled else self.core.next_event_time()
            first = self._arrivals.first()
            if (due is not None and due <= at) or (first is not None and first <= at):
                return  # this rank is due to book its own step at that instant: it joins it
            lockstep.dummy_passes += 1
            if self.on_dummy is not None:
                self.on_dummy()
            self.core.hold_until(self.sim_of(end))

    def _instant(self, stamp: float | None) -> tuple[float, float]:
        """(the stamp as sim time, the instant to book it at) for an arrival its sender
        stamped at `stamp` (this machine's time.monotonic(); None = now): the stamp in
        modelled time, never in the future, at most MAX_TRAIL back. A stalled clock books
        at the instant it stopped."""
        if stamp is None or self._frozen_at is not None:
            now = self.sim_now()
            return now, now
        now = (self.monotonic() - self.epoch) * self.time_scale
        at = (stamp - self.epoch) * self.time_scale
        if not at < now:  # from the future (or NaN): not this clock, or a racing reading
            return now, now
        oldest = now - self.MAX_TRAIL * self.time_scale
        return at, (at if at > oldest else oldest)

    def position(self) -> float:
        """The latest instant the simulation has decided (sim time): the last arrival
        booked or step started."""
        return self._not_before

    def full_until(self) -> float:
        """While the queue is full: the sim time until which it provably stays full, and
        the core is held to it (EngineCore.promise): the next step boundary (the step in
        flight's end, or the next step's start), or later while every running place is
        taken and no finish can free one (at most FULL_SPAN beyond); the position when no
        step is due (idle, or stalled until something changes)."""
        core = self.core
        step = self.inflight
        boundary = step.end if step is not None else (
            None if self._stalled else core.next_event_time())
        if boundary is None:
            return self._not_before
        until = core.full_until(boundary, boundary + self.FULL_SPAN)
        core.promise(until)
        # (past the boundary: a promise to renew, halfway through what is left of it)
        self._renew = until - self.FULL_SPAN / 2 if until > boundary else None
        return until

    def not_full(self) -> None:
        """The queue is not full (any more): no announcement to renew."""
        self._renew = None

    def horizon(self, now: float) -> float:
        """How far the simulation may decide at sim time `now`: now, or while a sender
        holds arrivals it has not sent, the instant of its oldest (at most MAX_TRAIL back).
        Only a bounded queue is held: one without a bound refuses nothing, so no admission
        can depend on the order (an arrival that comes after a step it should have been
        in is booked late, counted, as any arrival the engine cannot wait for). Nor is a
        queue promised full held before the promise ends."""
        holds = self._hold
        hold = holds.oldest if holds is not None else None
        if hold is None or self._frozen_at is not None:
            return now
        core = self.core
        if not core.max_waiting:
            return now
        # A queue promised full (EngineCore.promise) takes no one before the promise ends,
        # whatever arrives meanwhile and in whatever order: steps before then need no wait
        # (the one starting at its end admits: that one does).
        promised = min(math.nextafter(core.admit_after, -math.inf), now)
        held = max((hold - self.epoch) * self.time_scale, promised)
        if held >= now:
            return now
        oldest = now - self.MAX_TRAIL * self.time_scale
        if held < oldest:
            if not self._trail_logged:
                self._trail_logged = True
                log.warning("%s: the gateway holds requests read %.0f ms ago and not yet "
                            "sent: the modelled clock goes on %.1f s behind the wall clock "
                            "and arrivals that come later are booked late; logged once, see "
                            "inference_lab_arrival_booked_late_seconds", self.core.name,
                            (now - held) / self.time_scale * 1e3, self.MAX_TRAIL)
            return oldest
        return held

    # ---- requests ----------------------------------------------------------------------
    def arrive(self, prompt_len: int, max_tokens: int | None, sink, tag, *,
               decided: Callable[[Arrival, Request | None, Exception | None], None],
               priority: int = 0, token_ids: bytes = b"", n: int = 1, lora=None,
               arrived: float | None = None, decide: bool = True, kv=None) -> Arrival:
        """A request that arrived at the stamp `arrived`: judged at its instant (at once
        when the simulation may decide that far, else once it may; with `decide` False
        only at the next `decide`, for a caller that hands over several arrivals at once,
        which must all be in before any is judged), then `decided(arrival,
        req, None)` with the queued Request, or `decided(arrival, None, exc)` with the
        refusal (QueueSaturated / SubmitError). With n > 1 the siblings get streams of their own
        (same sink and tag, their index) when the core spawns them."""
        stamp, at = self._instant(arrived)
        arrival = Arrival(prompt_len, max_tokens, Stream(sink, tag), priority=priority,
                          token_ids=token_ids, n=n, lora=lora, stamp=stamp, at=at,
                          decided=decided, kv=kv)
        self._arrivals.push(arrival)
        if decide:
            self.decide()
        else:
            self.poke()
        return arrival

    def decide(self) -> None:
        """Judge the arrivals the simulation may decide by now (with the steps between
        them), then let the loop deliver what became due."""
        first = self._arrivals.first()
        if first is not None and first <= self.horizon(self.sim_now()):
            self._advance(self.sim_now())  # (what became due, the loop delivers)
        self.poke()

    def submit(self, prompt_len: int, max_tokens: int | None, sink, tag, priority: int = 0,
               token_ids: bytes = b"", n: int = 1, lora=None,
               arrived: float | None = None) -> Request | None:
        """`arrive`, answered synchronously: the Request, or the refusal raised; None when
        it cannot be judged yet (a sender holds the clock)."""
        outcome: list = []
        self.arrive(prompt_len, max_tokens, sink, tag, priority=priority, token_ids=token_ids,
                    n=n, lora=lora, arrived=arrived,
                    decided=lambda arrival, req, exc: outcome.append((req, exc)))
        if not outcome:
            return None
        req, exc = outcome[0]
        if exc is not None:
            raise exc
        return req

    def cancel(self, req: Request, status: Status = Status.FINISHED_CANCELLED) -> bool:
        """Remove a request, every sequence of it, wherever they are; their sink hears
        nothing more of them, and each one's finish is reported (vLLM's `abort`) with the
        tokens delivered by then. False when none was live: finished already, or
        finishing in the step in flight (the sink then still hears their on_finished)."""
        now = self.sim_now()
        cancelled = False
        for member in req.members:
            if self._live.pop(member.id, None) is None:
                continue
            tokens, last = self._delivered(member, now)
            self.core.cancel(member, now, status)
            if self._on_finished:
                self._on_finished(member, tokens, last)
            cancelled = True
        if not cancelled:
            return False
        self.poke()  # capacity freed: a stalled engine may progress
        if self._on_change:
            self._on_change()
        return True

    def open_streams(self) -> int:
        """Requests whose stream has not heard its Finished yet (or their admission)."""
        return len(self._live) + len(self._finishing) + len(self._arrivals)

    def poke(self) -> None:
        """Capacity changed or work arrived: re-evaluate now (also ends a lazy sleep)."""
        self._wake.set()
        self._alarm.wake()

    # ---- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = self.loop.create_task(self._run(), name=f"pacer:{self.core.name}")

    async def stop(self) -> None:
        """Stop pacing and end every live request as aborted (an arrival not yet
        judged hears `decided(None, None)`)."""
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._alarm.close()
        for arrival in self._arrivals.take_all():  # never judged: the engine stopped first
            arrival.decided(arrival, None, None)
        for req in self._due_finished + self._finishing:
            self._finish(req)  # completed in simulation: deliver them whole
        self._due_finished.clear()
        self._finishing.clear()
        self.abort_all()

    def abort_all(self) -> int:
        """End every live request as aborted now (vLLM's abort of in-flight requests: a
        replica put to sleep); each sink hears its Finished with the tokens delivered by
        then. Returns how many there were."""
        live = list(self._live.values())
        for req in live:
            now = self.sim_now()
            ended = self._delivered(req, now)
            self.core.cancel(req, now, Status.FINISHED_ABORTED)
            self._live.pop(req.id, None)
            self._finish(req, ended)
        self._flush()
        if live:
            self.poke()
            if self._on_change:
                self._on_change()
        return len(live)

    async def _run(self) -> None:
        core = self.core
        while True:
            now = self.sim_now()
            if self._target is not None and now >= self._target:
                self._observe_lag((now - self._target) / self.time_scale)  # wall seconds
            self._target = None
            if self._frozen_at is None:
                self._advance(now)
            self._deliver()
            if self._frozen_at is not None or (
                    self.inflight is None and not self._arrivals
                    and (self._stalled or not core.has_work())):
                self._wake.clear()  # (no await since the last look: no poke is lost)
                self._stalled = False
                await self._wake.wait()
                continue
            if self.inflight is not None:
                self._target = self._next_wake()
                await self._alarm.sleep_until_monotonic(self.wall_of(self._target))
                continue
            wake = self._next_event(now)
            if wake is None:
                continue
            self._wake.clear()
            await self._alarm.sleep_until_monotonic(self.wall_of(wake))

    def _next_event(self, now: float) -> float | None:
        """With no step in flight: when something can next be decided (sim time): the
        next step's start once it comes, and, while a sender holds the clock, the instant
        the hold stops counting (MAX_TRAIL) for it or for the earliest held arrival; a
        hold that moves pokes the pacer before that. None when nothing waits."""
        start = None if self._stalled else self.core.next_event_time()
        first = self._arrivals.first()
        if first is not None:
            start = first if start is None or first < start else start
        if start is None:
            return None
        if start > now:
            return start
        held = start + self.MAX_TRAIL * self.time_scale  # held: at most that far behind
        renew = self._renew  # (and a "full" announcement renewed before it lapses)
        return held if renew is None or held <= renew else max(renew, now)

    def _next_wake(self) -> float:
        """The sim time of the next wake-up worth having: the in-flight step's end when
        it matters (see the module's rules), else the earliest held update."""
        step = self.inflight
        if (not self._interval or step.first_token or step.finished or step.prefill_tokens
                or self._finishing):
            return step.end
        core = self.core
        if core.num_waiting and core.num_running < core.max_num_seqs:
            return step.end  # the next step may admit: its first token must be on time
        release = (self._release - self.epoch) * self.time_scale  # as sim time
        if release <= step.end:
            return step.end
        steps = core.steps_to_next_finish()
        if steps is not None:  # wake in time to book the step that finishes the next one
            if release > step.end + (steps - 1) * (step.end - step.start):
                return step.end
        renew = self._renew  # and to renew a "full" announcement before it lapses
        return release if renew is None or release <= renew else max(renew, step.end)

    def _advance(self, now: float) -> None:
        """Book what is due by sim time `now` in the order of its instants: arrivals and
        step starts up to the horizon (what the senders may still send decides that), and
        the ends of steps up to `now` (a step's end changes no queue: its finishes free
        places for the next step's start). Stops with a step in flight, or when nothing
        more may be decided yet. A stalled clock (`freeze`) only queues arrivals."""
        core = self.core
        horizon = self.horizon(now)
        arrivals = self._arrivals
        frozen = self._frozen_at is not None
        while True:
            step = self.inflight
            if step is not None or frozen:
                # arrivals before the step's end join the queue its successor takes
                end = step.end if step is not None else horizon
                while (first := arrivals.first()) is not None and first <= horizon and first <= end:
                    self._judge(arrivals.pop())
                if frozen or step.end > now:
                    return
                self._retire(step)
                self.inflight = None
                continue
            start = None if self._stalled else core.next_event_time()
            first = arrivals.first()
            if first is not None and first <= horizon and (start is None or first <= start):
                self._judge(arrivals.pop())
                self._stalled = False  # a new request: the scheduler may find work again
                continue
            if start is None or start > horizon:
                return
            lockstep = self.lockstep
            if lockstep is not None:
                busy = lockstep.covering(self.wall_of(start))
                if busy is not None:  # inside the group's step: this rank's waits for its end
                    core.hold_until(self.sim_of(busy))
                    continue
            result = core.step(start)
            if result.num_tokens == 0:  # nothing can run until something changes (a host
                self._stalled = not core.transfers_pending()  # load's end is such a change)
                continue  # (arrivals up to the horizon are still judged)
            if lockstep is not None:  # the group's step: as long as its slowest rank's
                wall_start, wall_end = self.wall_of(result.start), self.wall_of(result.end)
                lockstep.announce(wall_start, wall_end)
                aligned = lockstep.aligned_end(wall_start, wall_end)
                if aligned > wall_end:
                    core.hold_until(self.sim_of(aligned), result)
            # The booked step's tokens are not due yet: count as of its start.
            self.due_mark = core.progress_marks()[0]
            self._not_before = result.start
            for sibling in result.spawned:  # n > 1: the sequences beyond the first
                first = sibling.family.members[0].tag
                sibling.tag = Stream(first.sink, first.tag, sibling.index)
                self._live[sibling.id] = sibling
            for req in result.finished:
                if self._live.pop(req.id, None) is not None:
                    self._finishing.append(req)
            self.inflight = result

    def _judge(self, arrival: Arrival) -> None:
        """Queue or refuse one arrival at its instant (or, past that, at the earliest
        instant the clock can still honour: counted as late)."""
        at = arrival.at if arrival.at > self._not_before else self._not_before
        late = (at - arrival.stamp) / self.time_scale
        if late > 0:
            if self._on_late is not None:
                self._on_late(late)
            if late > self.LATE_LOG and not self._late_logged:
                self._late_logged = True
                log.warning("%s: an arrival reached the engine %.1f ms after the instant it "
                            "was stamped with had been decided without it (the host is "
                            "behind): booked that much later; logged once, see "
                            "inference_lab_arrival_booked_late_seconds",
                            self.core.name, late * 1e3)
        self._not_before = at  # (arrivals are booked in order)
        try:
            req = self.core.submit(arrival.prompt_len, arrival.max_tokens, at,
                                   priority=arrival.priority, tag=arrival.tag,
                                   token_ids=arrival.token_ids, n=arrival.n, lora=arrival.lora,
                                   kv=arrival.kv)
        except (QueueSaturated, SubmitError, HandoffsFull) as exc:
            arrival.decided(arrival, None, exc)
            return
        self._live[req.id] = req
        arrival.decided(arrival, req, None)

    def _retire(self, result: StepResult) -> None:
        self.due_mark = self.core.progress_marks()[1]  # the step retired is the latest
        self.last_end = result.end
        self._due_finished.extend(self._finishing)
        self._finishing.clear()
        if self._on_step:
            self._on_step(result)

