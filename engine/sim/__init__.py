"""The pure simulation core: what the modelled hardware would do, step by step.

No clock, no asyncio, grpc or aiohttp: a driver tells it the time (`core.EngineCore`).
"""
