"""The gateway's one Session with the engine, over either of its two transports.

The Session is one protocol with two transports (docs/architecture.md, "The Session
lane"): `session` holds what both share (routes, outbox, the dispatch of the engine's
batches, the admission copy, read lateness, the hold); `grpc_session` drives it from the
gRPC stream `Session`; `lane` connects to the engine's same-host lane (its hello and
flow-control acknowledgements) and drives it from the socket. Which one a Session takes,
and when a broken one is replaced, is the channel's (gateway.channel).
"""
