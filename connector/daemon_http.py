"""`DaemonHTTP`: the client's HTTP side of `kvstore serve`: msgpack calls, chunk bytes, the daemon's errors.

    call(method, path, body, kind)  a message out, a `kind` message back (msgpack, kvstore/wire_types.py);
                                    an error status raises its KVStoreError
    call_map(method, path)          an answer that is an open map (GET /v1/stats)
    put_chunks(keys, raws, layout)  POST /v1/chunks/put, the chunks' bytes in one msgpack body
    get_into(keys, views, nbytes, layout)  POST /v1/chunks/get, found chunks received straight into `views`

    within(budget_s)                every request this thread makes inside the block ends by then
                                    (enforced at the socket, connector/lean_http.py)

`KVStoreClient` (connector/client.py) uses it for every control call, and for the chunk bytes
when no shared memory is mapped (a remote daemon, or a tenant without the shm right);
`SegmentPath` (connector/segment_path.py) for the shared-memory slot calls.
"""

from __future__ import annotations

import urllib.parse
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import httpx
import msgspec
import torch

from connector.lean_http import DaemonUnreachable, LeanHTTP
from kvstore import wire_types
from kvstore.errors import (
    BadChunkError,
    ConfigError,
    KVStoreError,
    LayoutMismatchError,
    TierFullError,
    TierIOError,
    UnregisteredLayoutError,
)
from kvstore.wire_types import MSGPACK, ErrorAnswer, KeysRequest, Message, PutAnswer, PutRequest, WireError

M = TypeVar("M", bound=Message)
TRANSPORT_ERRORS = (httpx.TransportError, DaemonUnreachable)
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
_STATUS_ERRORS: dict[int, type[KVStoreError]] = {400: BadChunkError, 422: LayoutMismatchError, 429: TierFullError,
                                                 503: TierIOError}


class RemoteError(KVStoreError):
    """The daemon refused a request (auth, tenant rights, quota...); the message is the daemon's."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"kvstore daemon answered {status}: {detail}")
        self.status = status


class DaemonHTTP:
    """Keep-alive HTTP to one daemon ("http://host:port" or "unix:///path"), as one tenant."""

    def __init__(self, url: str, token: str | None, timeout_s: float, *, model: str | None = None) -> None:
        parsed = urllib.parse.urlparse(url)
        headers = {"Accept": MSGPACK, **({"Authorization": f"Bearer {token}"} if token else {})}
        if model is not None:
            try:
                headers[wire_types.MODEL_HEADER] = wire_types.model_header(model)
            except WireError as exc:
                raise ConfigError(f"cannot name the model to the daemon: {exc}") from None
        self._lean = LeanHTTP(url, headers, timeout_s)  # control calls, and chunk bytes received into place
        self.is_local = parsed.scheme == "unix" or parsed.hostname in _LOCAL_HOSTS

    def within(self, budget_s: float) -> AbstractContextManager[None]:
        """Requests this thread makes inside the block end within `budget_s` (else `timeout_s` each)."""
        return self._lean.within(budget_s)

    def left_s(self) -> float:
        """What is left of this thread's deadline (for the descriptor socket, which is not HTTP)."""
        return self._lean.left_s()

    def call(self, method: str, path: str, body: Message | None, kind: type[M]) -> M:
        """`body` (None: no body) out, the answer back as a `kind`; RemoteError when it is not one."""
        try:
            return wire_types.decode(self._exchange(method, path, body), kind)
        except WireError as exc:
            raise RemoteError(200, f"{method} {path} answered something other than a {kind.__name__}: {exc}") from None

    def call_map(self, method: str, path: str) -> dict[str, Any]:
        """An answer that is an open map of counters (GET /v1/stats: its keys follow the daemon's tiers)."""
        answer = msgspec.msgpack.decode(self._exchange(method, path, None))
        if not isinstance(answer, dict):
            raise RemoteError(200, f"{method} {path} answered a {type(answer).__name__}, not a map")
        return answer

    def _exchange(self, method: str, path: str, body: Message | None) -> bytes:
        content = None if body is None else wire_types.encode(body)
        answer = self._lean.request(method, path, content, None if body is None else MSGPACK)
        if answer.status >= 400:
            raise error_from(answer.status, answer.content)
        return answer.content

    def put_chunks(self, keys: list[bytes], raws: list[torch.Tensor], layout_fingerprint: str) -> PutAnswer:
        data = torch.cat(raws).cpu().numpy().data if raws else memoryview(b"")
        return self.call("POST", "/v1/chunks/put", PutRequest(keys=keys, data=data, layout=layout_fingerprint), PutAnswer)

    def get_into(self, keys: list[bytes], views: list[torch.Tensor], chunk_bytes: int,
                 layout_fingerprint: str) -> list[bool]:
        """The found chunks' bytes received straight into the caller's buffers (recv_into; GPU ones
        through one host staging buffer each)."""
        found: list[bool] = []
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []

        def targets(headers: dict[str, str], length: int) -> list[memoryview]:
            found.extend(flag == "1" for flag in headers.get("x-kv-found", ""))
            if len(found) != len(keys):
                raise RemoteError(200, f"batch get answered {len(found)} flags for {len(keys)} keys")
            hosts = []
            for ok, view in zip(found, views, strict=True):
                if ok and view.device.type != "cpu":
                    staged.append((view, torch.empty(chunk_bytes, dtype=torch.uint8)))
                    view = staged[-1][1]
                if ok:
                    hosts.append(view.numpy().data)
            return hosts

        asked = wire_types.encode(KeysRequest(keys=keys, layout=layout_fingerprint))
        answer = self._lean.request("POST", "/v1/chunks/get", asked, MSGPACK, into=targets,
                                    headers={"Accept": "application/octet-stream"})
        if answer.status >= 400:
            raise error_from(answer.status, answer.content)
        if not found:
            raise RemoteError(answer.status, "batch get answered without a body")
        for view, stage in staged:
            view.copy_(stage)
        return found

    def close(self) -> None:
        self._lean.close()


def error_from(status: int, content: bytes) -> KVStoreError:
    """The daemon's error (an ErrorAnswer, always JSON) as the matching KVStoreError."""
    try:
        error = wire_types.decode(content, ErrorAnswer, json=True)
        detail, name = error.detail, error.error
    except WireError:  # not the daemon's (a proxy's page, a cut answer): its start says what it was
        detail, name = content.decode("utf-8", "replace")[:200], ""
    if status == 422 and name == UnregisteredLayoutError.__name__:
        return UnregisteredLayoutError(detail)
    cls = _STATUS_ERRORS.get(status)
    return cls(detail) if cls is not None else RemoteError(status, detail)
