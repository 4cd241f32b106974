"""Request bodies that cannot stall or crash the daemon: a read deadline, and client disconnects.

    BodyDeadlineMiddleware   the whole body must arrive within service.body_timeout_s of the
                             request's start: a slow trickle or a chunked body announcing 2^64
                             bytes gets 408 and its connection closed
    on_client_disconnect     a client that left mid-body is logged as such (one info line, no
                             traceback) and counted with status 499, never as a 500

The size cap (Content-Length checked before reading, the stream counted while reading) is
`BodyLimitMiddleware` in service/wire.py; this module only adds time.
"""

from __future__ import annotations

import json
import logging
import time

import anyio
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_body

logger = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's "client closed request"; never sent, only counted


class BodyDeadlineError(Exception):
    """The request body did not arrive in time."""


class BodyDeadlineMiddleware:
    """408 (and the connection closed) when the body is not complete within `timeout_s`."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        done = False
        started = False

        async def timed_receive() -> Message:
            nonlocal done
            if done:  # the body is read: later receives wait for a disconnect, without a deadline
                return await receive()
            try:
                with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise BodyDeadlineError from None
            done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed_receive, tracking_send)
        except BodyDeadlineError:
            logger.info("%s %s: body not received within %g s; answered 408 and closed the connection",
                        scope["method"], scope["path"][:100], self.timeout_s)
            if not started:
                await _send_408(send, self.timeout_s)


async def _send_408(send: Send, timeout_s: float) -> None:
    detail = (f"the request body did not arrive within {timeout_s:g} s (service.body_timeout_s); "
              "send it faster or in smaller requests")
    body = json.dumps(error_body(detail, "RequestTimeout")).encode()
    await send({"type": "http.response.start", "status": 408,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


async def on_client_disconnect(request: Request, exc: Exception) -> Response:
    """The client went away before its body was read: nobody to answer; log it as what it is."""
    logger.info("%s %s: client disconnected before its request body was read", request.method, request.url.path[:100])
    return Response(status_code=CLIENT_CLOSED)


def install_disconnect_handler(app: object) -> None:
    from fastapi import FastAPI

    assert isinstance(app, FastAPI)
    app.add_exception_handler(ClientDisconnect, on_client_disconnect)
