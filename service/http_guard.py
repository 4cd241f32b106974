"""Connection-level timeouts uvicorn lacks: a request's headers must arrive within a deadline.

uvicorn closes idle keep-alive connections, but any byte cancels that timer, so a client that
trickles a header line every few seconds holds a connection (and a file descriptor) forever.
`guarded_protocol(header_timeout_s)` is uvicorn's own HTTP protocol (httptools or h11, as
"auto" picks) with one more timer: armed when a connection opens and after every response,
cancelled once a request's headers are complete, and on expiry it closes the socket.
The body has its own deadline (service/body_limits.py).
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger(__name__)


def guarded_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's auto HTTP protocol class with a header read deadline of `header_timeout_s`."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadlineProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # this request's headers are complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                logger.info("closing a connection whose request headers did not arrive within %g s", header_timeout_s)
                self.transport.close()

    return HeaderDeadlineProtocol
