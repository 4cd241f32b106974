"""A Gemma-2 shaped model (sliding-window layers between full-attention layers) through the kvstore connector with
vLLM's hybrid KV cache manager on: engine A stores each group's pieces, a fresh engine B loads them and answers
token for token as an engine without the connector."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

from connector.client import KVStoreClient
from tests.helpers.forkserver import ForkServer
from tests.integration.conftest import llama_layout, run_vllm, run_vllm_together, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
BLOCK, CHUNK, WINDOW, PROMPT_TOKENS, MAX_TOKENS = 32, 128, 24, 400, 8
CACHED = PROMPT_TOKENS // CHUNK * CHUNK  # 384: three whole chunks; vLLM computes the rest
HMA_OFF = "Turning off hybrid kv cache manager"


def tiny_gemma(path: Path, family: str, seed: int = 0) -> Path:
    """A seeded 6-layer Gemma-2 (layers alternate sliding window and full attention) or Gemma-3 (5 sliding
    layers to 1 full), window 24, float32; scores unscaled and uncapped so that the answer follows the KV (a
    wrong or missing window block changes it)."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    config_class, model_class = {"gemma2": (Gemma2Config, Gemma2ForCausalLM),
                                 "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM)}[family]
    path.mkdir(parents=True, exist_ok=True)
    # torch_dtype: transformers 5 still reads it (mypy knows only "dtype", which changed these tiny models' answers)
    config = config_class(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=6,  # type: ignore[call-arg]
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                          sliding_window=WINDOW, initializer_range=0.5, torch_dtype="float32", bos_token_id=1,
                          eos_token_id=2, pad_token_id=0, query_pre_attn_scalar=1, attn_logit_softcapping=None,
                          final_logit_softcapping=None, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():  # vLLM ties Gemma's output to its input embedding; louder attention and MLP outputs
        for name, weight in model.named_parameters():  # keep the answer from echoing the last prompt token
            if "post_attention_layernorm" in name or "post_feedforward_layernorm" in name:
                weight.fill_(20.0)
    model.save_pretrained(path, safe_serialization=True)
    return path


def gemma_shape(path: Path, family: str) -> Path:
    """A Gemma-2 or Gemma-3 config with the compute of a small real model (8 layers, hidden 1024, 8 heads of 128,
    2 KV heads, window 256, float32) for load_format="dummy": prefill costs what it does in production, relative
    to the bytes of KV a hit loads (the seeded tiny models prefill 1,024 tokens in tens of milliseconds)."""
    from transformers import Gemma2Config, Gemma3TextConfig

    config_class, architecture = {"gemma2": (Gemma2Config, "Gemma2ForCausalLM"),
                                  "gemma3": (Gemma3TextConfig, "Gemma3ForCausalLM")}[family]
    path.mkdir(parents=True, exist_ok=True)
    config = config_class(vocab_size=1024, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,  # type: ignore[call-arg]
                          num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096,
                          sliding_window=256, torch_dtype="float32", bos_token_id=1, eos_token_id=2, pad_token_id=0)
    (path / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": [architecture]}))
    return path


PROMPTS = [[random.Random(40 + i).randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for i in range(3)]
TTFT_CHUNKS = 8  # LONG: a hit of 1,024 tokens, stored by one engine and loaded by the next; FRESH: recomputed there
LONG, FRESH = ([random.Random(seed).randrange(3, 1000) for _ in range(TTFT_CHUNKS * CHUNK + 1)] for seed in (60, 61))


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          vllm_engine_server: ForkServer) -> Iterator[Any]:
    vllm_engine_server.start()
    root = tmp_path_factory.mktemp(f"vllm_{request.param}")
    model = str(tiny_gemma(root / "model", request.param))
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK), any_layout=True)
    converted = start_daemon(root / "converted", llama_layout(CHUNK), any_layout=True)
    base = {"model_dir": model, "load_format": "auto", "block_size": BLOCK, "max_tokens": MAX_TOKENS}
    connector = {"url": daemon.url, "chunk_tokens": CHUNK}
    runs = {"baseline": {**base, "connector": None}, "a": {**base, "connector": connector},
            "converted": {**base, "connector": {**connector, "url": converted.url},
                          "disable_hybrid_kv_cache_manager": True}}
    reports = run_vllm_together({name: {**spec, "steps": [{"generate": PROMPTS}]} for name, spec in runs.items()}, root)
    yield {"root": root, "daemon": daemon, "converted_daemon": converted, "base": base, "connector": connector,
           "family": request.param, **{name: report["results"][0] for name, report in reports.items()}}
    daemon.close()
    converted.close()


def test_hybrid_manager_stays_on_and_engine_a_answers_as_without_connector(world: Any) -> None:
    log = (world["root"] / "a" / "vllm.log").read_text()
    assert HMA_OFF not in log
    assert "kv cache group sizes (" in log and "kv cache group sizes (32)" not in log, "vLLM kept several groups"
    assert [r["token_ids"] for r in world["a"]] == [r["token_ids"] for r in world["baseline"]]


