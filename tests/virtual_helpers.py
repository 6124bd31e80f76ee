"""Small builders shared by the virtual-time tests: a run on a fresh virtual loop,
arrivals sent at their instants, and a replica filled until its queue refuses."""

from __future__ import annotations

import asyncio

from inference_lab.experiments.prompts import Prompt
from inference_lab.experiments.virtual import VirtualBackend, VirtualLoop
from inference_lab.testing.poll import until


def run(coro_fn):
    """Run `coro_fn(loop)` on a fresh virtual loop; (its result, the loop's final time)."""
    with asyncio.Runner(loop_factory=VirtualLoop) as runner:
        loop = runner.get_loop()
        return runner.run(coro_fn(loop)), loop.time()


async def send_at(loop, arrivals, lab):
    """Each (instant, prompt tokens, output tokens) of `arrivals` sent to `lab`'s base port
    at its instant (a virtual sleep: the workload's own schedule); (the results, lab)."""
    backend = VirtualBackend(lab)
    endpoint = backend.endpoint(backend.base_url)
    results = [None] * len(arrivals)

    async def one(i, at, prompt, output):
        await asyncio.sleep(at - loop.time())
        conn = await endpoint.connect()
        results[i] = await conn.send(endpoint.build(Prompt(None, prompt, ""), output, i))

    await asyncio.gather(*(one(i, *a) for i, a in enumerate(arrivals)))
    return results, lab


async def overfill(lab, endpoint, index: int, serial: int = 0) -> list:
    """Three long requests to replica `index` of a lab of max_num_seqs = max_waiting = 1:
    the first admitted (waited for), the second waits, the third is refused at once.
    Their pending results, in order."""
    conns = [await endpoint.connect() for _ in range(3)]
    sent = [conns[0].send(endpoint.build(Prompt(None, 10, ""), 2000, serial))]
    await until(lambda: lab.replicas[index].core.num_running == 1, what="the first admitted")
    sent += [c.send(endpoint.build(Prompt(None, 10, ""), 2000, serial + 1 + i))
             for i, c in enumerate(conns[1:])]
    return sent
