"""Prometheus text exposition: store counters per tier, queue depths, tenants, request latency histograms."""

from __future__ import annotations

import bisect
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
TIER_GAUGES = {"used_bytes", "capacity_bytes", "chunks", "queue_depth"}


class RequestMetrics:
    """Request counts by (route, method, status) and a latency histogram by (route, method)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self._buckets: dict[tuple[str, str], list[int]] = {}
        self._sums: defaultdict[tuple[str, str], float] = defaultdict(float)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            self._counts[(route, method, status)] += 1
            buckets = self._buckets.setdefault((route, method), [0] * (len(BUCKETS_S) + 1))
            buckets[bisect.bisect_left(BUCKETS_S, seconds)] += 1
            self._sums[(route, method)] += seconds

    def lines(self) -> Iterable[str]:
        with self._lock:
            counts, buckets, sums = dict(self._counts), {k: list(v) for k, v in self._buckets.items()}, dict(self._sums)
        yield "# HELP kvstore_http_requests_total HTTP requests by route, method and status."
        yield "# TYPE kvstore_http_requests_total counter"
        for (route, method, status), n in sorted(counts.items()):
            yield f'kvstore_http_requests_total{{route="{route}",method="{method}",status="{status}"}} {n}'
        yield "# HELP kvstore_http_request_duration_seconds Time to answer a request."
        yield "# TYPE kvstore_http_request_duration_seconds histogram"
        for (route, method), counts_per_bucket in sorted(buckets.items()):
            labels = f'route="{route}",method="{method}"'
            running = 0
            for bound, n in zip((*BUCKETS_S, float("inf")), counts_per_bucket, strict=True):
                running += n
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                yield f'kvstore_http_request_duration_seconds_bucket{{{labels},le="{le}"}} {running}'
            yield f"kvstore_http_request_duration_seconds_sum{{{labels}}} {sums[(route, method)]:.6f}"
            yield f"kvstore_http_request_duration_seconds_count{{{labels}}} {running}"


def _name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


def store_lines(stats: Mapping[str, Any]) -> Iterable[str]:
    """The store's `stats()` as metrics: kvstore_tier_<field>{tier=...} and kvstore_<counter>_total."""
    per_field: defaultdict[str, list[tuple[str, float]]] = defaultdict(list)
    for tier, fields in stats.get("tiers", {}).items():
        for field, value in fields.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                per_field[field].append((tier, value))
    for field, values in sorted(per_field.items()):
        gauge = field in TIER_GAUGES
        name = f"kvstore_tier_{_name(field)}" + ("" if gauge else "_total")
        yield f"# HELP {name} {_help(field, per_tier=True)}"
        yield f"# TYPE {name} {'gauge' if gauge else 'counter'}"
        for tier, value in values:
            yield f'{name}{{tier="{tier}"}} {value}'
    for key, value in sorted(stats.items()):
        if key == "tiers" or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        gauge = key == "chunks"
        name = f"kvstore_{_name(key)}" + ("" if gauge else "_total")
        yield f"# HELP {name} {_help(key, per_tier=False)}"
        yield f"# TYPE {name} {'gauge' if gauge else 'counter'}"
        yield f"{name} {value}"


_HELP = {
    "used_bytes": "Bytes the tier holds now.", "capacity_bytes": "Bytes the tier may hold.",
    "chunks": "Chunks held now.", "queue_depth": "Chunks waiting in the tier's background write queue.",
    "hits": "Chunks read from this tier.", "puts": "Chunks stored.", "bytes_read": "Payload bytes read.",
    "bytes_written": "Payload bytes written.", "evictions": "Chunks evicted to make room.",
    "demotions": "Chunks copied down before eviction.", "dropped": "Chunks dropped (no copy kept).",
    "promotions": "Chunks copied up into a faster tier after a read.",
    "corrupt": "Chunks that failed their checksum (dropped, read as a miss).",
    "read_errors": "Reads that failed with an I/O error (read as a miss).",
    "not_replicated": "Chunks a put could not copy to this tier in time.",
    "lost_on_eviction": "Chunks evicted with no copy below.",
    "stored_raw_encoders_busy": "Chunks a codec tier stored raw because every encoder was busy (raw_when_encoder_busy).",
}


def _help(field: str, *, per_tier: bool) -> str:
    """The HELP text of a stats field: a known description, else its name in words."""
    text = _HELP.get(field) or field.replace("_", " ").capitalize() + "."
    return f"{text} By tier." if per_tier else f"{text} Whole store."


def gauge_lines(name: str, help_text: str, values: Mapping[str, float], label: str) -> Iterable[str]:
    yield f"# HELP {name} {help_text}"
    yield f"# TYPE {name} gauge"
    for key, value in sorted(values.items()):
        yield f'{name}{{{label}="{key}"}} {value}'


# ----- memory by component (service/memory_report.py) ----------------------------------------------
def memory_lines(memory: Mapping[str, int]) -> Iterable[str]:
    """kvstore_memory_bytes{component=...} (they sum to the RSS) and kvstore_memory_rss_bytes."""
    yield "# HELP kvstore_memory_bytes Daemon memory by component: host tier, index and per-chunk state, " \
          "buffers and segments, the rest of its RSS."
    yield "# TYPE kvstore_memory_bytes gauge"
    for key, value in memory.items():
        if key != "rss_bytes":
            yield f'kvstore_memory_bytes{{component="{key.removesuffix("_bytes")}"}} {value}'
    yield "# HELP kvstore_memory_rss_bytes Daemon resident set size."
    yield "# TYPE kvstore_memory_rss_bytes gauge"
    yield f"kvstore_memory_rss_bytes {memory.get('rss_bytes', 0)}"
