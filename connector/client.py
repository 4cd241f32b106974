"""`KVStoreClient`: the sidecar daemon behind TieredStore's interface (shared memory when local, else HTTP).

    put_many: POST /v1/shm/reserve -> copy chunks into the mapped host arena -> POST /v1/shm/commit
    get_many: POST /v1/shm/acquire -> copy slots out of the arena          -> POST /v1/shm/release
    (remote daemon, or a tenant without shm: the same calls carry the bytes over HTTP in msgpack)

Like the embedded store, a failed read is a miss and an unstorable chunk is reported in
`PutResult.not_stored`: when the daemon is down, lookups and gets miss, puts are not stored,
and the engine recomputes. Bad input (wrong shape, bad key) still raises.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import resource_tracker, shared_memory
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import msgpack
import numpy as np
import torch

from connector.chunk_pool import ChunkPool
from connector.lean_http import DaemonUnreachable, LeanHTTP
from connector.segment_plane import SegmentPlane
from kvstore.errors import BadChunkError, KVStoreError, LayoutMismatchError, TierFullError, TierIOError
from kvstore.hashing import ChunkKey, TokenIds, chunk_keys, validate_key
from kvstore.layout import KVLayout
from kvstore.types import ChunkStore, PutResult

logger = logging.getLogger(__name__)
MSGPACK = "application/msgpack"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


class RemoteError(KVStoreError):
    """The daemon refused a request (auth, tenant rights, quota...); the message is the daemon's."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"kvstore daemon answered {status}: {detail}")
        self.status = status


_T = TypeVar("_T")
SEGMENT_SLOTS = 64  # a client's shared-memory segment: at most this many chunk slots
SEGMENT_BYTES = 256 << 20  # ... and at most this many bytes
TRANSPORT_ERRORS = (httpx.TransportError, DaemonUnreachable)
_STATUS_ERRORS: dict[int, type[KVStoreError]] = {400: BadChunkError, 422: LayoutMismatchError, 429: TierFullError,
                                                 503: TierIOError}


