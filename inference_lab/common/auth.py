"""The one bearer-token check, shared by the gateway's HTTP edge and the engine's gRPC edge.

Knows: the `Authorization: Bearer <secret>` form (scheme in any case) and that secrets are
compared in constant time. Does not know where the header came from.
"""

from __future__ import annotations

import hmac

__all__ = ["bearer_ok"]


def bearer_ok(authorization: str | bytes | None, secret: str | bytes) -> bool:
    """True when `authorization` is `Bearer <secret>`; compared in constant time."""
    if authorization is None:
        return False
    if isinstance(authorization, bytes):
        authorization = authorization.decode("utf-8", "surrogateescape")
    scheme, _, credentials = authorization.partition(" ")
    got = credentials.encode("utf-8", "surrogateescape")
    want = secret if isinstance(secret, bytes) else secret.encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(got, want)
