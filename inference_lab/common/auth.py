"""The bearer-token check and the access rules, shared by the gateway's HTTP edge and the
engine's gRPC edge.

Knows: the `Authorization: Bearer <secret>` form (scheme in any case), that secrets are
compared in constant time, the three kinds of access a route or RPC needs (`Access`), and
which of the lab's two secrets (the API key, the control token) each kind accepts. Does not know where the header came from, nor which
route or RPC is which (gateway.middleware, engine.service.access).

The rules, with either secret unset meaning "no such secret":

- OPEN: anyone (reads for probes and scrapers: health, metrics, capacity and model lists);
- GENERATE: the API key or the control token; open only when neither is set;
- CONTROL: the control token; when none is set, the API key; open only when neither is set.

So a lab with any secret refuses every call that generates or changes state without one.
"""

from __future__ import annotations

import enum
import hmac

__all__ = ["Access", "accepted", "bearer_ok"]


class Access(enum.Enum):
    OPEN = "open"
    GENERATE = "api key"
    CONTROL = "control token"


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


def accepted(access: Access, api_key: str | None, control_token: str | None) -> tuple[str, ...]:
    """The secrets that pass `access` (empty: no check)."""
    if access is Access.OPEN:
        return ()
    if access is Access.CONTROL:
        if control_token:
            return (control_token,)
        return (api_key,) if api_key else ()
    return tuple(secret for secret in (api_key, control_token) if secret)

