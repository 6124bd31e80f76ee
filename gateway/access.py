"""Which secret each HTTP route needs, and what a control route refuses besides.

Knows: the routes' access kinds (inference_lab.common.auth `Access`): the control routes
(`/control/*`, vLLM's LoRA load and unload, which change what the engine serves, and its
sleep mode's `/sleep` and `/wake_up`, which make replicas refuse, and its dev mode's
`/pause`, `/resume` and `/reset_prefix_cache`) need the control token
(when none is set, the API key stands in); the rest of `/v1/*` the API key alone (as vLLM
guards `/v1`), and so do vLLM's pooling routes outside it (`/pooling`, `/score`,
`/rerank`, `/v2/rerank`, and `/inference/v1/generate`: they run the engine as `/v1/*`
does, where vLLM leaves them open); everything else is open (probes, scrapers, what a router polls, vLLM's `/tokenize`,
`/detokenize`, `/version`, `/is_sleeping` and `/is_paused`). A control route also answers no browser: a
request that carries an `Origin` header (every cross-origin request has one, and every
POST a browser makes) is refused, and a body must be labelled `application/json` (or
`+json`), which a page cannot send without a preflight (a POST with no body and no label
passes: vLLM's `/sleep` and `/wake_up` take their parameters in the query). One page is
answered: the gateway's own (its dashboard), from its own origin, reached by an address no
DNS can rebind (`same_origin_page`).

Does not know: routes' handlers, the secrets themselves (gateway.middleware checks them).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from inference_lab.common.auth import Access

CONTROL_PREFIX = "/control/"
# vLLM's LoRA routes: under /v1 as in vLLM, but they change the engine's models; its
# sleep mode's /sleep and /wake_up, which free a replica's memory and make it refuse; and
# its dev mode's /pause, /resume (requests aborted or held) and /reset_prefix_cache.
CONTROL_ROUTES = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter",
                            "/sleep", "/wake_up", "/pause", "/resume", "/reset_prefix_cache"})
# vLLM's pooling routes and its tokens-in, tokens-out route outside /v1: the engine's
# work, so the API key's, as /v1/* is.
API_ROUTES = frozenset({"/pooling", "/score", "/rerank", "/v2/rerank", "/inference/v1/generate"})


def route_access(path: str) -> Access:
    """The access of a route (its canonical path, or the request's path when none matched)."""
    if path.startswith(CONTROL_PREFIX) or path in CONTROL_ROUTES:
        return Access.CONTROL
    if path.startswith("/v1/") or path in API_ROUTES:
        return Access.GENERATE
    return Access.OPEN


def json_labelled(content_type: str | None) -> bool:
    """`application/json` or `application/<x>+json` (parameters ignored)."""
    if content_type is None:
        return False
    maintype, _, subtype = content_type.partition(";")[0].strip().lower().partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


def same_origin_page(origin: str, host: str | None, scheme: str,
                     fetch_site: str | None) -> bool:
    """A request from a page of this very origin (`Origin` is the scheme and `Host` the
    request came by), reached by an IP address or `localhost`, which no DNS rebinding can
    give a page: a rebound page's `Host` is its own name. Any other origin, a page of
    another port, an opaque origin (`null`) and a browser's `Sec-Fetch-Site` other than
    `same-origin` are not."""
    if not host or (fetch_site is not None and fetch_site != "same-origin"):
        return False
    if origin.lower() != f"{scheme}://{host}".lower():
        return False
    try:
        name = urlsplit(origin).hostname
    except ValueError:
        return False
    if name is None:
        return False
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
