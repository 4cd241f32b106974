"""The engine demo: replay an Azure-trace workload through the paged engine without the store, with a
cold store, and with a warm store after an engine restart; print TTFT, ITL and throughput side by side."""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from connector.engine.llm_engine import EngineConfig, LLMEngine, TimedRequest
from connector.engine.model import ModelConfig
from connector.engine.scheduler import SchedulerConfig
from connector.engine.workload import WorkloadConfig, build_workload, default_azure_trace, load_azure_conv
from kvstore.config import StoreConfig
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import ChunkStore
from kvstore.units import format_bytes

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


def replay(label: str, engine: LLMEngine, requests: list[TimedRequest]) -> dict[str, float]:
    warm_up(engine, requests)
    with tqdm(total=len(requests), desc=f"{label:>22}", unit="req", leave=True) as bar:
        metrics = engine.replay(requests, on_finish=lambda _seq: bar.update(1))
    return metrics.summary()


PASSES = ("no store", "store (cold)", "store (warm, restart)")
Round = dict[str, dict[str, float]]  # pass name -> that pass's summary


def model_line() -> str:
    m = DEMO_MODEL
    return (f"model: a Llama-style decoder with random weights (seed {m.seed}), {m.num_layers} layers, hidden "
            f"{m.hidden_size}, {m.num_heads} heads / {m.num_kv_heads} KV heads, vocab {m.vocab_size}: "
            f"{m.num_parameters / 1e6:.2f} M parameters, {format_bytes(m.weight_bytes)} in {m.dtype}")


def run_engine_demo(*, num_requests: int, requests_per_s: float, num_blocks: int, trace: Path | None,
                    store_dir: Path | None, console: Console, sidecar: bool = False, rounds: int = 1) -> list[Round]:
    """`rounds` rounds of the three passes over the same workload, each round on a fresh store; returns
    each round's summaries. The no-store pass runs first in odd rounds and last in even ones, so a
    machine that slows down or speeds up during the demo does not favour one side."""
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    rows = load_azure_conv(trace, num_rows=num_requests)
    requests = build_workload(rows, WorkloadConfig(num_requests=num_requests, requests_per_s=requests_per_s,
                                                   vocab_size=DEMO_MODEL.vocab_size))
    console.print(f"[bold]engine demo[/]: {len(requests)} requests from {(trace or default_azure_trace()).name} over "
                  f"{requests[-1].arrival_s:.1f} s, prompts {min(len(r.prompt_token_ids) for r in requests)}-"
                  f"{max(len(r.prompt_token_ids) for r in requests)} tokens; engine pool "
                  f"{num_blocks} pages x {PAGE_SIZE} tokens; store chunks of {CHUNK_TOKENS} tokens; {rounds} round(s)")
    console.print(model_line())
    layout = DEMO_MODEL.kv_layout(CHUNK_TOKENS)
    results: list[Round] = []
    for index in range(rounds):
        with tempfile.TemporaryDirectory(prefix="kvstore-demo-") as tmp:
            root = (store_dir / f"round{index}") if store_dir is not None else Path(tmp)
            results.append(_one_round(index, requests, num_blocks, layout, root, sidecar, console))
    return results


def _one_round(index: int, requests: list[TimedRequest], num_blocks: int, layout: KVLayout, root: Path,
               sidecar: bool, console: Console) -> Round:
    label = f"round {index + 1}: "
    out: Round = {}
    if index % 2 == 0:
        out["no store"] = replay(label + "no store", LLMEngine(engine_config(num_blocks)), requests)
    with _open_store(layout, root, sidecar, console) as store:
        cold = LLMEngine.with_store(engine_config(num_blocks), store)
        out["store (cold)"] = replay(label + "store (cold)", cold, requests)
        counters = cold.saver.counters if cold.saver is not None else {}
        out["store (cold)"].update({f"saver_{name}": count for name, count in counters.items()})
        cold.close()
        restarted = LLMEngine.with_store(engine_config(num_blocks), store)  # fresh pages, same store
        out["store (warm, restart)"] = replay(label + "store (warm, restart)", restarted, requests)
        restarted.close()
    if index % 2 == 1:
        out["no store"] = replay(label + "no store", LLMEngine(engine_config(num_blocks)), requests)
    return {name: out[name] for name in PASSES}


