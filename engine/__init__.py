"""The engine of inference-lab.

Layers, one direction only:
  specs, catalog, config   what the hardware, the model and the deployment are (pure data)
  cost                     roofline step timing of a batch
  kv, request, scheduler   vLLM-v1-style continuous batching over a KV block pool
  core                     EngineCore: a state machine told the time by its driver
  workload, offline        the offline driver (`inference-lab sim`)
  pacer, service, metrics  the real-time driver and the gRPC service built on it
The first four import no asyncio, grpc or aiohttp and never read a clock.
"""
