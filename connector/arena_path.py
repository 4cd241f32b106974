"""`ArenaPath`: the client side of `shm_plane = "arena"`: the daemon's whole host arena mapped here.

    put: POST /v1/shm/reserve -> copy chunks into the mapped arena -> POST /v1/shm/commit
    get: POST /v1/shm/acquire -> copy slots out of the arena       -> POST /v1/shm/release (in the background)

Every client with the shm right maps the whole arena: one trust domain only (README "Security").
A daemon restart changes its instance id; the next answer naming it maps the new arena.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import httpx
import numpy as np
import torch

from connector.client_segment import Call
from kvstore.errors import KVStoreError, TierFullError

logger = logging.getLogger(__name__)


class ArenaPath:
    """The mapped arena, and the lease releases still on their way to the daemon.

    Args:
        call: the client's msgpack call to the daemon (DaemonHTTP.call).
        shm_name, instance: the arena's shared-memory name and the daemon instance that named it
            (from GET /v1/info); mapped now, so a failure (OSError) is the caller's to report.
    """

    def __init__(self, call: Call, shm_name: str, instance: str) -> None:
        self._call = call
        self._shm: shared_memory.SharedMemory | None = None
        self._arena: torch.Tensor | None = None
        self._instance: str | None = None
        self._releaser = ThreadPoolExecutor(1, thread_name_prefix="kv-release")
        self._releases: deque[Future[None]] = deque()
        self._attach(shm_name, instance)

    def _attach(self, name: str, instance: str) -> None:
        self._detach()
        shm = shared_memory.SharedMemory(name=name)
        # Python < 3.13 registers attached segments with the resource tracker, which would unlink
        # the daemon's arena when this process exits; the daemon owns it.
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        self._shm, self._instance = shm, instance
        self._arena = torch.frombuffer(shm.buf, dtype=torch.uint8)

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

    def put(self, keys: list[bytes], raws: list[torch.Tensor]) -> dict[str, Any]:
        reply = self._call("POST", "/v1/shm/reserve", {"keys": keys})
        grants = reply["grants"]
        ids = [g["id"] for g in grants]
        try:
            arena = self._arena_for(reply)
            for grant, raw in zip(grants, raws, strict=True):
                copy_bytes(arena[grant["offset"]:grant["offset"] + grant["nbytes"]], raw)
        except BaseException:
            self._call("POST", "/v1/shm/abort", {"ids": ids})
            raise
        return self._call("POST", "/v1/shm/commit", {"ids": ids})

    def get(self, keys: list[bytes], views: list[torch.Tensor]) -> list[bool] | None:
        """Found flags, the found chunks copied into `views`; None when this tenant holds its share
        of read leases (the caller copies over HTTP instead)."""
        try:
            reply = self._call("POST", "/v1/shm/acquire", {"keys": keys})
        except TierFullError:
            return None
        leases = reply["leases"]
        ids = [lease["id"] for lease in leases if lease is not None]
        try:
            arena = self._arena_for(reply)
            for lease, view in zip(leases, views, strict=True):
                if lease is not None:
                    copy_bytes(view, arena[lease["offset"]:lease["offset"] + lease["nbytes"]])
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

    def close(self) -> None:
        """Wait for the releases in flight, then unmap."""
        while self._releases:
            self._releases.popleft().result()
        self._releaser.shutdown(wait=True)
        self._detach()


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Byte copy. Host to host with numpy's single-threaded memcpy: torch's intra-op parallel copy
    stalls badly when the engine's cores are busy (measured 0.1 vs 2+ GB/s on a loaded machine)."""
    if dst.device.type == "cpu" and src.device.type == "cpu":
        np.copyto(dst.numpy(), src.numpy())
    else:
        dst.copy_(src)
