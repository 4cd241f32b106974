"""Our engine's logits equal transformers' LlamaForCausalLM with the same config and weights (fp32).

Each sampled token's logits are compared with one full, unpaged HF forward over prompt + outputs:
whatever path produced the KV (one-shot prefill, chunked prefill, batched decode, pages loaded
from the store's host or NVMe tier), the numbers must agree to float32 rounding.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from connector.engine.llm_engine import LLMEngine
from kvstore.types import TierKind
from tests.connector.conftest import CHUNK, engine_config, hf_logits, hf_model, prompt

ATOL = 1e-4


def assert_matches_hf(engine: LLMEngine, seqs: list, hf: Any=None) -> None:
    hf = hf or hf_model(engine)
    for seq in seqs:
        mine = torch.stack(engine.logits[seq.request_id])
        ref = hf_logits(hf, seq.token_ids)
        n = seq.num_prompt_tokens
        want = ref[n - 1 : n - 1 + len(seq.output_token_ids)]
        assert mine.shape == want.shape
        torch.testing.assert_close(mine, want, atol=ATOL, rtol=1e-4)
        assert seq.output_token_ids == want.argmax(-1).tolist()  # greedy = HF's argmax at every step


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 6) -> list:
    from connector.engine.sequence import SamplingParams

    seqs = [engine.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    engine.wait_for_save()
    return seqs


def test_one_shot_prefill() -> None:
    engine = LLMEngine(engine_config(max_num_batched_tokens=256))
    seqs = run(engine, [prompt(1, 45)], max_tokens=1)
    assert_matches_hf(engine, seqs)


def test_chunked_prefill_under_a_small_budget() -> None:
    engine = LLMEngine(engine_config(max_num_batched_tokens=8, max_num_seqs=2))
    seqs = run(engine, [prompt(2, 45), prompt(3, 29)], max_tokens=4)
    assert_matches_hf(engine, seqs)  # 45 tokens fed 8 (or fewer) at a time, across many steps


def test_many_decode_steps_in_a_mixed_batch() -> None:
    """Requests join while others decode: steps mix 1-token decodes with prefill chunks."""
    from connector.engine.sequence import SamplingParams

    engine = LLMEngine(engine_config(max_num_batched_tokens=24, max_num_seqs=4))
    seqs = [engine.add_request(prompt(4, 13), SamplingParams(max_tokens=20))]
    mixed_steps = 0
    for step in range(200):
        if step in (2, 5, 9):
            seqs.append(engine.add_request(prompt(10 + step, 7 + 5 * step), SamplingParams(max_tokens=12)))
        if not engine.has_unfinished():
            break
        before = {s: s.num_computed_tokens for s in seqs}
        engine.step()
        fed = [s.num_computed_tokens - before[s] for s in seqs if s.num_computed_tokens > before[s]]
        mixed_steps += 1 in fed and any(n > 1 for n in fed)
    assert mixed_steps >= 2
    assert_matches_hf(engine, seqs)


@pytest.mark.parametrize("tier", [TierKind.HOST, TierKind.NVME])
def test_prefix_loaded_from_store_tier(store: Any, tier: TierKind) -> None:
    p = prompt(5, 3 * CHUNK + 5)
    first = LLMEngine.with_store(engine_config(), store)
    run(first, [p])
    store.flush()
    if tier is TierKind.NVME:
        store.drop_tier_copies(TierKind.HOST)
    hits_before = store.stats()["tiers"][tier.value].get("hits", 0)
    second = LLMEngine.with_store(engine_config(), store)  # fresh pages: nothing cached in its pool
    seqs = run(second, [p])
    assert seqs[0].num_store_hit_tokens == 3 * CHUNK
    assert store.stats()["tiers"][tier.value]["hits"] - hits_before == 3
    assert_matches_hf(second, seqs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_on_cuda_matches_transformers() -> None:
    from dataclasses import replace

    engine = LLMEngine(replace(engine_config(max_num_batched_tokens=16), device="cuda"))
    seqs = run(engine, [prompt(6, 40), prompt(7, 9)], max_tokens=5)
    engine.logits = {k: [t.cpu() for t in v] for k, v in engine.logits.items()}
    hf = hf_model(LLMEngine(engine_config()))  # same seed, same weights, on CPU
    assert_matches_hf(engine, seqs, hf)
