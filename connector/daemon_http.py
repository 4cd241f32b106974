"""`DaemonHTTP`: the client's HTTP side of `kvstore serve`: msgpack calls, chunk bytes, the daemon's errors.

    call(method, path, body)        msgpack request and answer; an error status raises its KVStoreError
    put_chunks(keys, raws, layout)  POST /v1/chunks/put, the chunks' bytes in one msgpack body
    get_into(keys, views, nbytes)   POST /v1/chunks/get, found chunks received straight into `views`

`KVStoreClient` (connector/client.py) uses it for every control call, and for the chunk bytes
when no shared memory is mapped (a remote daemon, or a tenant without the shm right).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import httpx
import msgpack
import torch

from connector.lean_http import DaemonUnreachable, LeanHTTP
from kvstore.errors import BadChunkError, KVStoreError, LayoutMismatchError, TierFullError, TierIOError

MSGPACK = "application/msgpack"
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

    def __init__(self, url: str, token: str | None, timeout_s: float) -> None:
        parsed = urllib.parse.urlparse(url)
        headers = {"Accept": MSGPACK, **({"Authorization": f"Bearer {token}"} if token else {})}
        self._lean = LeanHTTP(url, headers, timeout_s)  # control calls, and chunk bytes received into place
        self.is_local = parsed.scheme == "unix" or parsed.hostname in _LOCAL_HOSTS

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        content = None if body is None else msgpack.packb(body, use_bin_type=True)
        answer = self._lean.request(method, path, content, None if body is None else MSGPACK)
        if answer.status >= 400:
            raise error_from(answer.status, answer.content)
        return msgpack.unpackb(answer.content, raw=False) if answer.content else None

    def put_chunks(self, keys: list[bytes], raws: list[torch.Tensor], layout_fingerprint: str) -> dict[str, Any]:
        data = torch.cat(raws).cpu().numpy().data if raws else memoryview(b"")
        return self.call("POST", "/v1/chunks/put", {"keys": keys, "data": data,
                                                    "layout": layout_fingerprint})

    def get_into(self, keys: list[bytes], views: list[torch.Tensor], chunk_bytes: int) -> list[bool]:
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

        answer = self._lean.request("POST", "/v1/chunks/get", msgpack.packb({"keys": keys}), MSGPACK, into=targets,
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
    """The daemon's error (always a JSON {"error", "detail"}) as the matching KVStoreError."""
    text = content.decode("utf-8", "replace")
    try:
        detail = json.loads(text).get("detail", text)
    except (ValueError, AttributeError):
        detail = text[:200]
    cls = _STATUS_ERRORS.get(status)
    return cls(str(detail)) if cls is not None else RemoteError(status, str(detail))
