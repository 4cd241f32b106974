"""The engine demo: replay an Azure-trace workload through the paged engine without the store, with a
cold store, and with a warm store after an engine restart; print TTFT, ITL and throughput side by side."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from connector.engine.llm_engine import EngineConfig, LLMEngine, TimedRequest
from connector.engine.model import ModelConfig
from connector.engine.scheduler import SchedulerConfig
from connector.engine.workload import WorkloadConfig, build_workload, default_azure_trace, load_azure_conv
from kvstore.config import StoreConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore

logger = logging.getLogger(__name__)

# Sized so prefill dominates on a few CPU cores and a 500-token prompt takes ~0.1 s.
DEMO_MODEL = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=64, seed=0)
PAGE_SIZE = 16
CHUNK_TOKENS = 64


def engine_config(num_blocks: int) -> EngineConfig:
    return EngineConfig(model=DEMO_MODEL, page_size=PAGE_SIZE, num_blocks=num_blocks,
                        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16))


def warm_up(engine: LLMEngine, requests: list[TimedRequest]) -> None:
    """A throwaway engine runs the first requests, so no pass pays first-call costs in its figures."""
    from connector.engine.sequence import SamplingParams

    LLMEngine(engine.config).generate([r.prompt_token_ids for r in requests[:8]], SamplingParams(max_tokens=8))


def replay(label: str, engine: LLMEngine, requests: list[TimedRequest]) -> dict[str, Any]:
    warm_up(engine, requests)
    with tqdm(total=len(requests), desc=f"{label:>22}", unit="req", leave=True) as bar:
        metrics = engine.replay(requests, on_finish=lambda _seq: bar.update(1))
    return metrics.summary()


def run_engine_demo(*, num_requests: int, requests_per_s: float, num_blocks: int, trace: Path | None,
                    store_dir: Path | None, console: Console, sidecar: bool = False) -> dict[str, dict[str, Any]]:
    """Three passes over the same workload; returns each pass's summary."""
    rows = load_azure_conv(trace, num_rows=num_requests)
    requests = build_workload(rows, WorkloadConfig(num_requests=num_requests, requests_per_s=requests_per_s,
                                                   vocab_size=DEMO_MODEL.vocab_size))
    console.print(f"[bold]engine demo[/]: {len(requests)} requests from {(trace or default_azure_trace()).name} over "
                  f"{requests[-1].arrival_s:.1f} s, prompts {min(len(r.prompt_token_ids) for r in requests)}-"
                  f"{max(len(r.prompt_token_ids) for r in requests)} tokens; engine pool "
                  f"{num_blocks} pages x {PAGE_SIZE} tokens; store chunks of {CHUNK_TOKENS} tokens")
    layout = DEMO_MODEL.kv_layout(CHUNK_TOKENS)
    with tempfile.TemporaryDirectory(prefix="kvstore-demo-") as tmp:
        root = store_dir or Path(tmp)
        results = {"no store": replay("no store", LLMEngine(engine_config(num_blocks)), requests)}
        with _open_store(layout, root, sidecar, console) as store:
            results["store (cold)"] = replay("store (cold)", LLMEngine.with_store(engine_config(num_blocks), store), requests)
            restarted = LLMEngine.with_store(engine_config(num_blocks), store)  # fresh pages, same store
            results["store (warm, restart)"] = replay("store (warm, restart)", restarted, requests)
    return results


@contextmanager
def _open_store(layout: KVLayout, root: Path, sidecar: bool, console: Console) -> Iterator[Any]:
    """The embedded store, or a `kvstore serve` daemon on a free loopback port and its client."""
    host_bytes, nvme_bytes = 256 << 20, 1 << 30
    if not sidecar:
        config = StoreConfig.embedded(layout=layout, root_dir=root, model_id="demo-engine",
                                      host_bytes=host_bytes, nvme_bytes=nvme_bytes)
        with TieredStore(config) as store:
            yield store
        return
    from connector.client import KVStoreClient
    from service.process import Daemon, write_config

    config_path = write_config(root, layout=layout, host_chunks=host_bytes // layout.chunk_bytes,
                               nvme_chunks=nvme_bytes // layout.chunk_bytes, service={"lease_s": 30.0})
    # The log lives outside the store's temp dir, so the path printed here still exists after the demo.
    log = Path(tempfile.gettempdir()) / f"kvstore-demo-sidecar-{os.getpid()}.log"
    daemon = Daemon(config_path, log).start()
    console.print(f"sidecar: `kvstore serve` at {daemon.url} (log {log})")
    try:
        with KVStoreClient(daemon.url) as client:
            yield client
        console.print(f"sidecar stopped with exit status {daemon.stop()} (writes drained); its log is kept: {log}")
    finally:
        daemon.close()


def print_results(results: dict[str, dict[str, Any]], console: Console) -> None:
    table = Table(title="engine demo: same arrivals, same weights, same greedy tokens")
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    rows = [("TTFT mean (ms)", "ttft_mean_s", 1e3), ("TTFT P50 (ms)", "ttft_p50_s", 1e3),
            ("TTFT P99 (ms)", "ttft_p99_s", 1e3), ("ITL P50 (ms)", "itl_p50_s", 1e3), ("ITL P99 (ms)", "itl_p99_s", 1e3),
            ("e2e P50 (s)", "e2e_p50_s", 1.0), ("output tokens/s", "output_tokens_per_s", 1.0),
            ("KV hit rate (pool + store)", "kv_hit_rate", 100.0), ("store hit rate", "store_hit_rate", 100.0),
            ("preemptions", "preemptions", 1.0)]
    for label, key, scale in rows:
        table.add_row(label, *(f"{r[key] * scale:.1f}" for r in results.values()))
    console.print(table)
    base, warm = results["no store"], results["store (warm, restart)"]
    console.print(f"mean TTFT with a warm store: {base['ttft_mean_s'] / warm['ttft_mean_s']:.2f} x lower than "
                  f"without; throughput {warm['output_tokens_per_s'] / base['output_tokens_per_s']:.2f} x")
