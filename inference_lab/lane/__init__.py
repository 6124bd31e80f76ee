"""The Session lane's wire: length-prefixed frames over a plain stream socket.

The engine and a gateway on the same host carry their Session (the same protobuf
messages as the gRPC stream) over a socket instead of gRPC: each message is one frame, a
4-byte big-endian length and that many bytes. `frames` parses them in `data_received`
and hands each to a synchronous callback, with no task or queue per message (grpc.aio's
per-message cost, and its poller thread's hop, is what this skips: BENCHMARKS.md, "Session
lane").

Knows bytes and asyncio transports only: not protobuf, gRPC, the engine or the gateway
(both import it; it imports neither).
"""
