"""The gateway's connections before there is a request: one module per concern.

- `connection`: the edge's connection (`EdgeRequestHandler`, built on aiohttp's through
  gateway.aiohttp_gate, which alone touches aiohttp's private state) putting the concerns
  below together, its JSON answers to what aiohttp's HTTP parser refuses (from the one
  error table, gateway.errors), and `runner`, which serves it only while the gate's fast
  paths are on;
- `reading`: how long a client may take to send (the header deadline, a 408 and the
  connection closed; `read_body`'s body deadline, and bad framing inside a body as a 400);
- `sending`: how long a client may take to read (the send deadline under back-pressure);
- `arrivals`: when a request arrived (`arrival_stamp`, from the kernel's receive stamps
  where the listener gives them, gateway.stamps) and the backlog's marks of the generation
  requests read (`ARRIVALS`, gateway.backlog);
- `fast`: the reads answered without aiohttp's request objects (`FAST_GETS`: a replica
  port's /metrics; `FAST_POSTS`: the generation routes' 529 while saturated).

With the fast paths off (gateway.aiohttp_gate) `runner` is aiohttp's own AppRunner: no
JSON answers to malformed HTTP, no header or send deadline, no receive stamps, fast
answers or backlog marks; `read_body` and `arrival_stamp` (the handler's read instant)
work the same under any server.

Does not know: routes or the engine (gateway.app).
"""

from inference_lab.gateway.edge.arrivals import ARRIVALS, arrival_stamp
from inference_lab.gateway.edge.connection import EdgeRequestHandler, runner
from inference_lab.gateway.edge.fast import FAST_GETS, FAST_POSTS
from inference_lab.gateway.edge.reading import DEFAULT_HEADER_TIMEOUT_S, read_body

__all__ = ["ARRIVALS", "DEFAULT_HEADER_TIMEOUT_S", "EdgeRequestHandler", "FAST_GETS",
           "FAST_POSTS", "arrival_stamp", "read_body", "runner"]
