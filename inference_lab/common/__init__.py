"""What both services and the command line share, and nothing else: TOML reading with
errors that name the key (`toml`), workload and length distributions (`workload`), the
bearer-token check (`auth`). Imports no engine, gateway, asyncio, grpc or aiohttp."""
