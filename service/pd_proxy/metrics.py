"""The proxy's counters and gauges, as Prometheus text at /metrics (through prometheus_client).

    kvstore_pd_requests_total{route,status}          client requests answered
    kvstore_pd_prefill_fallbacks_total{reason}       requests decoded without a handoff (the decode
                                                     instance computed the prompt): unreachable, timeout,
                                                     status, no_handoff, no_prefill
    kvstore_pd_decode_failures_total{kind}           decode calls that failed over to the next instance
    kvstore_pd_rejected_total{reason}                in_flight_limit (429), body_too_large (413), auth (401)
    kvstore_pd_local_prefills_total                  prompts under --local-prefill-tokens, never sent to prefill
    kvstore_pd_route_calls_total{outcome}            kvstore /v1/route calls: ok, failed
    kvstore_pd_in_flight                             client requests in flight now
    kvstore_pd_instance_in_flight{role,instance}     requests in flight on each upstream instance
    kvstore_pd_instance_healthy{role,instance}       1 when its last /health poll (or call) succeeded
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric

from service.exposition import counter, gauge, render
from service.pd_proxy.pool import InstancePool

HELP = {  # name: (help text, label names)
    "requests": ("Client requests answered, by route and status.", ("route", "status")),
    "prefill_fallbacks": ("Requests decoded without a prefill handoff, by reason.", ("reason",)),
    "decode_failures": ("Decode calls that failed over to the next decode instance, by kind.", ("kind",)),
    "rejected": ("Client requests refused by the proxy's limits or auth, by reason.", ("reason",)),
    "local_prefills": ("Requests sent straight to a decode instance: token-id prompts under --local-prefill-tokens.",
                       ()),
    "route_calls": ("Calls to the kvstore daemon's /v1/route, by outcome.", ("outcome",)),
}


class ProxyMetrics:
    """Counters by name and label set (the proxy's one event loop updates them: no lock)."""

    def __init__(self) -> None:
        self._counts: defaultdict[tuple[str, tuple[tuple[str, str], ...]], int] = defaultdict(int)

    def count(self, name: str, **labels: str) -> None:
        if name not in HELP:
            raise KeyError(f"unknown proxy counter {name!r}; known: {', '.join(HELP)}")
        label_names = HELP[name][1]
        if tuple(labels) != label_names:
            raise KeyError(f"proxy counter {name!r} takes the labels {label_names}, not {tuple(labels)}")
        self._counts[(name, tuple(labels.items()))] += 1

    def total(self, name: str, **labels: str) -> int:
        """The counter summed over the label sets that contain `labels` (for tests and the bench)."""
        wanted = set(labels.items())
        return sum(n for (k, pairs), n in self._counts.items() if k == name and wanted <= set(pairs))

    def render(self, pools: Iterable[InstancePool], num_in_flight: int) -> bytes:
        return render(self._families(list(pools), num_in_flight))

    def _families(self, pools: list[InstancePool], num_in_flight: int) -> Iterator[Metric]:
        for name, (text, label_names) in HELP.items():
            rows = sorted((pairs, n) for (key, pairs), n in self._counts.items() if key == name)
            yield counter(f"kvstore_pd_{name}", text, (([v for _, v in pairs], n) for pairs, n in rows), label_names)
        yield gauge("kvstore_pd_in_flight", "Client requests in flight.", [((), num_in_flight)])
        instances = [(pool.role.value, i) for pool in pools for i in pool.instances]
        yield gauge("kvstore_pd_instance_in_flight", "Requests in flight on each instance.",
                    (((role, i.url), i.num_in_flight) for role, i in instances), ("role", "instance"))
        yield gauge("kvstore_pd_instance_healthy", "1 when the instance answered its last health poll or call.",
                    (((role, i.url), int(i.is_healthy)) for role, i in instances), ("role", "instance"))
