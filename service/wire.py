"""Wire formats over HTTP: request bodies read as the messages of kvstore/wire_types.py, answers
written in the form the client accepts, chunk keys in paths, and the body size limit.

Structured request bodies are msgpack when Content-Type is application/msgpack (or
application/x-msgpack), JSON otherwise; answers are msgpack when the client's Accept names
msgpack. In msgpack, keys and chunk data travel as raw bytes; in JSON, as hex strings.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstore import wire_types
from kvstore.errors import BadChunkError
from kvstore.hashing import ChunkKey, validate_key
from kvstore.wire_types import MSGPACK, WireError
from service.errors import BadRequestError, PayloadTooLargeError, error_body

logger = logging.getLogger(__name__)

_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")
M = TypeVar("M", bound=wire_types.Message)


def is_msgpack(content_type: str | None) -> bool:
    return any(t in (content_type or "") for t in _MSGPACK_TYPES)


STRUCTURED_LIMIT = 16 << 20  # keys, token ids, ids: far below this; only a put batch carries chunk bytes
OFF_LOOP_BYTES = 256 << 10  # bodies larger than this are decoded on a worker thread


async def read_message(request: Request, kind: type[M], limit: int | None = STRUCTURED_LIMIT) -> M:
    """The request body as a `kind` message, from msgpack or JSON. Raises BadRequestError naming the
    field and the fix, and PayloadTooLargeError (before reading or decoding it) for a body over
    `limit` (None: only the daemon's max_body_bytes applies)."""
    body = await read_body(request, limit)
    content_type = request.headers.get("content-type")
    if len(body) > OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(parse_message, body, content_type, kind)
    return parse_message(body, content_type, kind)


async def read_body(request: Request, limit: int | None) -> bytes:
    """The whole body, refused with 413 as soon as Content-Length or the stream passes `limit`."""
    if limit is None:
        return await request.body()
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"a {declared}-byte body for {request.url.path}; structured bodies are limited to "
                                   f"{limit} bytes: send fewer keys or token ids per request")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise PayloadTooLargeError(f"the body for {request.url.path} is over {limit} bytes; structured bodies "
                                       "are limited to that: send fewer keys or token ids per request")
        parts.append(part)
    return b"".join(parts)


def parse_message(body: bytes, content_type: str | None, kind: type[M]) -> M:
    """A structured body (msgpack when `content_type` says so, else JSON) as a `kind`; BadRequestError otherwise."""
    try:
        return wire_types.decode(body, kind, json=not is_msgpack(content_type))
    except WireError as exc:
        raise BadRequestError(str(exc)) from None


def request_model(request: Request) -> str:
    """The model the request names in MODEL_HEADER (UNNAMED_MODEL without one); BadRequestError when invalid."""
    try:
        return wire_types.model_of_header(request.headers.get(wire_types.MODEL_HEADER))
    except WireError as exc:
        raise BadRequestError(str(exc)) from None


def reply(request: Request, message: wire_types.Message | dict[str, Any], status_code: int = 200) -> Response:
    """msgpack when the client accepts it (bytes stay bytes), else JSON (bytes as hex)."""
    as_json = not is_msgpack(request.headers.get("accept"))
    return Response(wire_types.encode(message, json=as_json), status_code=status_code,
                    media_type="application/json" if as_json else MSGPACK)


def parse_key(value: Any) -> ChunkKey:
    """A 16-byte key from raw bytes or 32 hex characters; a path segment can never hold anything else."""
    try:
        return validate_key(value)
    except BadChunkError:
        raise
    except Exception as exc:
        raise BadChunkError(f"chunk key must be 16 bytes or 32 hex characters, got {type(value).__name__}") from exc


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413, whether Content-Length says so or the stream does."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send, f"body of {declared.decode(errors='replace')[:20]} bytes")
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLargeError(f"streamed body is over the limit of {self.max_bytes} bytes "
                                               "(service.max_body_bytes); split the request into smaller batches")
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLargeError:
            if not started:
                await self._refuse(send, f"streamed body over {self.max_bytes} bytes")

    async def _refuse(self, send: Send, what: str) -> None:
        detail = (f"{what} is over the limit of {self.max_bytes} bytes (service.max_body_bytes); "
                  "split the request into smaller batches")
        body = json.dumps(error_body(detail, "PayloadTooLargeError")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