def test_fresh_engine_loads_every_group_and_matches_the_baseline(world: Any) -> None:
    engine_b = run_vllm({**world["base"], "connector": world["connector"], "steps": [{"generate": PROMPTS}]},
                        world["root"] / "b")
    results = engine_b["results"][0]
    assert [r["num_cached_tokens"] for r in results] == [CACHED] * len(PROMPTS)
    assert [r["token_ids"] for r in results] == [r["token_ids"] for r in world["baseline"]]


def test_bytes_stored_per_token_follow_the_window(world: Any) -> None:
    """The same prompts through vLLM's full-attention conversion (hybrid manager off) store more per token."""
    assert [r["token_ids"] for r in world["converted"]] == [r["token_ids"] for r in world["baseline"]]
    stored = {}
    for name in ("daemon", "converted"):
        with KVStoreClient(world[name if name == "daemon" else "converted_daemon"].url) as client:
            stored[name] = client.stats()["tiers"]["host"]["used_bytes"] / (len(PROMPTS) * CACHED)
    print(f"{world['family']}: {stored['daemon']:.0f} B/token stored with the hybrid manager, "
          f"{stored['converted']:.0f} with the full-attention conversion "
          f"({stored['converted'] / stored['daemon']:.2f}x)")
    # window 24 of 128-token chunks: a sliding layer stores 2 of 4 blocks per chunk (3.5 or 4.5 of 6 layers)
    assert stored["daemon"] < stored["converted"] * (0.85 if world["family"] == "gemma2" else 0.7)


def test_time_to_first_token_of_a_hit_against_recomputing(world: Any) -> None:
    """With a Gemma-shaped model of a small real model's compute (gemma_shape), one engine stores LONG through its
    own daemon; a fresh engine then runs FRESH (never stored: recomputed) and LONG (its whole chunks loaded), and
    gives each one's time to first token."""
    root = world["root"] / "ttft"
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK), any_layout=True)
    base = {**world["base"], "model_dir": str(gemma_shape(root / "model", world["family"])), "load_format": "dummy"}
    try:
        connector, step = {**world["connector"], "url": daemon.url}, {"max_tokens": 1}
        run_vllm({**base, "connector": connector, "steps": [{**step, "generate": [LONG]}]}, root / "a")
        report = run_vllm({**base, "connector": connector, "steps": [{**step, "generate": [FRESH, LONG]}]},
                          root / "b")
    finally:
        daemon.close()
    recompute, hit = report["results"][0]
    assert (recompute["num_cached_tokens"], hit["num_cached_tokens"]) == (0, TTFT_CHUNKS * CHUNK)
    print(f"\n{world['family']} TTFT, {len(LONG)}-token prompts in one engine: hit ({TTFT_CHUNKS * CHUNK} tokens "
          f"loaded) {hit['ttft_s'] * 1e3:.0f} ms, recompute {recompute['ttft_s'] * 1e3:.0f} ms = "
          f"{hit['ttft_s'] / recompute['ttft_s']:.2f} x recompute")


def tiny_qwen3_next(path: Path) -> Path:
    """Qwen3-Next's shape for load_format="dummy": 3 gated delta net layers (128-wide linear heads) to 1 full
    attention layer, small MoE, bf16 (vLLM's CPU gated delta net kernel wants both)."""
    from transformers import Qwen3NextConfig

    path.mkdir(parents=True, exist_ok=True)
    config = Qwen3NextConfig(vocab_size=1024, hidden_size=256, intermediate_size=256, num_hidden_layers=4,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
                             linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                             shared_expert_intermediate_size=128, max_position_embeddings=4096,
                             layer_types=["linear_attention"] * 3 + ["full_attention"], dtype="bfloat16")
    (path / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": ["Qwen3NextForCausalLM"]}))
    return path


def test_a_gated_delta_net_hybrid_without_prefix_caching_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    """vLLM keeps its hybrid manager (no "Failed to promote local KV cache specs"); without prefix caching vLLM
    keeps no state at block ends ("align" mode), so the connector refuses, naming the setting and what works
    (tests/integration/test_vllm_mamba.py runs the same shape with it on)."""
    spec = {"model_dir": str(tiny_qwen3_next(tmp_path / "model")), "load_format": "dummy", "block_size": 32,
            "max_tokens": 2, "dtype": "bfloat16", "connector": {"root_dir": str(tmp_path / "store"), "chunk_tokens": 256},
            "steps": [{"generate": [list(range(5, 40))]}]}
    proc = run_vllm(spec, tmp_path / "engine", wait=False)
    assert proc.wait(timeout=600) != 0
    log = (tmp_path / "engine" / "vllm.log").read_text()
    assert "Failed to promote" not in log and HMA_OFF not in log
    assert ("ConfigError: kvstore keeps a gated delta net layer's state at chunk boundaries, which needs vLLM to keep "
            "states at block ends: enable prefix caching (mamba_cache_mode 'align', now 'none') or run this model "
            "without the kvstore connector (drop --kv-transfer-config)") in log
