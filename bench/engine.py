"""Engine benchmark: batching modes, TTFT with a cached 4k prefix (host / NVMe) vs recompute, scheduling
policies, and gather/scatter bandwidth beside a plain copy; every figure beside its peer from the same run."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bench.common import Record, best_time, gbps, print_records, record
from connector.engine.llm_engine import EngineConfig, LLMEngine, TimedRequest
from connector.engine.metrics import ComputeClock
from connector.engine.model import ModelConfig
from connector.engine.scheduler import SchedulerConfig
from connector.engine.sequence import SamplingParams
from connector.engine.workload import WorkloadConfig, build_workload, load_azure_conv, spread_rows
from gpu_kernels import active_backend, gather_blocks, scatter_blocks
from kvstore.config import StoreConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

# Prefill-dominated on CPU: a 4k prompt takes seconds, its KV is 16 MiB.
MODEL = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=64, seed=0)
PAGE = 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU run: scripts/gpu_check.sh


def _clock() -> Callable[[], float]:
    """CPU: the engine thread's CPU time, so other load on a shared machine does not count. CUDA:
    the wall clock (the GPU's work is not this thread's CPU time)."""
    return ComputeClock() if DEVICE == "cpu" else time.perf_counter


def engine_config(*, num_blocks: int = 1024, **scheduler: Any) -> EngineConfig:
    options = {"max_num_batched_tokens": 512, "max_num_seqs": 8, **scheduler}
    return EngineConfig(model=MODEL, page_size=PAGE, num_blocks=num_blocks, scheduler=SchedulerConfig(**options),
                        device=DEVICE)


def batching_modes(quick: bool) -> list[Record]:
    """Same arrivals (Azure trace) under continuous, static and dynamic batching, in steady state.

    96 (quick) / 288 requests arrive faster than the engine serves them, so every mode runs full
    batches and the result is throughput, not the tail of the last request. The requests are rows
    spread evenly over the whole trace, with its output lengths as they are (the first few hundred
    rows are one five-minute slice whose lengths vary less: static batching's loss there is smaller
    than the trace's). Prompts are short so decode dominates, as it does on a GPU (on a CPU a
    prefill token costs about as much as a decode token, which would dilute the comparison).
    Timed on a ComputeClock: other load on the machine does not count.

    Beside throughput, two figures that explain it: iterations (static's over continuous's: the
    throughput ratio where a step costs the same whatever its batch, as a GPU decode step does
    at these batch sizes) and the mean cost of a step in each mode (on this CPU a step's cost
    grows with its batch, and static's batches shrink as their sequences finish).
    """
    n = 96 if quick else 288
    requests = build_workload(spread_rows(load_azure_conv(num_rows=1 << 20), n), WorkloadConfig(
        num_requests=n, requests_per_s=100.0, length_scale=1.0, max_user_tokens=32, max_output_tokens=1024,
        system_prompt_tokens=16, follow_up_prob=0.0, vocab_size=MODEL.vocab_size))
    summaries = {}
    for mode in tqdm(("continuous", "static", "dynamic"), desc="batching modes", unit="mode", leave=False):
        engine = LLMEngine(engine_config(mode=mode, max_num_seqs=16, max_batch_wait_s=0.25), clock=_clock())
        engine.generate([[1] * 64], SamplingParams(max_tokens=2))  # warm-up
        summaries[mode] = engine.replay(requests).summary()
    cont = summaries["continuous"]
    out = []
    for mode in ("static", "dynamic"):
        s = summaries[mode]
        out.append(record(f"engine.continuous_vs_{mode}", cont["output_tokens_per_s"], "tok/s",
                          f"{mode} batching", s["output_tokens_per_s"]))
        out.append(record(f"engine.ttft_p99.continuous_vs_{mode}", cont["ttft_p99_s"], "s",
                          f"{mode} batching", s["ttft_p99_s"], ratio=s["ttft_p99_s"] / cont["ttft_p99_s"]))
        out.append(record(f"engine.iterations.continuous_vs_{mode}", cont["iterations"], "steps",
                          f"{mode} batching", s["iterations"], ratio=s["iterations"] / cont["iterations"]))
    cont_step_ms = 1e3 * cont["wall_s"] / cont["iterations"]
    for mode in ("static", "dynamic"):
        s = summaries[mode]
        out.append(record(f"engine.step_ms.{mode}", 1e3 * s["wall_s"] / s["iterations"], "ms",
                          f"continuous step (mean batch {cont['mean_batch_seqs']:.1f} vs {s['mean_batch_seqs']:.1f} seqs)",
                          cont_step_ms))
    return out


def _ttft(engine: LLMEngine, prompt: list[int]) -> float:
    start = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1))
    return time.perf_counter() - start


def cached_prefix_ttft(quick: bool) -> list[Record]:
    """TTFT of a 4k-token prefix + a new 64-token turn: prefix recomputed vs loaded from host / NVMe."""
    prefix_tokens = 2048 if quick else 4096
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, MODEL.vocab_size, (prefix_tokens,), generator=gen).tolist()
    turn_a, turn_b = ([int(t) for t in torch.randint(0, MODEL.vocab_size, (64,), generator=gen)] for _ in range(2))
    layout = MODEL.kv_layout(256)
    config = engine_config(max_num_batched_tokens=4096)
    _ttft(LLMEngine(config), prefix[:512])  # warm-up
    recompute = min(_ttft(LLMEngine(config), prefix + turn_b) for _ in range(1 if quick else 2))
    out = []
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-engine-") as tmp:
        store_config = StoreConfig.embedded(layout=layout, root_dir=Path(tmp), model_id="bench-engine",
                                            host_bytes=512 << 20, nvme_bytes=2 << 30)
        with TieredStore(store_config) as store:
            LLMEngine.with_store(config, store).generate([prefix + turn_a], SamplingParams(max_tokens=1))
            store.flush()
            host = _ttft(LLMEngine.with_store(config, store), prefix + turn_b)  # fresh pages: prefix from host
            store.drop_tier_copies(TierKind.HOST)
            nvme = _ttft(LLMEngine.with_store(config, store), prefix + turn_b)
    for tier, value in (("host", host), ("nvme", nvme)):
        out.append(record(f"engine.ttft.{tier}", value, "s", f"recompute {prefix_tokens}-token prefix", recompute,
                          ratio=recompute / value))
    return out


def scheduling_policies(quick: bool) -> list[Record]:
    """Long prompts at the start, then a steady stream of short ones that keeps the engine saturated:
    mean/P99 TTFT of all, and the longest wait (arrival to admission) of a long one, per policy.
    The quota policy at Q = 4, 16 and 64 passes shows its knob: a long request's wait against the
    short ones' TTFT."""
    gen = torch.Generator().manual_seed(2)
    num_short, long_tokens = (48, 1024) if quick else (96, 2048)

    def req(at: float, n: int) -> TimedRequest:
        return TimedRequest(at, torch.randint(0, MODEL.vocab_size, (n,), generator=gen).tolist(),
                            SamplingParams(max_tokens=8))

    requests = [req(0.01 * i, long_tokens) for i in range(2)]
    requests += [req(0.008 * i, 48) for i in range(num_short)]
    results = {}
    policies = {"fcfs": ("fcfs", ()), "spf": ("spf", (("aging_tokens_per_s", 10000.0),)),
                "spf_no_aging": ("spf", (("aging_tokens_per_s", 0.0),)), "quota": ("quota", (("max_passes", 4),)),
                "quota_q16": ("quota", (("max_passes", 16),)), "quota_q64": ("quota", (("max_passes", 64),))}
    for name, (policy, options) in policies.items():
        engine = LLMEngine(engine_config(max_num_seqs=4, policy=policy, policy_options=options), clock=_clock())
        engine.generate([[1] * 64], SamplingParams(max_tokens=2))
        metrics = engine.replay(requests)
        long_waits = [r.wait_s for r in metrics.requests if r.num_prompt_tokens == long_tokens]
        results[name] = {**metrics.summary(), "long_max_wait_s": max(long_waits)}
    base = results["fcfs"]
    out = []
    for name in ("spf", "spf_no_aging", "quota", "quota_q16", "quota_q64"):
        for key, label in (("ttft_mean_s", "ttft_mean"), ("ttft_p99_s", "ttft_p99"), ("long_max_wait_s", "long_max_wait")):
            out.append(record(f"engine.policy.{name}.{label}", results[name][key], "s", f"fcfs {label}", base[key]))
    return out


def gather_scatter(quick: bool) -> list[Record]:
    """Gather/scatter of one Llama-3-8B bf16 chunk (256 tokens, 16 pages) beside a plain copy of its bytes."""
    layout = KVLayout.from_preset("llama-3-8b", chunk_tokens=256)
    num_blocks = 48 if quick else 96
    device = DEVICE
    paged = torch.randn(layout.num_layers, 2, num_blocks, PAGE, layout.num_kv_heads, layout.head_dim,
                        dtype=torch.bfloat16, device=device)
    blocks = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(3))[: 256 // PAGE].tolist()
    chunk = torch.empty(layout.chunk_shape, dtype=torch.bfloat16, device=device)
    src = torch.empty_like(chunk).copy_(chunk)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    repeats = 3 if quick else 10

    def timed(fn: Callable[[], object]) -> float:
        return best_time(lambda: (fn(), sync()), repeats=repeats)

    copy_s = timed(lambda: chunk.copy_(src))
    gather_s = timed(lambda: gather_blocks(paged, blocks, chunk))
    scatter_s = timed(lambda: scatter_blocks(chunk, blocks, paged))
    nbytes = layout.chunk_bytes
    baseline = f"plain copy ({device})"
    return [record(f"engine.gather.{active_backend()}", gbps(nbytes, gather_s), "GB/s", baseline, gbps(nbytes, copy_s)),
            record(f"engine.scatter.{active_backend()}", gbps(nbytes, scatter_s), "GB/s", baseline, gbps(nbytes, copy_s))]


def run(quick: bool = False) -> list[Record]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier on shared CPUs; the GPU path does not care
    try:
        records = [*gather_scatter(quick), *cached_prefix_ttft(quick), *batching_modes(quick),
                   *scheduling_policies(quick)]
    finally:
        torch.set_num_threads(threads)
    print_records("engine", records)
    return records
