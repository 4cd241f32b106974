"""`RedisLease`: a named lease held by one owner at a time (SET NX PX), renewed, released safely.

Used to elect the one node that evicts from the shared PFS directory: two nodes evicting at once
would each see the directory over its budget and delete twice as much. The lease is advisory and
time-bounded (no fencing tokens): the holder renews it well within its TTL and stops evicting as
soon as a renewal fails (`lost`). Renew and release are compare-and-set Lua scripts, so an owner
whose lease expired can never extend or delete the next owner's lease.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)

_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class RedisLease:
    """One owner's handle on a lease key.

    Args:
        client: a redis-py client.
        name: the Redis key (use ClusterKeys.pfs_lease for the PFS eviction lease).
        owner: a readable owner name (node id); a random suffix makes each handle's token unique.
        ttl_s: the lease expires this long after the last acquire/renew.
    """

    def __init__(self, client: Any, name: str, owner: str, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ConfigError(f"lease ttl_s must be > 0, got {ttl_s}")
        self.client, self.name, self.owner = client, name, owner
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.token = f"{owner}/{secrets.token_hex(8)}"
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self.lost = threading.Event()

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it. True when this handle now holds it."""
        acquired = bool(self.client.set(self.name, self.token, nx=True, px=self.ttl_ms))
        if acquired:
            self.lost.clear()
        return acquired

    def renew(self) -> bool:
        """Extend the lease to a full TTL; False (and `lost` set) when it is no longer ours."""
        ok = bool(self._renew(keys=[self.name], args=[self.token, self.ttl_ms]))
        if not ok:
            self.lost.set()
        return ok

    def release(self) -> bool:
        """Give the lease up, only if it is still ours. True when it was."""
        return bool(self._release(keys=[self.name], args=[self.token]))

    def holder(self) -> str | None:
        """The token of whoever holds the lease now (None: free)."""
        value = self.client.get(self.name)
        return value.decode() if value is not None else None

    @contextmanager
    def hold(self) -> Iterator[bool]:
        """`with lease.hold() as held:` acquire (without waiting), renew every ttl/3 in the background while
        the block runs, release at the end. Inside, check `lease.lost` between steps and stop when set."""
        if not self.try_acquire():
            yield False
            return
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew_until, args=(stop,), name="kv-lease-renew", daemon=True)
        renewer.start()
        try:
            yield True
        finally:
            stop.set()
            renewer.join()
            try:
                self.release()
            except redis.RedisError as exc:  # it expires on its own
                logger.warning("lease %s: release failed (%s); it expires in %d ms", self.name, exc, self.ttl_ms)

    def _renew_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.ttl_ms / 3000):
            try:
                if not self.renew():
                    logger.warning("lease %s: lost (expired or taken); stopping", self.name)
                    return
            except redis.RedisError as exc:
                self.lost.set()
                logger.warning("lease %s: renewal failed (%s); treating it as lost", self.name, exc)
                return
