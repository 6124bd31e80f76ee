"""The engine of inference-lab (`inference_lab.engine`), one package per layer:

  sim/      the pure simulation core: specs, catalog, config, cost, kv, request,
            decode_group, scheduler, core. Told the time; imports no asyncio, grpc,
            aiohttp or clock.
  drivers/  what owns time: `offline` jumps event to event (`inference-lab sim`);
            `pacer` + `alarm` step the core in wall-clock time.
  fleet/    the replica set (`replicas`), each replica's runtime (`runtime`: its core
            and pacer) and start-up delays (`startup`).
  service/  the gRPC service on the fleet (`rpc`, with `control`, `session`, `refusals`,
            `messages`), its server lifecycle (`server`), Prometheus metrics (`metrics`)
            and the request-decoding guard (`wire_guard`).

Imports point down only: service -> fleet -> drivers -> sim -> inference_lab.common.
The layer contracts in pyproject.toml ([tool.importlinter]) check it.
"""
