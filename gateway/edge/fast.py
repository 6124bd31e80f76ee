"""The edge's fast answers: a read that is exactly one plain request the app answers from
its bytes alone, answered without aiohttp's request, handler task and response objects.

Knows: the two tables an app gives (`FAST_GETS`, `FAST_POSTS`), and which reads each
takes. `fast_get`: exactly one `GET <path> HTTP/1.1` of a FAST_GETS path (a replica port's
/metrics, every 50 ms per scraper) with no query, body, Connection, Expect, Upgrade or
Origin header. `fast_post`: exactly one POST of a FAST_POSTS path (the generation routes'
529 while the model is saturated) with a Content-Length body that is all the rest of the
read and plain headers (each a token name and a visible-ASCII value, none twice, no
Transfer-Encoding, Content-Encoding, Expect, Upgrade or Origin, a Connection header only
as keep-alive, an x-request-id without whitespace). Anything else, and an app's answer of
None, is aiohttp's, from the same bytes.

Does not know: when a connection may be answered this way (gateway.edge.connection: kept
alive, idle, flushed), what the answers say (the app: gateway.generation, gateway.control).
"""

from __future__ import annotations

import re

from aiohttp import web

# GET paths an app answers without aiohttp's request machinery (path -> answer(request_id)
# -> the whole response as a sequence of bytes, or None to let aiohttp handle the request)
FAST_GETS = web.AppKey("fast_gets", dict)
# POST paths an app may answer from the request's headers and body alone (path ->
# answer(headers, body, stamp) -> the whole response as a sequence of bytes, or None to let
# aiohttp handle the request; headers: lower-case name -> value, both bytes, each name once;
# stamp: the request's arrival, time.monotonic())
FAST_POSTS = web.AppKey("fast_posts", dict)

_GET_REFUSED = (b"\r\nconnection:", b"\r\ncontent-length:", b"\r\ntransfer-encoding:",
                b"\r\nexpect:", b"\r\nupgrade:",
                b"\r\norigin:")  # (a browser's request: aiohttp's, for the CORS header)
_POST_REFUSED = frozenset((b"transfer-encoding", b"content-encoding", b"expect", b"upgrade",
                           b"origin"))  # and a Connection header other than keep-alive
# one header line as the fast POST takes it: a token name, visible ASCII in the value
# (inner spaces and tabs allowed, none empty); anything else is aiohttp's to judge
_POST_HEAD_MAX = 4096  # (within aiohttp's 8190-byte line limits: a longer head is its to judge)
_NAME, _VALUE = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+", rb"[!-~](?:[ \t!-~]*[!-~])?"
_HEADER = re.compile(rb"(%s):[ \t]*(%s)[ \t]*\r\n" % (_NAME, _VALUE))
_HEADERS = re.compile(rb"(?:%s:[ \t]*%s[ \t]*\r\n)*" % (_NAME, _VALUE))


def fast_get(data: bytes, gets: dict):
    """A scrape: exactly one GET of a `gets` path with no query, body or Connection
    header; its answer, or None."""
    if not data.endswith(b"\r\n\r\n"):
        return None
    line_end = data.find(b"\r\n")
    if data.find(b"\r\n\r\n") != len(data) - 4 or not data.endswith(b" HTTP/1.1", 0, line_end):
        return None
    answer = gets.get(data[4:line_end - 9])
    if answer is None:
        return None
    head = data[line_end:].lower()
    if any(refused in head for refused in _GET_REFUSED):
        return None
    request_id = None
    at = head.find(b"\r\nx-request-id:")
    if at >= 0:
        start = line_end + at + 15
        request_id = data[start:data.find(b"\r\n", start)].strip()
        if not request_id or not all(33 <= c < 127 for c in request_id):
            return None  # (aiohttp's own rules for anything unusual)
    return answer(request_id)  # its parts


def fast_post(data: bytes, posts: dict, stamp: float | None):
    """Exactly one POST of a `posts` path, HTTP/1.1, plain headers (each a token name and
    a visible-ASCII value, none twice, none of _POST_REFUSED, Connection only as
    keep-alive, which changes nothing in HTTP/1.1's answer, an x-request-id without
    whitespace) and a Content-Length body that is all the rest of `data` (pipelined or
    split requests are aiohttp's); the app's answer (it arrived at `stamp`), or None."""
    line_end = data.find(b"\r\n")
    if line_end < 0 or not data.endswith(b" HTTP/1.1", 0, line_end):
        return None
    answer = posts.get(data[5:line_end - 9])
    if answer is None:
        return None
    head_end = data.find(b"\r\n\r\n")
    if not 0 < head_end <= _POST_HEAD_MAX:
        return None
    block = data[line_end + 2:head_end + 2]
    if _HEADERS.fullmatch(block) is None:
        return None
    pairs = _HEADER.findall(block)
    headers = {name.lower(): value for name, value in pairs}
    if len(headers) != len(pairs) or not _POST_REFUSED.isdisjoint(headers):
        return None
    connection = headers.get(b"connection")  # (httpx, so the openai SDK, sends one)
    if connection is not None and connection.lower() != b"keep-alive":
        return None
    length = headers.get(b"content-length")
    body_at = head_end + 4
    if length is None or not length.isdigit() or int(length) != len(data) - body_at:
        return None
    request_id = headers.get(b"x-request-id")
    if request_id is not None and (b" " in request_id or b"\t" in request_id):
        return None
    return answer(headers, data[body_at:], stamp)
