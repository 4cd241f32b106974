"""The proxy's counters and gauges, as Prometheus text at /metrics.

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

from service.pd_proxy.pool import InstancePool

HELP = {
    "requests": "Client requests answered, by route and status.",
    "prefill_fallbacks": "Requests decoded without a prefill handoff, by reason.",
    "decode_failures": "Decode calls that failed over to the next decode instance, by kind.",
    "rejected": "Client requests refused by the proxy's limits or auth, by reason.",
    "local_prefills": "Requests sent straight to a decode instance: token-id prompts under --local-prefill-tokens.",
    "route_calls": "Calls to the kvstore daemon's /v1/route, by outcome.",
}


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in pairs)
    return "{" + text + "}" if text else ""


class ProxyMetrics:
    """Counters by name and label set (the proxy's one event loop updates them: no lock)."""

    def __init__(self) -> None:
        self._counts: defaultdict[tuple[str, tuple[tuple[str, str], ...]], int] = defaultdict(int)

    def count(self, name: str, **labels: str) -> None:
        if name not in HELP:
            raise KeyError(f"unknown proxy counter {name!r}; known: {', '.join(HELP)}")
        self._counts[(name, tuple(sorted(labels.items())))] += 1

    def total(self, name: str, **labels: str) -> int:
        """The counter summed over the label sets that contain `labels` (for tests and the bench)."""
        wanted = set(labels.items())
        return sum(n for (k, pairs), n in self._counts.items() if k == name and wanted <= set(pairs))

    def render(self, pools: Iterable[InstancePool], num_in_flight: int) -> str:
        return "\n".join(self._lines(list(pools), num_in_flight)) + "\n"

    def _lines(self, pools: list[InstancePool], num_in_flight: int) -> Iterator[str]:
        for name, text in HELP.items():
            yield f"# HELP kvstore_pd_{name}_total {text}"
            yield f"# TYPE kvstore_pd_{name}_total counter"
            for (key, pairs), n in sorted(self._counts.items()):
                if key == name:
                    yield f"kvstore_pd_{name}_total{_labels(pairs)} {n}"
        yield "# HELP kvstore_pd_in_flight Client requests in flight."
        yield "# TYPE kvstore_pd_in_flight gauge"
        yield f"kvstore_pd_in_flight {num_in_flight}"
        for gauge, text in (("in_flight", "Requests in flight on each instance."),
                            ("healthy", "1 when the instance answered its last health poll or call.")):
            yield f"# HELP kvstore_pd_instance_{gauge} {text}"
            yield f"# TYPE kvstore_pd_instance_{gauge} gauge"
            for pool in pools:
                for i in pool.instances:
                    value = i.num_in_flight if gauge == "in_flight" else int(i.is_healthy)
                    yield f"kvstore_pd_instance_{gauge}{_labels([('role', pool.role.value), ('instance', i.url)])} {value}"
