"""`PersistenceProbe`: does this Redis persist (AOF or RDB snapshots)? Asked at start, then every minute."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

logger = logging.getLogger(__name__)
RECHECK_S = 60.0


class PersistenceProbe:
    """Only a Redis that persists keeps a copy across its own restart. Asked with CONFIG GET at
    start and again in the background every RECHECK_S (never on the caller's thread: it may hold
    the store's lock). Unknown (CONFIG refused, Redis down) = not durable."""

    def __init__(self, client: Any, url: str) -> None:
        self._client, self._url = client, url
        self._durable = self._ask()
        self._checked_at = time.monotonic()

    @property
    def is_durable(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at > RECHECK_S:
            self._checked_at = now
            threading.Thread(target=self._refresh, name="redis-durability", daemon=True).start()
        return self._durable

    def _refresh(self) -> None:
        self._durable = self._ask()

    def _ask(self) -> bool:
        try:
            aof = self._client.config_get("appendonly").get("appendonly", "no")
            save = self._client.config_get("save").get("save", "")
        except (redis.RedisError, AttributeError, TypeError) as exc:  # refused, down, or a cluster's reply shape
            logger.warning("Redis tier at %s: cannot read its persistence settings (%s); its copies do not "
                           "count as durable", self._url, exc)
            return False
        durable = str(aof).lower() == "yes" or bool(str(save).strip())
        if not durable:
            logger.warning("Redis tier at %s persists nothing (appendonly no, save \"\"): its copies do not count "
                           "as durable; enable AOF (appendonly yes) to make them so", self._url)
        return durable
