"""vLLM 0.32 (its own `LLM`, CPU MLA backend) with the kvstore connector on a DeepSeek-V2-shaped MLA model, bf16.

Engine A computes and stores the prompts as kvstore MLA chunks (one 576-wide latent per token and layer); a fresh
engine B loads the whole chunks (num_cached_tokens) and answers token for token as vLLM without the connector; a
prompt whose chunks were overwritten with another prefix's latents is answered as that prefix (the loaded latents are
what vLLM attends to). Settings no other test uses: bf16, block size 16 (vLLM's CPU MLA forces it), 48-token chunks.

Every prompt is whole chunks plus one token, so vLLM computes one token after a hit, on its MLA decode path. With a
longer tail it runs its CPU context prefill (the loaded latents gathered back, attention merged by log-sum-exp), and
in bf16 that drifts from a full prefill: a 100-token prompt, 96 loaded, answered the baseline's first 7 tokens, then
differed (in float32 all 16 agreed); the bytes it loaded were the bytes stored. vLLM's CPU rope kernel is
turned off (connector.vllm.mla: it misplaces MLA's k_pe, and answers then depend on how a prompt is split into steps).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")


from connector.client import KVStoreClient
from connector.vllm.scope import vllm_identity
from tests.helpers.forkserver import ForkServer
from tests.integration.conftest import graft_prefix, run_vllm, run_vllm_together, start_daemon
from tests.integration.mla_model import mla_layout, tiny_deepseek_v2

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
BLOCK, CHUNK, MAX_TOKENS = 16, 48, 8
PROMPT_CHUNKS, TTFT_CHUNKS = (3, 2, 3), 20
LAYOUT = mla_layout(CHUNK)


def prompt(seed: int, chunks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(chunks * CHUNK + 1)]  # whole chunks and one token vLLM computes


PROMPTS = [prompt(20 + i, n) for i, n in enumerate(PROMPT_CHUNKS)]
CACHED = [n * CHUNK for n in PROMPT_CHUNKS]
DONOR = [7] * CACHED[0] + PROMPTS[0][CACHED[0]:]  # P0's tail after another prefix: the negative control
LONG, FRESH = prompt(40, TTFT_CHUNKS), prompt(41, TTFT_CHUNKS)  # 961 tokens each: time to first token of a hit (LONG,
# stored by engine A) against recomputing (FRESH, never stored), both in engine B


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, vllm_engine_server: ForkServer) -> Iterator[dict[str, Any]]:
    """The model, an MLA daemon, the no-connector baseline and engine A's stores."""
    vllm_engine_server.start()
    root = tmp_path_factory.mktemp("vllm_mla")
    model = str(tiny_deepseek_v2(root / "model"))
    daemon = start_daemon(root / "daemon", LAYOUT)
    base = {"model_dir": model, "load_format": "auto", "block_size": BLOCK, "max_tokens": MAX_TOKENS,
            "dtype": "bfloat16", "max_model_len": 2048, "custom_ops": ["all", "-rotary_embedding"]}
    connector = {"url": daemon.url, "chunk_tokens": CHUNK}
    steps = [{"generate": [*PROMPTS, DONOR]}, {"generate": [LONG], "max_tokens": 1}]
    reports = run_vllm_together({name: {**base, "connector": spec, "steps": steps}
                                 for name, spec in (("baseline", None), ("a", connector))}, root)
    yield {"root": root, "daemon": daemon, "base": base, "connector": connector, "baseline": reports["baseline"],
           "a": reports["a"]}
    daemon.close()


def test_engine_a_stores_whole_latent_chunks_and_answers_as_without_connector(world: dict[str, Any]) -> None:
    answers = [r["token_ids"] for r in world["a"]["results"][0]]
    assert answers == [r["token_ids"] for r in world["baseline"]["results"][0]]
    scope = vllm_identity(world["base"]["model_dir"], LAYOUT).scope()  # MLA: no CPU-layout tag, no TP size
    with KVStoreClient(world["daemon"].url) as client:
        assert client.layout == LAYOUT, "the connector opened the daemon with the MLA layout (else refused)"
        assert client.layout.chunk_bytes == 2 * CHUNK * 576 * 2, "2 layers x 48 tokens x one 576-wide bf16 latent"
        assert [client.lookup(p, scope) for p in [*PROMPTS, DONOR, LONG]] == [*CACHED, CACHED[0], TTFT_CHUNKS * CHUNK]


def test_fresh_engine_b_loads_the_latents_and_matches_the_baseline(world: dict[str, Any]) -> None:
    steps = [{"generate": PROMPTS}, {"generate": [FRESH, LONG], "max_tokens": 1}]
    engine_b = run_vllm({**world["base"], "connector": world["connector"], "steps": steps}, world["root"] / "b")
    results, (recompute, long_hit) = engine_b["results"]
    assert [r["num_cached_tokens"] for r in results] == CACHED
    baseline, (long_cold,) = world["baseline"]["results"]
    assert [r["token_ids"] for r in results] == [r["token_ids"] for r in baseline[:len(PROMPTS)]]
    assert all(r["num_cached_tokens"] == 0 for r in baseline), "the baseline computes everything"
    assert long_hit["num_cached_tokens"] == TTFT_CHUNKS * CHUNK and long_hit["token_ids"] == long_cold["token_ids"]
    assert recompute["num_cached_tokens"] == 0
    print(f"\nMLA TTFT, {len(LONG)}-token prompts in one engine: hit ({TTFT_CHUNKS * CHUNK} tokens loaded) "
          f"{long_hit['ttft_s'] * 1e3:.0f} ms, recompute {recompute['ttft_s'] * 1e3:.0f} ms = "
          f"{long_hit['ttft_s'] / recompute['ttft_s']:.2f} x recompute")


def test_overwritten_latents_change_the_answer(world: dict[str, Any]) -> None:
    """Negative control: P0's chunks replaced (through the API) by the latents the model computed for DONOR's prefix
    (same tail, another prefix): vLLM then answers P0 exactly as it answers DONOR."""
    baseline = world["baseline"]["results"][0]
    baseline_p0, baseline_donor = baseline[0]["token_ids"], baseline[len(PROMPTS)]["token_ids"]
    assert baseline_p0 != baseline_donor, "the model's answer depends on the prefix (else no control)"
    scope = vllm_identity(world["base"]["model_dir"], LAYOUT).scope()
    graft_prefix(world["daemon"].url, scope, PROMPTS[0], DONOR)
    engine_c = run_vllm({**world["base"], "connector": world["connector"], "steps": [{"generate": [PROMPTS[0]]}]},
                        world["root"] / "c")
    (result,) = engine_c["results"][0]
    assert result["num_cached_tokens"] == CACHED[0]
    assert result["token_ids"] == baseline_donor != baseline_p0
