"""How a decode step's cost grows with its batch, for a few model sizes: why continuous batching's gain on this
machine stays below its iteration ratio (a step that costs the same at any batch size is the GPU regime).

    kvstore bench step_cost [--quick] [--json PATH]

Each figure is a decode step (one thread's CPU time, least mean of 3 runs) at batch B beside the step at batch 8.
"""

from __future__ import annotations

from functools import partial

import torch
from tqdm import tqdm

from bench.common import Record, print_records, record
from bench.engine import MODEL
from connector.engine.llm_engine import EngineConfig, LLMEngine
from connector.engine.metrics import ComputeClock
from connector.engine.model import ModelConfig
from connector.engine.scheduler import SchedulerConfig
from connector.engine.sequence import SamplingParams

_wide = partial(ModelConfig, vocab_size=1024, num_heads=16, num_kv_heads=4, seed=0)
MODELS = {
    "bench": MODEL,  # bench/engine.py's model: weights fit in cache
    "h1024_fp32": _wide(hidden_size=1024, intermediate_size=2816, num_layers=8, head_dim=64),
    "h1024_bf16": _wide(hidden_size=1024, intermediate_size=2816, num_layers=8, head_dim=64, dtype="bfloat16"),
    "h2048_bf16": _wide(hidden_size=2048, intermediate_size=5632, num_layers=4, head_dim=128, dtype="bfloat16"),
}
BATCHES = (1, 4, 8, 16, 32)


def step_ms(model: ModelConfig, batch: int, context: int, steps: int = 10, repeats: int = 3) -> float:
    """Decode step at `batch` sequences of about `context` tokens: the least mean of `repeats` runs of `steps`."""
    engine = LLMEngine(EngineConfig(model=model, page_size=16, num_blocks=batch * (context // 16 + 8) + 64,
                                    scheduler=SchedulerConfig(max_num_batched_tokens=batch * context, max_num_seqs=batch)))
    engine.generate([[1] * 64], SamplingParams(max_tokens=2))  # warm-up
    for i in range(batch):
        engine.add_request([(i * 7 + j) % model.vocab_size for j in range(context)],
                           SamplingParams(max_tokens=steps * repeats + 2))
    engine.step()  # every prefill in one step
    clock, means = ComputeClock(), []
    for _ in range(repeats):
        start = clock()
        for _ in range(steps):
            engine.step()
            if engine.last_num_tokens != batch:  # a decode of every sequence, nothing else
                raise RuntimeError(f"step fed {engine.last_num_tokens} tokens, expected {batch} decodes")
        means.append(1e3 * (clock() - start) / steps)
    return min(means)


def run(quick: bool = False, context: int = 200) -> list[Record]:
    """Every model of MODELS (quick: the bench's and one out-of-cache bf16 model) at each batch size."""
    models = {k: MODELS[k] for k in ("bench", "h1024_bf16")} if quick else MODELS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    records = []
    try:
        for name, model in tqdm(models.items(), desc="models", unit="model"):
            ms = {b: step_ms(model, b, context) for b in BATCHES}
            records += [record(f"step_cost.{name}.batch{b}", ms[b], "ms", "step at batch 8", ms[8]) for b in BATCHES]
    finally:
        torch.set_num_threads(threads)
    print_records(f"decode step cost by batch ({context}-token contexts, one thread)", records)
    return records
