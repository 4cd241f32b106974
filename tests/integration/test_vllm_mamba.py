"""A Qwen3-Next-shaped hybrid (gated delta net layers alternating with full attention, bf16) through the kvstore
connector with vLLM's hybrid KV cache manager on and prefix caching on (vLLM's "align" mode, which keeps a state at
block ends): engine A stores the full-attention chunks and the delta net state at the chunk boundary where each
prefill step stopped; a fresh engine B loads both and answers token for token as vLLM without the connector."""

from __future__ import annotations

import random
from collections.abc import Iterator
from statistics import median
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

from connector.client import KVStoreClient
from tests.helpers.forkserver import ForkServer
from tests.integration.conftest import llama_layout, run_vllm, run_vllm_together, start_daemon
from tests.integration.qwen3_next_model import BLOCK, HEAD_DIM, KV_HEADS, LAYER_TYPES, tiny_qwen3_next

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
CHUNK, PROMPT_TOKENS, MAX_TOKENS = BLOCK, 400, 8  # a chunk is one block: connector.vllm.groups
# vLLM's align mode stops a prompt's first prefill step at its last block end before the prompt's end (384 of 400)
# and keeps the state there; full-attention chunks up to it and that state make the hit
CACHED = (PROMPT_TOKENS - 1) // BLOCK * BLOCK
HMA_OFF = "Turning off hybrid kv cache manager"
PROMPTS = [[random.Random(4000 + i).randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for i in range(3)]
TIMED = [[random.Random(4100 + i).randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for i in range(3)]
FRESH = [[random.Random(4200 + i).randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for i in range(3)]  # B's misses
FULL_LAYERS = LAYER_TYPES.count("full_attention")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, vllm_engine_server: ForkServer) -> Iterator[dict[str, Any]]:
    vllm_engine_server.start()
    root = tmp_path_factory.mktemp("vllm_qwen3_next")
    model = str(tiny_qwen3_next(root / "model", seed=11))
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK), host_chunks=1024, any_layout=True)
    base = {"model_dir": model, "load_format": "auto", "dtype": "bfloat16", "block_size": BLOCK,
            "max_tokens": MAX_TOKENS, "prefix_caching": True}
    connector = {"url": daemon.url, "chunk_tokens": CHUNK}
    steps = [{"generate": PROMPTS}, {"generate": TIMED, "max_tokens": 1}]
    reports = run_vllm_together({"baseline": {**base, "connector": None, "steps": steps},
                                 "a": {**base, "connector": connector, "steps": steps}}, root)
    yield {"root": root, "daemon": daemon, "base": base, "connector": connector, "steps": steps, **reports}
    daemon.close()


@pytest.fixture(scope="module")
def engine_b(world: dict[str, Any]) -> dict[str, Any]:
    """A fresh engine (its own process, after A is gone) on the same daemon."""
    steps = [*world["steps"], {"generate": FRESH, "max_tokens": 1}]  # recomputed in the same engine: TTFT's peer
    return run_vllm({**world["base"], "connector": world["connector"], "steps": steps},  # type: ignore[no-any-return]
                    world["root"] / "b")


def test_hybrid_manager_stays_on_and_engine_a_answers_as_without_connector(world: dict[str, Any]) -> None:
    log = world["a"]["log"]
    assert HMA_OFF not in log and "Failed to promote" not in log
    assert "Mamba cache mode is set to 'align'" in log
    assert f"kv cache group sizes ({BLOCK}, {BLOCK})" in log, "vLLM kept a full-attention and a state group"
    assert [r["token_ids"] for r in world["a"]["results"][0]] == [r["token_ids"] for r in world["baseline"]["results"][0]]


def test_fresh_engine_loads_every_group_and_matches_the_baseline(world: dict[str, Any], engine_b: dict[str, Any]) -> None:
    results = engine_b["results"][0]
    assert [r["num_cached_tokens"] for r in results] == [CACHED] * len(PROMPTS)
    assert [r["token_ids"] for r in results] == [r["token_ids"] for r in world["baseline"]["results"][0]]
    assert len({tuple(r["token_ids"]) for r in results}) == len(PROMPTS), "the answers follow the prompts"
    timed = engine_b["results"][1]
    assert [r["num_cached_tokens"] for r in timed] == [CACHED] * len(TIMED)
    assert [r["token_ids"] for r in timed] == [r["token_ids"] for r in world["baseline"]["results"][1]]
    assert [r["num_cached_tokens"] for r in engine_b["results"][2]] == [0] * len(FRESH)
    hit, recompute = median(r["ttft_s"] for r in timed), median(r["ttft_s"] for r in engine_b["results"][2])
    print(f"qwen3-next shaped, {PROMPT_TOKENS}-token prompts: TTFT {hit * 1e3:.0f} ms with {CACHED} tokens loaded "
          f"vs {recompute * 1e3:.0f} ms recomputed ({recompute / hit:.2f}x)")


def test_bytes_stored_per_token_are_the_full_layers_plus_one_state_per_prompt(world: dict[str, Any],
                                                                                 engine_b: dict[str, Any]) -> None:
    """Every prompt stores its full-attention chunks up to the state's boundary and one state there (engine B
    stores only its fresh prompts: the others it loaded)."""
    with KVStoreClient(world["daemon"].url) as client:
        stored = client.stats()["tiers"]["host"]["used_bytes"]
    prompts = len(PROMPTS) + len(TIMED) + len(FRESH)
    full_per_token = FULL_LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
    full_bytes = prompts * CACHED * full_per_token
    state_bytes = (stored - full_bytes) / prompts
    print(f"qwen3-next shaped: {stored / (prompts * CACHED):.0f} B/token stored vs {full_per_token} B/token for its "
          f"full-attention layers alone ({stored / full_bytes:.3f}x); one state per prompt: {state_bytes:.0f} B")
    delta_layers = len(LAYER_TYPES) - FULL_LAYERS
    # a bf16 or float32 SSM state per delta net layer (vLLM's choice on this CPU), in a host slot of whole 4 KiB pages
    assert state_bytes in {-(-delta_layers * page // 4096) * 4096 for page in (35072, 67840)}