@contextmanager
def _open_store(layout: KVLayout, root: Path, sidecar: bool, console: Console) -> Iterator[ChunkStore]:
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


ROWS = (("TTFT mean (ms)", "ttft_mean_s", 1e3, ".1f"), ("TTFT P50 (ms)", "ttft_p50_s", 1e3, ".1f"),
        ("TTFT P99 (ms)", "ttft_p99_s", 1e3, ".1f"), ("ITL P50 (ms)", "itl_p50_s", 1e3, ".1f"),
        ("ITL P99 (ms)", "itl_p99_s", 1e3, ".1f"), ("e2e P50 (s)", "e2e_p50_s", 1.0, ".2f"),
        ("output tokens/s", "output_tokens_per_s", 1.0, ".1f"),
        ("KV hit rate (pool + store)", "kv_hit_rate", 100.0, ".1f%"), ("store hit rate", "store_hit_rate", 100.0, ".1f%"),
        ("preemptions", "preemptions", 1.0, ".0f"))


def spread(values: list[float], fmt: str = ".2f") -> str:
    """The median of `values`, with their range when there is more than one: `4.09 (2.09-4.20)`."""
    unit = "%" if fmt.endswith("%") else ""
    fmt = fmt.rstrip("%")
    mid = f"{statistics.median(values):{fmt}}{unit}"
    return mid if len(values) < 2 else f"{mid} ({min(values):{fmt}}-{max(values):{fmt}}{unit})"


def print_results(results: list[Round], console: Console) -> None:
    """The passes side by side (median of the rounds, range in brackets), then the ratios per round."""
    title = "engine demo: same arrivals, same weights, same greedy tokens"
    table = Table(title=title + (f"; median of {len(results)} rounds (min-max)" if len(results) > 1 else ""))
    table.add_column("metric")
    for name in PASSES:
        table.add_column(name, justify="right")
    for label, key, scale, fmt in ROWS:
        table.add_row(label, *(spread([r[name][key] * scale for r in results], fmt) for name in PASSES))
    console.print(table)
    warm = [r["no store"]["ttft_mean_s"] / r["store (warm, restart)"]["ttft_mean_s"] for r in results]
    throughput = [r["store (warm, restart)"]["output_tokens_per_s"] / r["no store"]["output_tokens_per_s"] for r in results]
    cold = [r["store (cold)"]["ttft_mean_s"] / r["no store"]["ttft_mean_s"] for r in results]
    console.print(f"mean TTFT with a warm store: {spread(warm)} x lower than without (per round: "
                  f"{', '.join(f'{x:.2f}' for x in warm)}); throughput {spread(throughput)} x")
    console.print(f"mean TTFT with a cold store: {spread(cold)} x the run without a store (per round: "
                  f"{', '.join(f'{x:.2f}' for x in cold)}; limit 1.05 x)")
    console.print(cold_store_note(results))


def cold_store_note(results: list[Round]) -> str:
    """What a cold store adds to the engine's work, with this run's counts."""
    cold = results[-1]["store (cold)"]
    return ("A cold store starts empty: it hits only on chunks saved earlier in the same pass "
            f"({cold['store_hit_rate'] * 100:.1f}% of prompt tokens in the last round), so what it can cost is the "
            "saving. Each step only pins the pages of the chunks it completed and queues them; a saver thread "
            "(lower OS priority) gathers and puts them off the step that produces the token "
            f"({cold.get('saver_jobs', 0):.0f} saves in the last round, {cold.get('saver_waits', 0):.0f} waits on a full queue), "
            "and a waiting request asks the store for its prefix once (a hash of the prompt and a lookup; again "
            "only after this engine stored more chunks). On a CPU shared "
            "with other work that thread and the daemon still take cycles: compare the rounds' ratios with their "
            "spread before reading a cost into one round.")