class KVStoreClient:
    """A TieredStore look-alike talking to `kvstore serve`.

    Args:
        url: "http://127.0.0.1:8765", or "unix:///path/to.sock" for a unix socket.
        token: the tenant's bearer token (None when the daemon has no auth).
        use_shm: None = shared memory when the daemon is local and offers it; True = require it.
    """

    def __init__(self, url: str, *, token: str | None = None, use_shm: bool | None = None,
                 timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlparse(url)
        headers = {"Accept": MSGPACK, **({"Authorization": f"Bearer {token}"} if token else {})}
        self._lean = LeanHTTP(url, headers, timeout_s)  # control calls, and chunk bytes received into place
        self.is_local = parsed.scheme == "unix" or parsed.hostname in _LOCAL_HOSTS
        self.info = self._call("GET", "/v1/info")
        self.layout = KVLayout.from_dict(self.info["layout"])
        self.root_key: bytes = self.info["root_key"]
        self.chunk_bytes: int = self.info["chunk_bytes"]
        self._max_batch = int(self.info["max_batch_chunks"])
        self._max_body = int(self.info["max_body_bytes"])
        self._shm: shared_memory.SharedMemory | None = None
        self._arena: torch.Tensor | None = None
        self._instance: str | None = None
        self._releaser = ThreadPoolExecutor(1, thread_name_prefix="kv-release")
        self._releases: deque[Future[None]] = deque()
        self._token = token or ""
        self._segment: SegmentPlane | None = None
        self._pool: ChunkPool | None = None  # empty_chunk()'s buffers, in a second segment of this client
        self._pool_failed = False
        self.use_shm = self._init_shm(use_shm)

    # ----- plumbing -------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        content = None if body is None else msgpack.packb(body, use_bin_type=True)
        answer = self._lean.request(method, path, content, None if body is None else MSGPACK)
        if answer.status >= 400:
            raise _error_from(answer.status, answer.content)
        return msgpack.unpackb(answer.content, raw=False) if answer.content else None

    def _init_shm(self, use_shm: bool | None) -> bool:
        if use_shm is False:
            return False
        name, plane = self.info.get("shm_name"), self.info.get("shm_plane")
        reason = None if plane else "the daemon offers no shared memory to this tenant"
        reason = reason or (None if self.is_local else "the daemon is not on this host")
        if reason is None:
            try:
                if plane == "segments":
                    self._segment = self._open_segment()
                else:
                    self._attach(name, self.info["instance"])
            except (OSError, KVStoreError) as exc:
                reason = f"cannot map the daemon's shared memory: {exc}"
        if reason is not None and use_shm:
            raise KVStoreError(f"shared memory asked for but unavailable: {reason}")
        if reason is not None:
            logger.info("kvstore client: HTTP data path (%s)", reason)
        return reason is None

    def _attach(self, name: str, instance: str) -> None:
        self._detach()
        shm = shared_memory.SharedMemory(name=name)
        # Python < 3.13 registers attached segments with the resource tracker, which would unlink
        # the daemon's arena when this process exits; the daemon owns it.
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        self._shm, self._instance = shm, instance
        self._arena = torch.frombuffer(shm.buf, dtype=torch.uint8)

    def _open_segment(self) -> SegmentPlane:
        slots = max(1, min(self._max_batch, SEGMENT_SLOTS, SEGMENT_BYTES // max(1, self.chunk_bytes)))
        return SegmentPlane.open(self._call, self._token, slots)

    def _segment_plane(self) -> SegmentPlane:
        if self._segment is None:  # dropped after a failure (e.g. the daemon restarted): a new one
            self._segment = self._open_segment()
        return self._segment

    def _on_segment(self, fn: Callable[[SegmentPlane], _T]) -> _T:
        """`fn` on this client's segment; a daemon that no longer knows it (restarted) gets a new one.
        Any other failure drops it too: a timed-out call may still use its slots in the daemon."""
        try:
            return fn(self._segment_plane())
        except RemoteError as exc:
            self._segment = None
            if exc.status != 404:
                raise
            return fn(self._segment_plane())
        except (*TRANSPORT_ERRORS, KVStoreError):
            self._segment = None
            raise

    def _detach(self) -> None:
        if self._shm is not None:
            self._arena = None
            self._shm.close()
            self._shm = None

    def _arena_for(self, reply: dict[str, Any]) -> torch.Tensor:
        """The mapped arena of the daemon instance that answered (maps again after a daemon restart)."""
        if reply["instance"] != self._instance or self._arena is None:
            self._attach(reply["shm_name"], reply["instance"])
        assert self._arena is not None
        return self._arena

    def _batches(self, n: int) -> list[range]:
        per = max(1, min(self._max_batch, (self._max_body - 4096) // max(1, self.chunk_bytes)))
        if self._segment is not None:
            per = min(per, self._segment.slots)
        return [range(i, min(i + per, n)) for i in range(0, n, per)]

    def _raw(self, chunk: torch.Tensor) -> torch.Tensor:
        if not isinstance(chunk, torch.Tensor) or tuple(chunk.shape) != self.layout.chunk_shape \
                or chunk.dtype != self.layout.torch_dtype:
            got = (tuple(chunk.shape), chunk.dtype) if isinstance(chunk, torch.Tensor) else type(chunk).__name__
            raise LayoutMismatchError(f"chunk is {got}; the daemon's layout needs {self.layout.chunk_shape} "
                                      f"{self.layout.torch_dtype}")
        return chunk.detach().contiguous().view(torch.uint8).reshape(-1)

    # ----- TieredStore interface --------------------------------------------------------------
    def chunk_keys(self, token_ids: TokenIds) -> list[ChunkKey]:
        return chunk_keys(token_ids, self.root_key, self.layout.chunk_tokens)

    def route(self, token_ids: TokenIds, nodes: Sequence[str] | None = None) -> dict[str, Any]:
        """The cluster node holding the longest cached prefix of `token_ids` (daemon in a cluster)."""
        body = {"keys": self.chunk_keys(token_ids), "nodes": list(nodes) if nodes else None}
        return self._call("POST", "/v1/route", body)  # type: ignore[no-any-return]

    def lookup(self, token_ids: TokenIds) -> int:
        return self.lookup_keys(self.chunk_keys(token_ids)) * self.layout.chunk_tokens

    def lookup_keys(self, keys: Sequence[ChunkKey]) -> int:
        keys = [validate_key(k) for k in keys]
        hits = 0
        try:
            for batch in self._batches(len(keys)):
                found = self._call("POST", "/v1/lookup", {"keys": keys[batch.start:batch.stop]})["num_chunks"]
                hits += found
                if found < len(batch):
                    break
        except TRANSPORT_ERRORS as exc:
            logger.warning("kvstore daemon unreachable (%s): lookup counts as a miss", exc)
        except TierIOError as exc:  # 503: a backend the lookup had to ask is stalled
            logger.warning("kvstore daemon could not answer the lookup in time (%s): the rest counts as a miss", exc)
        return hits

    def contains(self, key: ChunkKey) -> bool:
        return self.lookup_keys([key]) == 1

    def empty_chunk(self) -> torch.Tensor:
        """An uninitialised chunk buffer for `get_many` / `put_many`. With a shared-memory segment it
        lives in this client's own pool segment, so the daemon copies straight into (or out of) it:
        one copy. Its slot returns to the pool when the tensor is freed; past the pool's size (or
        without a segment) it is ordinary memory and takes the copy path."""
        pool = self._chunk_pool()
        chunk = pool.take() if pool is not None else None
        return chunk if chunk is not None else torch.empty(self.layout.chunk_shape, dtype=self.layout.torch_dtype)

    def _chunk_pool(self) -> ChunkPool | None:
        if self._pool is None and self.use_shm and self.info.get("shm_plane") == "segments" and not self._pool_failed:
            try:
                self._pool = ChunkPool(self._open_segment(), self.layout.chunk_shape, self.layout.torch_dtype)
            except (*TRANSPORT_ERRORS, OSError, KVStoreError) as exc:
                self._pool_failed = True  # e.g. the tenant's segment cap: ordinary buffers from now on
                logger.info("kvstore client: no chunk pool segment (%s); empty_chunk() is ordinary memory", exc)
        return self._pool

    def _pool_slots(self, raws: list[torch.Tensor]) -> list[int | None]:
        """Each buffer's slot in the pool, None for those elsewhere (or a slot already named in the batch)."""
        pool = self._pool
        if pool is None:
            return [None] * len(raws)
        slots: list[int | None] = []
        seen: set[int] = set()
        for raw in raws:
            slot = pool.slot_of(raw)
            slots.append(slot if slot is not None and slot not in seen else None)
            seen.add(slot if slot is not None else -1)
        return slots

    def _pooled(self, fn: Callable[[ChunkPool], _T]) -> _T | None:
        """`fn` on the pool; None when the daemon lost its segment (404). Any failure retires the pool: a
        call that timed out may still run in the daemon (service/abandoned.py) and write into or read
        from its slots later, so those slots are never handed out again."""
        assert self._pool is not None
        try:
            return fn(self._pool)
        except (*TRANSPORT_ERRORS, KVStoreError) as exc:
            self._drop_pool(exc)
            if isinstance(exc, RemoteError) and exc.status == 404:
                return None
            raise

    def _drop_pool(self, exc: Exception) -> None:
        """The pool segment is lost (daemon restarted, idle-reaped) or a call on it failed: its buffers
        take the copy path and its slots are never reused."""
        logger.info("kvstore client: chunk pool retired (%s); a new one serves later empty_chunk() calls", exc)
        if self._pool is not None:
            self._pool.closed = True
        self._pool = None

    def put(self, key: ChunkKey, chunk: torch.Tensor) -> PutResult:
        return self.put_many([key], [chunk])

    def put_many(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> PutResult:
        """Store chunks; acknowledged (in `stored`) only once the daemon has them on disk."""
        if len(keys) != len(chunks):
            raise LayoutMismatchError(f"put_many got {len(keys)} keys but {len(chunks)} chunks")
        keys = [validate_key(k) for k in keys]
        raws = [self._raw(c) for c in chunks]
        result = PutResult()
        for batch in self._batches(len(keys)):
            part_keys, part_raws = keys[batch.start:batch.stop], raws[batch.start:batch.stop]
            try:
                answer = self._put_shm(part_keys, part_raws) if self.use_shm else self._put_http(part_keys, part_raws)
            except (*TRANSPORT_ERRORS, TierFullError, RemoteError) as exc:
                result.not_stored.update(dict.fromkeys(part_keys, f"not stored: {exc}"))
                continue
            result.stored += answer["stored"]
            result.not_stored.update(answer["not_stored"])
            result.not_replicated.update(answer["not_replicated"])
        return result

    def _put_http(self, keys: list[bytes], raws: list[torch.Tensor]) -> dict[str, Any]:
        data = torch.cat(raws).cpu().numpy().data if raws else memoryview(b"")
        return self._call("POST", "/v1/chunks/put", {"keys": keys, "data": data,
                                                     "layout": self.info["layout_fingerprint"]})

    def _put_shm(self, keys: list[bytes], raws: list[torch.Tensor]) -> dict[str, Any]:
        if self.info.get("shm_plane") == "segments":
            return self._put_segments(keys, raws)
        reply = self._call("POST", "/v1/shm/reserve", {"keys": keys})
        grants = reply["grants"]
        ids = [g["id"] for g in grants]
        try:
            arena = self._arena_for(reply)
            for grant, raw in zip(grants, raws, strict=True):
                _copy(arena[grant["offset"]:grant["offset"] + grant["nbytes"]], raw)
        except BaseException:
            self._call("POST", "/v1/shm/abort", {"ids": ids})
            raise
        return self._call("POST", "/v1/shm/commit", {"ids": ids})

    def _put_segments(self, keys: list[bytes], raws: list[torch.Tensor]) -> dict[str, Any]:
        """Chunks in pool slots go without a copy here; the rest through the staging segment."""
        slots = self._pool_slots(raws)
        pooled = [i for i, s in enumerate(slots) if s is not None]
        answer: dict[str, Any] = {"stored": [], "not_stored": {}, "not_replicated": {}}
        if pooled and self._pool is not None:
            part = self._pooled(lambda pool: pool.put([keys[i] for i in pooled], [slots[i] for i in pooled]))  # type: ignore[misc]
            if part is None:
                slots = [None] * len(raws)
            else:
                _merge(answer, part)
        rest = [i for i, s in enumerate(slots) if s is None]
        if rest:
            part_keys, part_raws = [keys[i] for i in rest], [raws[i] for i in rest]
            _merge(answer, self._on_segment(lambda plane: plane.put(part_keys, part_raws)))
        return answer

    def _get_segments(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        """Outs in pool slots are filled by the daemon directly; the rest through the staging segment."""
        slots = self._pool_slots(views)
        found = [False] * len(keys)
        pooled = [i for i, s in enumerate(slots) if s is not None]
        if pooled and self._pool is not None:
            hits = self._pooled(lambda pool: pool.get([keys[i] for i in pooled], [slots[i] for i in pooled]))  # type: ignore[misc]
            if hits is None:
                slots = [None] * len(keys)
            else:
                for i, hit in zip(pooled, hits, strict=True):
                    found[i] = hit
        rest = [i for i, s in enumerate(slots) if s is None]
        if rest:
            part_keys, part_views = [keys[i] for i in rest], [views[i] for i in rest]
            for i, hit in zip(rest, self._on_segment(lambda plane: plane.get(part_keys, part_views)), strict=True):
                found[i] = hit
        return found

    def get(self, key: ChunkKey, out: torch.Tensor) -> bool:
        return self.get_many([key], [out])[0]

    def get_many(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        """Fill each `out` (layout.chunk_shape, any device); False is a miss (also when the daemon is down)."""
        if len(keys) != len(outs):
            raise LayoutMismatchError(f"get_many got {len(keys)} keys but {len(outs)} output buffers")
        keys = [validate_key(k) for k in keys]
        views = [self._out_bytes(out) for out in outs]
        found: list[bool] = []
        for batch in self._batches(len(keys)):
            part_keys, part_views = keys[batch.start:batch.stop], views[batch.start:batch.stop]
            try:
                found += self._get_shm(part_keys, part_views) if self.use_shm else self._get_http(part_keys, part_views)
            except (*TRANSPORT_ERRORS, RemoteError) as exc:
                logger.warning("kvstore daemon read failed (%s): %d chunks count as misses", exc, len(part_keys))
                found += [False] * len(part_keys)
        return found

    def _out_bytes(self, out: torch.Tensor) -> torch.Tensor:
        if not out.is_contiguous():
            raise LayoutMismatchError(f"output buffers must be contiguous, got strides {out.stride()}")
        self._raw(out)  # shape and dtype check
        return out.view(torch.uint8).reshape(-1)

    def _get_http(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
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
                    staged.append((view, torch.empty(self.chunk_bytes, dtype=torch.uint8)))
                    view = staged[-1][1]
                if ok:
                    hosts.append(view.numpy().data)
            return hosts

        answer = self._lean.request("POST", "/v1/chunks/get", msgpack.packb({"keys": keys}), MSGPACK, into=targets,
                                    headers={"Accept": "application/octet-stream"})
        if answer.status >= 400:
            raise _error_from(answer.status, answer.content)
        if not found:
            raise RemoteError(answer.status, "batch get answered without a body")
        for view, stage in staged:
            view.copy_(stage)
        return found

    def _get_shm(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool]:
        if self.info.get("shm_plane") == "segments":
            return self._get_segments(keys, views)
        try:
            reply = self._call("POST", "/v1/shm/acquire", {"keys": keys})
        except TierFullError:  # this tenant holds its share of read leases: copy over HTTP instead
            return self._get_http(keys, views)
        leases = reply["leases"]
        ids = [lease["id"] for lease in leases if lease is not None]
        try:
            arena = self._arena_for(reply)
            for lease, view in zip(leases, views, strict=True):
                if lease is not None:
                    _copy(view, arena[lease["offset"]:lease["offset"] + lease["nbytes"]])
        finally:
            if ids:  # off the caller's path: the copies are done, only the daemon's pins remain
                while self._releases and self._releases[0].done():
                    self._releases.popleft()
                self._releases.append(self._releaser.submit(self._release, ids))
        return [lease is not None for lease in leases]

    def _release(self, ids: list[str]) -> None:
        try:
            self._call("POST", "/v1/shm/release", {"ids": ids})
        except (httpx.TransportError, KVStoreError) as exc:  # the daemon reclaims them after lease_s
            logger.warning("releasing %d leases failed (%s); the daemon expires them", len(ids), exc)

    def _drain_releases(self) -> None:
        while self._releases:
            self._releases.popleft().result()

    def remove(self, key: ChunkKey) -> bool:
        return bool(self._call("DELETE", f"/v1/chunks/{validate_key(key).hex()}")["removed"])

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/v1/stats")  # type: ignore[no-any-return]

    def flush(self, timeout_s: float | None = None) -> bool:
        """Nothing to wait for: the daemon acknowledges puts once they are on disk."""
        return True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        self._drain_releases()
        self._releaser.shutdown(wait=True)
        self._detach()
        self._lean.close()

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Byte copy. Host to host with numpy's single-threaded memcpy: torch's intra-op parallel copy
    stalls badly when the engine's cores are busy (measured 0.1 vs 2+ GB/s on a loaded machine)."""
    if dst.device.type == "cpu" and src.device.type == "cpu":
        np.copyto(dst.numpy(), src.numpy())
    else:
        dst.copy_(src)


def _merge(answer: dict[str, Any], part: dict[str, Any]) -> None:
    answer["stored"] += part["stored"]
    answer["not_stored"].update(part["not_stored"])
    answer["not_replicated"].update(part["not_replicated"])


def _error_from(status: int, content: bytes) -> KVStoreError:
    """The daemon's error (always a JSON {"error", "detail"}) as the matching KVStoreError."""
    text = content.decode("utf-8", "replace")
    try:
        detail = json.loads(text).get("detail", text)
    except (ValueError, AttributeError):
        detail = text[:200]
    cls = _STATUS_ERRORS.get(status)
    return cls(str(detail)) if cls is not None else RemoteError(status, str(detail))


if TYPE_CHECKING:
    def _is_a_chunk_store(client: KVStoreClient) -> ChunkStore:  # mypy checks the contract
        return client
