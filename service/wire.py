"""Wire formats: msgpack or JSON structured bodies, chunk keys as bytes or hex, and the body size limit.

Structured request bodies are msgpack when Content-Type is application/msgpack (or
application/x-msgpack), JSON otherwise; answers are msgpack when the client's Accept names
msgpack. In msgpack, keys and chunk data travel as raw bytes; in JSON, keys are 32-hex strings.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import msgpack
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstore.errors import BadChunkError
from kvstore.hashing import ChunkKey, validate_key
from service.errors import BadRequestError, PayloadTooLargeError, error_body

logger = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")


def is_msgpack(content_type: str | None) -> bool:
    return any(t in (content_type or "") for t in _MSGPACK_TYPES)


STRUCTURED_LIMIT = 16 << 20  # keys, token ids, ids: far below this; only a put batch carries chunk bytes
OFF_LOOP_BYTES = 256 << 10  # bodies larger than this are decoded on a worker thread


async def read_structured(request: Request, limit: int | None = STRUCTURED_LIMIT) -> dict[str, Any]:
    """The request body as a dict, from msgpack or JSON. Raises BadRequestError on anything else and
    PayloadTooLargeError (before reading or decoding it) for a body over `limit` (None: only the
    daemon's max_body_bytes applies)."""
    body = await read_body(request, limit)
    content_type = request.headers.get("content-type")
    if len(body) > OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(parse_structured, body, content_type)  # type: ignore[no-any-return]
    return parse_structured(body, content_type)


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


def parse_structured(body: bytes, content_type: str | None) -> dict[str, Any]:
    """A structured body (msgpack when `content_type` says so, else JSON) as a dict; BadRequestError otherwise."""
    if is_msgpack(content_type):
        try:
            data = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=len(body), max_str_len=len(body))
        except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData) as exc:
            raise BadRequestError(f"body is not valid msgpack: {exc}") from None
        except RecursionError:
            raise BadRequestError("msgpack body is nested too deeply; send a flat map of lists") from None
    else:
        try:
            data = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequestError(f"body is not valid JSON ({exc}); send JSON or Content-Type: {MSGPACK}") from None
        except RecursionError:
            raise BadRequestError("JSON body is nested too deeply; send a flat object of lists") from None
    if not isinstance(data, dict):
        raise BadRequestError(f"body must be a map/object, got {type(data).__name__}")
    return data


def reply(request: Request, data: dict[str, Any], status_code: int = 200) -> Response:
    """msgpack when the client accepts it (bytes stay bytes), else JSON (bytes as hex)."""
    if is_msgpack(request.headers.get("accept")):
        return Response(msgpack.packb(data, use_bin_type=True), status_code=status_code, media_type=MSGPACK)
    return JSONResponse(_jsonable(data), status_code=status_code)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {(k.hex() if isinstance(k, bytes) else k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def parse_key(value: Any) -> ChunkKey:
    """A 16-byte key from raw bytes or 32 hex characters; a path segment can never hold anything else."""
    try:
        return validate_key(value)
    except BadChunkError:
        raise
    except Exception as exc:
        raise BadChunkError(f"chunk key must be 16 bytes or 32 hex characters, got {type(value).__name__}") from exc


def field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequestError(f"field {name!r} must be {names}, got {type(value).__name__}"
                              + (" (missing)" if value is None else ""))
    return value


MAX_LIST_ITEMS = 1 << 20  # no structured list is longer (max_lookup_tokens' default); checked before converting


def key_list(data: dict[str, Any], name: str = "keys") -> list[ChunkKey]:
    keys = field(data, name, list)
    if len(keys) > MAX_LIST_ITEMS:
        raise PayloadTooLargeError(f"{len(keys)} entries in {name!r}; split the request into batches")
    return [parse_key(k) for k in keys]


def id_list(data: dict[str, Any], name: str = "ids") -> list[str]:
    ids = field(data, name, list)
    if not all(isinstance(i, str) for i in ids):
        raise BadRequestError(f"field {name!r} must be a list of id strings")
    return ids


KEYS_SCHEMA = {"type": "array", "maxItems": 64, "items": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}


def openapi_body(schema: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """OpenAPI request body for JSON routes (msgpack with the same fields is accepted too)."""
    json_schema = {"type": "object", "properties": schema, **({"required": required} if required else {})}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": json_schema}}}}


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
