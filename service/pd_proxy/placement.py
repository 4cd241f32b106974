"""Which prefill and which decode instance serve a request: the least loaded, unless kvstore's cluster
route says a node already holds the prompt's prefix (then an instance on that node, while its load is
within `max_load_gap` in-flight requests of the least loaded one).

The route is asked of a kvstore daemon (`POST /v1/route`, the daemon's cluster routing), or read from the nodes'
KV events (`--kv-events`, event_index.py), only for prompts
given as token ids and only among prefill instances given a node id (`--prefill NODE_ID=URL`); any failure
of that call is a plain load-based choice. The decode instance is preferred on the node the prefill
instance ran on, where its chunks were just written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import httpx

from service.pd_proxy.metrics import ProxyMetrics
from service.pd_proxy.pool import Instance, InstancePool

logger = logging.getLogger(__name__)


def prefer_node(order: Sequence[Instance], node_id: str | None, max_load_gap: int) -> list[Instance]:
    """`order` (least loaded first) with the instances on `node_id` moved ahead, those within the gap."""
    if node_id is None or not order:
        return list(order)
    limit = order[0].num_in_flight + max_load_gap
    ahead = [i for i in order if i.node_id == node_id and i.num_in_flight <= limit]
    return ahead + [i for i in order if i not in ahead]


def prompt_token_ids(body: dict[str, object]) -> list[int] | None:
    """A completions prompt given as token ids (the only kind the route can hash without a tokenizer)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    return None


class KVStoreRouter:
    """Asks a kvstore daemon's `/v1/route` which node holds the longest cached prefix of a prompt."""

    def __init__(self, client: httpx.AsyncClient, url: str, *, token: str | None, timeout_s: float,
                 metrics: ProxyMetrics) -> None:
        self.client = client
        self.url = url.rstrip("/") + "/v1/route"
        self.headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        self.timeout_s = timeout_s
        self.metrics = metrics

    async def node_for(self, token_ids: list[int], node_ids: list[str]) -> str | None:
        """The node holding a cached prefix of `token_ids` among `node_ids`; None when none does or on failure."""
        try:
            response = await self.client.post(self.url, json={"token_ids": token_ids, "nodes": node_ids},
                                              headers=self.headers, timeout=self.timeout_s)
            response.raise_for_status()
            answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.metrics.count("route_calls", outcome="failed")
            logger.debug("kvstore route failed (%s): choosing by load", exc)
            return None
        self.metrics.count("route_calls", outcome="ok")
        if isinstance(answer, dict) and answer.get("cached_tokens", 0) > 0 and answer.get("node_id") in node_ids:
            return str(answer["node_id"])
        return None


class Router(Protocol):
    """Where a prompt's prefix is cached: KVStoreRouter (the daemon's cluster route) or an EventRouter
    (the nodes' KV events, service/pd_proxy/event_index.py)."""

    async def node_for(self, token_ids: list[int], node_ids: list[str]) -> str | None: ...


class Placement:
    """The order in which to try instances for one request."""

    def __init__(self, prefill: InstancePool, decode: InstancePool, router: Router | None,
                 max_load_gap: int) -> None:
        self.prefill = prefill
        self.decode = decode
        self.router = router
        self.max_load_gap = max_load_gap

    async def prefill_order(self, body: dict[str, object]) -> list[Instance]:
        order = self.prefill.by_load()
        token_ids = prompt_token_ids(body)
        node_ids = sorted({i.node_id for i in order if i.node_id is not None})
        if self.router is None or token_ids is None or not node_ids:
            return order
        return prefer_node(order, await self.router.node_for(token_ids, node_ids), self.max_load_gap)

    def decode_order(self, near_node_id: str | None) -> list[Instance]:
        return prefer_node(self.decode.by_load(), near_node_id, self.max_load_gap)
