"""Through the store: greedy outputs never change, and lost or corrupt chunks are recomputed, not trusted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from connector.engine.llm_engine import LLMEngine
from connector.engine.sequence import SamplingParams
from kvstore.chunk_format import PAYLOAD_OFFSET
from kvstore.types import TierKind
from tests.connector.conftest import CHUNK, engine_config, prompt
from tests.connector.test_engine_vs_transformers import assert_matches_hf

SYSTEM = prompt(100, 2 * CHUNK)  # a shared system prompt: two full chunks


def workload() -> list[list[int]]:
    """Shared system prompt + distinct user turns, plus a follow-up that extends the first turn."""
    turns = [SYSTEM + prompt(200 + i, 10 + 7 * i) for i in range(4)]
    return [*turns, turns[0] + prompt(300, 2 * CHUNK)]


def chunk_file(tmp_path: Path, key: bytes) -> Path:
    hexkey = key.hex()
    return tmp_path / "nvme" / hexkey[:2] / hexkey[2:4] / f"{hexkey}.kvc"


def test_greedy_outputs_identical_with_and_without_store(store: Any) -> None:
    sampling = SamplingParams(max_tokens=8)
    want = LLMEngine(engine_config()).generate(workload(), sampling)
    with_store = LLMEngine.with_store(engine_config(), store)
    assert with_store.generate(workload(), sampling) == want
    again = LLMEngine.with_store(engine_config(), store)  # second pass: prefixes come from the store
    assert again.generate(workload(), sampling) == want
    assert sum(s.num_store_hit_tokens for s in again.finished) >= 5 * 2 * CHUNK
    assert again.connector.stats()["load_failed_chunks"] == 0  # type: ignore[union-attr]


def test_corrupt_and_deleted_chunk_files_mid_run_are_recomputed(store: Any, tmp_path: Path) -> None:
    sampling = SamplingParams(max_tokens=6)
    prompts = [SYSTEM + prompt(400 + i, 2 * CHUNK + 3) for i in range(3)]  # 4 full chunks each
    want = LLMEngine(engine_config()).generate(prompts, sampling)
    LLMEngine.with_store(engine_config(), store).generate(prompts, sampling)
    store.drop_tier_copies(TierKind.HOST)  # every chunk now lives only in files

    engine = LLMEngine.with_store(engine_config(max_num_seqs=1), store)  # one request at a time
    seqs = [engine.add_request(p, sampling) for p in prompts]
    while not seqs[0].output_token_ids:
        engine.step()
    # Mid-run: request 1 loses its 3rd chunk to bit rot, request 2 its 4th chunk file entirely.
    scope = engine.connector.scope if engine.connector is not None else None  # the engine's key space
    keys1, keys2 = store.chunk_keys(prompts[1], scope), store.chunk_keys(prompts[2], scope)
    with open(chunk_file(tmp_path, keys1[2]), "r+b") as f:
        f.seek(PAYLOAD_OFFSET + 100)
        f.write(b"\xff" * 64)
    chunk_file(tmp_path, keys2[3]).unlink()
    while engine.has_unfinished():
        engine.step()

    assert [s.output_token_ids for s in seqs] == want
    # The shared system prompt (2 chunks) stays in the engine's own pages after request 0; past it,
    # request 1 loads nothing (chunk 2 is corrupt) and request 2 loads chunk 2 only (chunk 3 is gone).
    assert [s.num_pool_hit_tokens for s in seqs] == [0, 2 * CHUNK, 2 * CHUNK]
    assert [s.num_store_hit_tokens for s in seqs] == [4 * CHUNK, 0, CHUNK]
    assert engine.connector.stats()["load_failed_chunks"] == 3  # type: ignore[union-attr]  # chunks 2, 3 of request 1; chunk 3 of request 2
    assert store.stats()["tiers"]["nvme"].get("corrupt", 0) == 1
    assert_matches_hf(engine, seqs)  # the recomputed tokens are exactly right, not merely plausible


def test_seeded_sampling_is_reproducible_through_the_store(store: Any) -> None:
    sampling = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7)
    want = LLMEngine(engine_config()).generate(workload()[:2], sampling)
    assert LLMEngine.with_store(engine_config(), store).generate(workload()[:2], sampling) == want
    assert LLMEngine.with_store(engine_config(), store).generate(workload()[:2], sampling) == want
    other = LLMEngine(engine_config()).generate(workload()[:2], SamplingParams(max_tokens=10, temperature=0.8, seed=8))
    assert other != want
    assert torch.tensor(want).unique().numel() > 2  # really sampling, not stuck on one token


def test_pool_hits_are_cut_to_a_chunk_boundary_when_the_store_holds_more(store: Any) -> None:
    """The engine's own cached pages cover 5 pages (20 tokens, mid-chunk); the store holds 2 chunks.
    Loads start on a chunk boundary, so the engine keeps 4 pool pages and loads chunk 1 only."""
    p = prompt(600, 2 * CHUNK + 9)
    LLMEngine.with_store(engine_config(), store).generate([p], SamplingParams(max_tokens=2))
    engine = LLMEngine.with_store(engine_config(), store)
    engine.connector = None  # the first request only warms this engine's pool, without the store
    engine.scheduler.connector = None
    engine.generate([p[:20] + prompt(601, 5)], SamplingParams(max_tokens=1))
    engine.connector = engine.scheduler.connector = LLMEngine.with_store(engine_config(), store).connector
    seq = engine.add_request(p, SamplingParams(max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    assert (seq.num_pool_hit_tokens, seq.num_store_hit_tokens) == (CHUNK, CHUNK)
    assert_matches_hf(engine, [seq])
