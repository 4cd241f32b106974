"""The background health poller: every instance's /health, every `interval_s`, each poll bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import httpx

from service.pd_proxy.pool import Instance, InstancePool

logger = logging.getLogger(__name__)


async def poll_once(client: httpx.AsyncClient, instance: Instance, *, timeout_s: float,
                    headers: dict[str, str]) -> None:
    """Set `instance.is_healthy` from one GET /health (200 within `timeout_s`); log a change of state."""
    try:
        response = await client.get(f"{instance.url}/health", timeout=timeout_s, headers=headers)
        is_healthy, why = response.status_code == 200, f"status {response.status_code}"
    except httpx.HTTPError as exc:
        is_healthy, why = False, type(exc).__name__
    if is_healthy != instance.is_healthy:
        if is_healthy:
            logger.info("%s instance %s is healthy again", instance.role.value, instance.url)
        else:
            logger.warning("%s instance %s is unhealthy (%s): skipped until /health answers", instance.role.value,
                           instance.url, why)
    instance.is_healthy = is_healthy


async def poll_forever(client: httpx.AsyncClient, pools: Sequence[InstancePool], *, interval_s: float,
                       timeout_s: float, headers: dict[str, str]) -> None:
    """Poll every instance of `pools` concurrently, then sleep `interval_s`; until cancelled."""
    instances = [i for pool in pools for i in pool.instances]
    while True:
        await asyncio.gather(*(poll_once(client, i, timeout_s=timeout_s, headers=headers) for i in instances))
        await asyncio.sleep(interval_s)
