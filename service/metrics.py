"""The daemon's metric families: store counters per tier, queue depths, request latency histograms."""

from __future__ import annotations

import bisect
import itertools
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric

from service.exposition import counter, gauge

logger = logging.getLogger(__name__)

BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
# capacity_bytes is the effective capacity; configured_capacity_bytes the config's (less room at a restart caps it:
# kvstore/capacity_caps.py)
TIER_GAUGES = {"used_bytes", "capacity_bytes", "configured_capacity_bytes", "chunks", "queue_depth"}


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

    def families(self) -> Iterable[Metric]:
        with self._lock:
            counts, buckets, sums = dict(self._counts), {k: list(v) for k, v in self._buckets.items()}, dict(self._sums)
        yield counter("kvstore_http_requests", "HTTP requests by route, method and status.",
                      (((route, method, str(status)), n) for (route, method, status), n in sorted(counts.items())),
                      ("route", "method", "status"))
        histogram = HistogramMetricFamily("kvstore_http_request_duration_seconds", "Time to answer a request.",
                                          labels=["route", "method"])
        for (route, method), per_bucket in sorted(buckets.items()):
            cumulative = list(itertools.accumulate(per_bucket))
            bounds = [*(f"{bound:g}" for bound in BUCKETS_S), "+Inf"]
            histogram.add_metric([route, method], list(zip(bounds, cumulative, strict=True)), sums[(route, method)])
        yield histogram


def store_families(stats: Mapping[str, Any]) -> Iterable[Metric]:
    """The store's `stats()` as metrics: kvstore_tier_<field>{tier=...} and kvstore_<counter>_total."""
    per_field: defaultdict[str, list[tuple[tuple[str], float]]] = defaultdict(list)
    for tier, fields in stats.get("tiers", {}).items():
        for field, value in fields.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                per_field[field].append(((tier,), value))
    for field, values in sorted(per_field.items()):
        make = gauge if field in TIER_GAUGES else counter
        yield make(f"kvstore_tier_{_name(field)}", _help(field, per_tier=True), values, ("tier",))
    for key, value in sorted(stats.items()):
        if key == "tiers" or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        make = gauge if key == "chunks" else counter
        yield make(f"kvstore_{_name(key)}", _help(key, per_tier=False), [((), value)])


def _name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


_HELP = {
    "used_bytes": "Bytes the tier holds now.", "capacity_bytes": "Bytes the tier may hold now (its effective capacity).",
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
    "configured_capacity_bytes": "Bytes the config gives the tier (capacity_bytes is less when the machine had less "
                                 "room at a restart).",
}


def _help(field: str, *, per_tier: bool) -> str:
    """The HELP text of a stats field: a known description, else its name in words."""
    text = _HELP.get(field) or field.replace("_", " ").capitalize() + "."
    return f"{text} By tier." if per_tier else f"{text} Whole store."



# ----- memory by component (service/memory_report.py) ----------------------------------------------
def memory_families(memory: Mapping[str, int]) -> Iterable[Metric]:
    """kvstore_memory_bytes{component=...} (they sum to the RSS) and kvstore_memory_rss_bytes."""
    yield gauge("kvstore_memory_bytes", "Daemon memory by component: host tier, index and per-chunk state, buffers "
                "and segments, the rest of its RSS.",
                (((key.removesuffix("_bytes"),), value) for key, value in memory.items() if key != "rss_bytes"),
                ("component",))
    yield gauge("kvstore_memory_rss_bytes", "Daemon resident set size.", [((), memory.get("rss_bytes", 0))])
