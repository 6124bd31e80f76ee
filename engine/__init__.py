"""The engine of inference-lab (`inference_lab.engine`), one package per layer:

  sim/      the pure simulation core: specs, catalog, config, cost, kv, request,
            decode_group, scheduler, core. Told the time; imports no asyncio, grpc,
            aiohttp or clock.
  drivers/  what owns time: `offline` jumps event to event (`inference-lab sim`);
            `pacer` + `alarm` step the core in wall-clock time.
  service/  the gRPC service on the pacer (`rpc`), its server lifecycle (`server`),
            Prometheus metrics (`metrics`) and the request-decoding guard (`wire_guard`).

Imports point down only: service -> drivers -> sim -> inference_lab.common.
The layer contracts in pyproject.toml ([tool.importlinter]) check it.
"""
