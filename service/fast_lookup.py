"""`FastLookupMiddleware`: POST /v1/lookup answered without FastAPI's per-request machinery.

Lookups are the one call an engine makes for every request, on its time-to-first-token path, at
hundreds per second per node. Routing, dependency solving and Request/Response objects cost the
daemon more CPU than the lookup itself, and on a busy node that CPU is what the tail waits for
(daemon CPU per 8-key lookup, measured on loopback: 286 us through the route, 162 us here; 124 us
once the client sent each request in one packet, connector/lean_http.py). This middleware answers the common case directly: an msgpack body and msgpack answer, a
known bearer token (or no auth configured). The answer is computed by the same `lookup_answer`
the route uses.

Everything else (no or unknown token, JSON, a malformed or oversized body, a lookup that raises)
goes to the FastAPI route with the body replayed, so errors and their messages live in one place
and OpenAPI still documents the route.
"""

from __future__ import annotations

import logging

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstore import wire_types
from kvstore.wire_types import MODEL_HEADER, MSGPACK, UNNAMED_MODEL, LookupRequest
from service.auth import tenant_of_header
from service.routes_data import lookup_answer
from service.runtime import Runtime
from service.wire import is_msgpack

logger = logging.getLogger(__name__)

LOOKUP_PATH = "/v1/lookup"
_MODEL = MODEL_HEADER.lower().encode()
MAX_FAST_BODY = 1 << 20  # a lookup body is ~20 bytes per key; larger ones take the route (and its limits)


class FastLookupMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._route: BaseRoute | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != LOOKUP_PATH:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rt = getattr(scope["app"].state, "runtime", None)  # None until started: the route answers then
        tenant = tenant_of_header(rt.tenants, _text(headers, b"authorization")) if isinstance(rt, Runtime) else None
        if rt is None or tenant is None or not is_msgpack(_text(headers, b"content-type")) or not is_msgpack(_text(headers, b"accept")):
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        if body is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            model = wire_types.model_of_header(headers[_MODEL].decode("latin-1")) if _MODEL in headers else UNNAMED_MODEL
            answer = await lookup_answer(rt, tenant, wire_types.decode(body, LookupRequest), model)
        except Exception:  # the route gives the error its status and message
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = self._lookup_route(scope)  # for TimingMiddleware's per-route latency
        payload = wire_types.encode(answer)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", MSGPACK.encode()), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        rt.fast_lookups += 1  # in /v1/stats: lookups answered here rather than by the route
        tenant.fast_lookups += 1

    def _lookup_route(self, scope: Scope) -> BaseRoute | None:
        if self._route is None:
            self._route = next((r for r in scope["app"].routes if getattr(r, "path", None) == LOOKUP_PATH), None)
        return self._route


def _text(headers: dict[bytes, bytes], name: bytes) -> str:
    return headers.get(name, b"").decode("latin-1")


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages and whole body; body None when it is over MAX_FAST_BODY or the client left."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > MAX_FAST_BODY:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands back the messages already read, then the rest of the stream."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
