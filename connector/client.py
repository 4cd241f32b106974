"""`KVStoreClient`: the engine side's client of `kvstore serve`, an `EngineStore` (connector/engine_store.py).

    put_many / get_many, in batches the daemon accepts, each over one data path:
      shared memory (local daemon)                  this client's own segments   connector/segment_path.py
      HTTP (remote daemon, or a tenant without shm)  msgpack bodies               connector/daemon_http.py

Every request and answer is a message of kvstore/wire_types.py. The stack from an engine plugin to the
socket is this class, `SegmentPath` (shared memory only), `DaemonHTTP` and `LeanHTTP`: the raw calls
here raise on any failure, and `EngineStore._call` applies the one failure rule (a failed read is a miss,
a failed write is `not_stored` with the reason, bad input raises) and the call's one budget, which
`DaemonHTTP.within` enforces at the socket. A dropped connection is retried once from a small budget
(connector/retry_budget.py) inside that budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from connector.daemon_http import MSGPACK, TRANSPORT_ERRORS, DaemonHTTP, RemoteError
from connector.deadlines import Deadlines
from connector.engine_store import EngineStore
from connector.retry_budget import RetryBudget
from connector.segment_path import SegmentPath, segment_slots
from kvstore.errors import KVStoreError, LayoutMismatchError, UnregisteredLayoutError
from kvstore.hashing import ChunkKey, TokenIds, chunk_keys
from kvstore.kv_scope import KeyScope
from kvstore.layout import KVLayout
from kvstore.types import ChunkStore, PutResult
from kvstore.wire_types import (
    InfoAnswer,
    LayoutSpec,
    LookupAnswer,
    LookupRequest,
    RegisterAnswer,
    RegisterRequest,
    RemovedAnswer,
    RouteAnswer,
    RouteRequest,
)

__all__ = ["MSGPACK", "TRANSPORT_ERRORS", "KVStoreClient", "RemoteError"]
logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class KVStoreClient(EngineStore):
    """A TieredStore look-alike talking to `kvstore serve`.

    Args:
        url: "http://127.0.0.1:8765", or "unix:///path/to.sock" for a unix socket.
        token: the tenant's bearer token (None when the daemon has no auth).
        use_shm: None = shared memory when the daemon is local and offers it; True = require it.
        timeout_s: every call's budget when `deadlines` is None (a client no engine waits on).
        model: the model this client's chunks are for, sent with every request so the daemon's /metrics
            gives hit rates per model (None: counted under "unknown").
        layout: the KV layout the client computes; registered with the daemon under `model` (POST
            /v1/layouts), which then serves it beside other models' layouts (a daemon with no layout in its
            config), or refuses it when its config fixes another. None: the daemon's default layout.
        deadlines: the budget of each kind of call and the breaker's settings (an engine plugin's options);
            None: `Deadlines.patient(timeout_s)`.
        name: names this client in log lines (the engine plugin's).

    Raises:
        ConfigError: `model` is empty or too long to name in a header.
        LayoutMismatchError: the daemon refused `layout` (its message names both layouts and the fix).
    """

    def __init__(self, url: str, *, token: str | None = None, use_shm: bool | None = None,
                 timeout_s: float = 60.0, model: str | None = None, layout: KVLayout | None = None,
                 deadlines: Deadlines | None = None, name: str = "client") -> None:
        super().__init__(deadlines or Deadlines.patient(timeout_s), name)
        self._http = DaemonHTTP(url, token, self.deadlines.control_timeout_s, model=model)
        self.is_local = self._http.is_local
        self.info = self._http.call("GET", "/v1/info", None, InfoAnswer)
        self.layout = KVLayout.from_dict(self.info.layout) if layout is None else layout
        self._registration = None if layout is None else (layout, model)
        self.layout_fingerprint = self.info.layout_fingerprint if layout is None else self._register(layout, model)
        self.root_key: bytes = self.info.root_key
        self.chunk_bytes: int = self.layout.chunk_bytes
        self._max_batch = self.info.max_batch_chunks
        self._max_body = self.info.max_body_bytes
        self._segments: SegmentPath | None = None  # shared memory: staging segment + empty_chunk()'s pool
        self.use_shm = self._init_shm(use_shm, token or "")
        self.retries = RetryBudget()

    def _init_shm(self, use_shm: bool | None, token: str) -> bool:
        if use_shm is False:
            return False
        reason = None if self.info.shm_plane == "segments" else "the daemon offers no shared memory to this tenant"
        reason = reason or (None if self.is_local else "the daemon is not on this host")
        if reason is None:
            try:
                slots = segment_slots(self._max_batch, self.chunk_bytes)
                self._segments = SegmentPath(self._http, token, slots, self.layout, self.layout_fingerprint)
            except (OSError, KVStoreError) as exc:
                reason = f"cannot map the daemon's shared memory: {exc}"
        if reason is not None and use_shm:
            raise KVStoreError(f"shared memory asked for but unavailable: {reason}")
        if reason is not None:
            logger.info("kvstore client: HTTP data path (%s)", reason)
        return reason is None

    def _register(self, layout: KVLayout, model: str | None) -> str:
        """Register `layout` for `model`; the fingerprint that names it in later requests."""
        asked = RegisterRequest(layout=LayoutSpec.of(layout), model=model or "")
        return self._http.call("POST", "/v1/layouts", asked, RegisterAnswer).layout_fingerprint

    def _registered(self, call: Callable[[], _T]) -> _T:
        """`call`, and once more after registering this client's layout again when the daemon no longer serves
        it (a daemon restarted with no disk tier to keep its registrations in)."""
        try:
            return call()
        except UnregisteredLayoutError:
            if self._registration is None:
                raise
            self._register(*self._registration)
            logger.info("kvstore daemon had lost this client's layout (restarted?): registered it again")
            return call()

    # ----- what EngineStore asks of its subclass --------------------------------------------------
    def _within(self, budget_s: float, fn: Callable[..., _T], *args: object) -> _T:
        with self._http.within(budget_s):
            return fn(*args)

    def _span(self, budget_s: float) -> AbstractContextManager[None]:
        return self._http.within(budget_s)

    def _batches(self, n: int) -> list[range]:
        per = max(1, min(self._max_batch, (self._max_body - 4096) // max(1, self.chunk_bytes)))
        if self._segments is not None:
            per = min(per, self._segments.batch_slots())
        return [range(i, min(i + per, n)) for i in range(0, n, per)]

    def _raw(self, chunk: torch.Tensor) -> torch.Tensor:
        if not isinstance(chunk, torch.Tensor) or tuple(chunk.shape) != self.layout.chunk_shape \
                or chunk.dtype != self.layout.torch_dtype:
            got = (tuple(chunk.shape), chunk.dtype) if isinstance(chunk, torch.Tensor) else type(chunk).__name__
            raise LayoutMismatchError(f"chunk is {got}; this client's layout needs {self.layout.chunk_shape} "
                                      f"{self.layout.torch_dtype}")
        return chunk.detach().contiguous().view(torch.uint8).reshape(-1)

    def _out_bytes(self, out: torch.Tensor) -> torch.Tensor:
        if not out.is_contiguous():
            raise LayoutMismatchError(f"output buffers must be contiguous, got strides {out.stride()}")
        self._raw(out)  # shape and dtype check
        return out.view(torch.uint8).reshape(-1)

    def _check_put(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> tuple[list[bytes], list[torch.Tensor]]:
        if len(keys) != len(chunks):
            raise LayoutMismatchError(f"put_many got {len(keys)} keys but {len(chunks)} chunks")
        return self._check_keys(keys), [self._raw(c) for c in chunks]

    def _check_get(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> tuple[list[bytes], list[torch.Tensor]]:
        if len(keys) != len(outs):
            raise LayoutMismatchError(f"get_many got {len(keys)} keys but {len(outs)} output buffers")
        return self._check_keys(keys), [self._out_bytes(out) for out in outs]

    def _lookup_batch(self, keys: list[bytes]) -> int:
        asked = LookupRequest(keys=keys, layout=self.layout_fingerprint)
        return self._registered(lambda: self._http.call("POST", "/v1/lookup", asked, LookupAnswer)).num_chunks

    def _put_batch(self, keys: list[bytes], raws: list[torch.Tensor]) -> PutResult:
        segments = self._segments
        if segments is not None:
            return self.retries.call(lambda: self._registered(lambda: segments.put(keys, raws)))
        return self.retries.call(lambda: self._registered(
            lambda: self._http.put_chunks(keys, raws, self.layout_fingerprint).to_result()))

    def _get_batch(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        segments = self._segments
        if segments is not None:
            return self.retries.call(lambda: self._registered(lambda: segments.get(keys, views)))
        return self.retries.call(lambda: self._registered(
            lambda: self._http.get_into(keys, views, self.chunk_bytes, self.layout_fingerprint)))

    def _remove(self, key: bytes) -> bool:
        return self._http.call("DELETE", f"/v1/chunks/{key.hex()}", None, RemovedAnswer).removed

    def _stats(self) -> dict[str, Any]:
        return self._http.call_map("GET", "/v1/stats")

    def _flush(self, timeout_s: float | None) -> bool:
        return True  # the daemon acknowledges puts once they are on disk

    def _close(self) -> None:
        if self._segments is not None:
            self._segments.close()
        self._http.close()

    # ----- the client's own calls -------------------------------------------------------------------
    def chunk_keys(self, token_ids: TokenIds, scope: KeyScope | None = None) -> list[ChunkKey]:
        root = self.root_key if scope is None else scope.root(self.root_key)
        return chunk_keys(token_ids, root, self.layout.chunk_tokens)

    def route(self, token_ids: TokenIds, nodes: Sequence[str] | None = None) -> RouteAnswer:
        """The cluster node holding the longest cached prefix of `token_ids` (daemon in a cluster); raises
        when the daemon cannot answer within the control budget."""
        body = RouteRequest(keys=self.chunk_keys(token_ids), nodes=list(nodes) if nodes else None,
                            layout=self.layout_fingerprint)
        return self._http.call("POST", "/v1/route", body, RouteAnswer)

    def empty_chunk(self) -> torch.Tensor:
        """An uninitialised chunk buffer for `get_many` / `put_many`. With a shared-memory segment it
        lives in this client's own pool segment, so the daemon copies straight into (or out of) it:
        one copy. Its slot returns to the pool when the tensor is freed; past the pool's size, while the
        pool is being opened (in the background: this never waits for the daemon) or without a segment,
        it is ordinary memory and takes the copy path."""
        chunk = self._segments.take() if self._segments is not None else None
        return chunk if chunk is not None else torch.empty(self.layout.chunk_shape, dtype=self.layout.torch_dtype)

    def __enter__(self) -> KVStoreClient:
        return self


if TYPE_CHECKING:
    def _is_a_chunk_store(client: KVStoreClient) -> ChunkStore:  # mypy checks the contract
        return client
