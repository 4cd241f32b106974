"""The kvstore connector's figures in vLLM's own metrics: its log line ("KV Transfer metrics: ...") and
`vllm serve`'s /metrics (`vllm:kvstore_*` counters). Imports vllm; connector.vllm.vllm_connector uses it.

The worker half counts what it loads and saves and what its store calls cost; vLLM collects a
`KVStoreConnectorStats` from every worker each step, sums them (`aggregate`), logs `reduce()` per
interval and feeds the same data to `KVStorePromMetrics.observe`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine

# name -> what it counts (each a monotone count over the interval; seconds are summed)
COUNTERS = {
    "loaded_chunks": "chunks loaded from kvstore into vLLM's KV cache",
    "failed_chunks": "chunks that could not be loaded (recomputed by vLLM)",
    "loaded_bytes": "bytes loaded from kvstore",
    "load_seconds": "time spent loading (fetch and scatter)",
    "step_loads": "loads run in the step that admitted their request (connector.vllm.load_pacing)",
    "background_loads": "loads run on a loader thread while their request waited",
    "finish_waits": "step ends that waited for the background loads the step started (connector.vllm.finish_wait)",
    "finish_wait_hits": "such waits in which every load ended (their requests run in the next step)",
    "finish_wait_seconds": "time step ends spent waiting for their loads",
    "queued_save_chunks": "chunks gathered and queued for saving",
    "saved_bytes": "bytes queued for saving",
    "save_seconds": "time spent gathering chunks to save (on the step)",
    "handoff_waits": "loads that waited for chunks a prefill instance announced",
    "handoff_wait_seconds": "time loads spent waiting for announced chunks",
    "dropped_save_chunks": "chunks dropped because the save queue was full",
    "load_timeouts": "loads past load_timeout_s",
    "save_timeouts": "saves past save_timeout_s",
    "store_failures": "store calls that failed or timed out",
    "breaker_opened": "times the breaker opened",
}


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    """Counts since the last interval; the data dict crosses from the workers to vLLM's logger."""

    def __post_init__(self) -> None:
        for name in COUNTERS:
            self.data.setdefault(name, 0)

    def reset(self) -> None:
        self.data = dict.fromkeys(COUNTERS, 0.0)

    def add(self, name: str, value: float) -> None:
        self.data[name] = self.data.get(name, 0) + value

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.add(name, value)
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: round(float(v), 4) for k, v in self.data.items()}
        loads = self.data["loaded_chunks"] + self.data["failed_chunks"]
        out["load_hit_rate"] = round(self.data["loaded_chunks"] / loads, 4) if loads else 0.0
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KVStorePromMetrics(KVConnectorPromMetrics):
    """One Prometheus counter per figure: `vllm:kvstore_<name>_total` (per engine)."""

    def __init__(self, vllm_config: VllmConfig, metric_types: dict[type, type], labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            name: create_metric_per_engine(
                self._counter_cls(name=f"vllm:kvstore_{name}", documentation=f"kvstore connector: {doc}",
                                  labelnames=labelnames), per_engine_labelvalues)
            for name, doc in COUNTERS.items()}

    def observe(self, transfer_stats_data: Mapping[str, float], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            if name in self.counters and value:
                self.counters[name][engine_idx].inc(value)
