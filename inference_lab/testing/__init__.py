"""Scaffolding shared by the tests and the benchmarks (never imported by the lab itself).

- `fake_engine`: `FakeEngine`, a narrow stand-in for the engine's gRPC API.
- `launch`: the real `serve`, `engine` and `gateway` commands as processes on free
  loopback ports (inference_lab.common.ports).
- `poll`: `wait_until` / `until`, polling for effects no event announces.

It sits on top of the import-linter layers (it may import every layer; nothing imports
it), so tests and `benchmarks/` share one copy of each helper (docs/architecture.md).
"""
