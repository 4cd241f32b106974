"""The right KV for the right model, adapter and tenant, and an engine a frozen daemon cannot stall (vLLM 0.32
on CPU, each engine in its own process, one real `kvstore serve`).

Two fine-tunes of one architecture (same KV layout, different weights) share a daemon: neither loads the other's
KV and each answers as without the connector; an explicit model_id lets two paths to the same weights share.
A request's cache_salt keeps its chunks apart from unsalted and other-salted ones. Chunks written in the
pre-scope key format read as misses. With the daemon frozen (SIGSTOP) every request completes within its
deadlines with the same answer, and after SIGCONT hits come back in the same engine.
Settings no other test uses: a 3-layer Llama with one KV head of width 80, chunks of 96 tokens.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import torch

from connector.client import KVStoreClient
from tests.helpers.forkserver import ForkServer
from tests.integration.conftest import finish_vllm, llama_layout, run_vllm, run_vllm_together, start_daemon, tiny_llama
from tests.integration.test_vllm import wait_for_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
BLOCK, CHUNK, LAYERS, KV_HEADS, DIM, PROMPT_TOKENS, MAX_TOKENS = 32, 96, 3, 1, 80, 200, 6
CACHED = min(PROMPT_TOKENS // CHUNK * CHUNK, PROMPT_TOKENS - 1)  # 192: two whole chunks
DEADLINES = {"lookup_timeout_s": 0.5, "load_timeout_s": 2.0, "save_timeout_s": 3.0, "breaker_cooldown_s": 2.0}


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)]


P, OLD, FROZEN_A, FROZEN_B = prompt(1), prompt(2), prompt(3), prompt(4)


def salted(tokens: list[int], salt: str) -> dict[str, Any]:
    return {"prompt_token_ids": tokens, "cache_salt": salt}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, vllm_engine_server: ForkServer) -> Any:
    vllm_engine_server.start()  # imports vLLM while the models and the daemon are made
    root = tmp_path_factory.mktemp("vllm-scope")
    dims = {"num_layers": LAYERS, "num_kv_heads": KV_HEADS, "head_dim": DIM}
    model_a = tiny_llama(root / "tune-a", weights=True, seed=1, **dims)
    model_b = tiny_llama(root / "tune-b", weights=True, seed=2, **dims)
    copy_a = Path(shutil.copytree(model_a, root / "tune-a-copy"))  # the same weights at another path
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK, **dims))
    base = {"block_size": BLOCK, "max_tokens": MAX_TOKENS, "load_format": "auto"}
    prompts = [P, OLD, FROZEN_A, FROZEN_B]
    reports = run_vllm_together({f"baseline-{name}": {**base, "model_dir": str(model), "connector": None,
                                                      "steps": [{"generate": prompts}]}
                                 for name, model in (("a", model_a), ("b", model_b))}, root)
    baseline = {name: {tuple(p): r for p, r in zip(prompts, reports[f"baseline-{name}"]["results"][0], strict=True)}
                for name in ("a", "b")}
    yield {"root": root, "daemon": daemon, "base": base, "a": model_a, "b": model_b, "copy_a": copy_a,
           "baseline": baseline}
    daemon.close()


def connector(world: Any, **extra: Any) -> dict[str, Any]:
    return {"url": world["daemon"].url, "chunk_tokens": CHUNK, **DEADLINES, **extra}


def test_fine_tunes_salts_and_old_keys_never_share_kv(world: Any) -> None:
    with KVStoreClient(world["daemon"].url) as client:  # OLD's chunks in the pre-scope format: daemon root + tokens
        keys = client.chunk_keys(OLD)
        assert client.put_many(keys, [torch.randn(client.layout.chunk_shape) for _ in keys]).ok
    steps = [{"generate": [OLD, P]}, {"generate": [salted(P, "tenant-1")]}, {"generate": [salted(P, "tenant-1")]},
             {"generate": [salted(P, "tenant-2"), P]}]
    a = run_vllm({**world["base"], "model_dir": str(world["a"]), "connector": connector(world, model_id="tune-a"),
                  "steps": steps}, world["root"] / "a")["results"]
    (old, p_first), (salt1_first,), (salt1_again,), (salt2, p_again) = a
    expected = world["baseline"]["a"]
    assert old["num_cached_tokens"] == 0, "chunks keyed the pre-scope way read as misses"
    assert old["token_ids"] == expected[tuple(OLD)]["token_ids"], "so the garbage under them is never served"
    assert [p_first["num_cached_tokens"], p_again["num_cached_tokens"]] == [0, CACHED]
    assert salt1_first["num_cached_tokens"] == 0, "a salted request loads nothing stored unsalted"
    assert salt1_again["num_cached_tokens"] == CACHED, "and loads what its own salt stored"
    assert salt2["num_cached_tokens"] == 0, "nor what another salt stored"
    for result in (p_first, salt1_first, salt1_again, salt2, p_again):
        assert result["token_ids"] == expected[tuple(P)]["token_ids"]

    # Both after A, side by side: B (another fine-tune) and A's weights at another path read disjoint key spaces
    after_a = run_vllm_together({
        "b": {**world["base"], "model_dir": str(world["b"]), "connector": connector(world),
              "steps": [{"generate": [P]}, {"generate": [P]}]},
        "copy": {**world["base"], "model_dir": str(world["copy_a"]), "connector": connector(world, model_id="tune-a"),
                 "steps": [{"generate": [P]}]}}, world["root"])
    (b_first,), (b_again,) = after_a["b"]["results"]
    assert b_first["num_cached_tokens"] == 0, "another fine-tune's KV (same layout) is never loaded"
    assert b_first["token_ids"] == world["baseline"]["b"][tuple(P)]["token_ids"]
    assert b_first["token_ids"] != expected[tuple(P)]["token_ids"], "the two fine-tunes answer differently"
    assert b_again["num_cached_tokens"] == CACHED and b_again["token_ids"] == b_first["token_ids"]

    ((shared,),) = after_a["copy"]["results"]
    assert shared["num_cached_tokens"] == CACHED, "model_id names the same weights at another path: they share"
    assert shared["token_ids"] == expected[tuple(P)]["token_ids"]


def test_a_frozen_daemon_costs_each_request_its_deadlines_at_most(world: Any) -> None:
    root, daemon = world["root"] / "frozen", world["daemon"]
    root.mkdir()
    warm = [{"generate": [P]}]  # stored by the previous test under model_id tune-a; if run alone, stores it now
    steps = [*warm, {"generate": [P]}, {"ready": str(root / "r1"), "wait_for": str(root / "go1")},
             {"generate": [P, FROZEN_A, FROZEN_B], "flush": False},
             {"ready": str(root / "r2"), "wait_for": str(root / "go2")},
             {"sleep": DEADLINES["breaker_cooldown_s"] + 0.5}, {"generate": [P, P]}]
    proc = run_vllm({**world["base"], "model_dir": str(world["a"]), "connector": connector(world, model_id="tune-a"),
                     "steps": steps}, root, wait=False)
    wait_for_file(root / "r1", proc)
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        (root / "go1").touch()
        wait_for_file(root / "r2", proc)
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    (root / "go2").touch()
    report = finish_vllm(proc, root)
    _, (before,), frozen, (probe, after) = report["results"]
    expected = world["baseline"]["a"]
    assert before["num_cached_tokens"] == CACHED
    assert all(r["num_cached_tokens"] == 0 for r in frozen), "a frozen daemon is a miss"
    for tokens, result in zip([P, FROZEN_A, FROZEN_B], frozen, strict=True):
        assert result["token_ids"] == expected[tuple(tokens)]["token_ids"]
    slowest, without_store = max(r["ttft_s"] for r in frozen), max(r["ttft_s"] for r in expected.values())
    budget = DEADLINES["lookup_timeout_s"] + DEADLINES["load_timeout_s"]
    print(f"frozen daemon: slowest request {slowest:.2f} s; slowest without a store {without_store:.2f} s; "
          f"lookup + load deadlines {budget:.1f} s")
    # Generous slack for a shared 2-core machine; the old behaviour waited out a 60 s client timeout per call.
    assert slowest < without_store + budget + 10, f"a request waited {slowest:.1f} s on a frozen daemon"
    assert "breaker open" in report["log"] and "breaker closed" in report["log"]
    assert after["num_cached_tokens"] == CACHED, "after SIGCONT hits come back without restarting the engine"
    assert probe["token_ids"] == after["token_ids"] == expected[tuple(P)]["token_ids"]
