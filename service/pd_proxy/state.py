"""What the proxy's routes share: the config, the pools, the HTTP client, placement, counters, admission."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from service.errors import ServiceError
from service.pd_proxy.config import ProxyConfig
from service.pd_proxy.event_index import EventIndex, EventRouter
from service.pd_proxy.metrics import ProxyMetrics
from service.pd_proxy.placement import KVStoreRouter, Placement
from service.pd_proxy.pool import InstancePool, Role


class ProxyBusyError(ServiceError):
    """As many client requests are in flight as `--max-in-flight` allows; retry after a moment."""

    status = 429
    headers = {"Retry-After": "1"}


@dataclass(slots=True)
class Slot:
    """One admitted client request; `release` frees its place (once, however often it is called)."""

    state: ProxyState
    is_released: bool = False

    def release(self) -> None:
        if not self.is_released:
            self.is_released = True
            self.state.num_in_flight -= 1


@dataclass(slots=True)
class ProxyState:
    config: ProxyConfig
    client: httpx.AsyncClient
    prefill: InstancePool
    decode: InstancePool
    placement: Placement
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    num_in_flight: int = 0
    events: EventIndex | None = None  # the nodes' KV events, followed while the proxy runs (close() stops it)

    @classmethod
    def create(cls, config: ProxyConfig, client: httpx.AsyncClient) -> ProxyState:
        metrics = ProxyMetrics()
        prefill, decode = InstancePool(Role.PREFILL, config.prefill), InstancePool(Role.DECODE, config.decode)
        router: KVStoreRouter | EventRouter | None = None
        events = None
        if config.kv_events and config.kvstore_url is not None:
            events = EventIndex(config.kv_events)
            events.start()
            router = EventRouter(events, client, config.kvstore_url, token=config.kvstore_token,
                                 timeout_s=config.route_timeout_s, metrics=metrics)
        elif config.kvstore_url is not None:
            router = KVStoreRouter(client, config.kvstore_url, token=config.kvstore_token,
                                   timeout_s=config.route_timeout_s, metrics=metrics)
        return cls(config, client, prefill, decode, Placement(prefill, decode, router, config.max_load_gap), metrics,
                   events=events)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()

    def admit(self) -> Slot:
        """A place for one client request.

        Raises:
            ProxyBusyError: `max_in_flight` requests are in flight already.
        """
        if self.num_in_flight >= self.config.max_in_flight:
            self.metrics.count("rejected", reason="in_flight_limit")
            raise ProxyBusyError(f"{self.num_in_flight} requests in flight, the proxy's limit "
                                 f"(--max-in-flight {self.config.max_in_flight}); retry shortly or raise the limit")
        self.num_in_flight += 1
        return Slot(self)

    def upstream_headers(self, request_id: str) -> dict[str, str]:
        """Headers of every upstream call: the request id vLLM logs, and the API key vLLM checks."""
        headers = {"X-Request-Id": request_id}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers
