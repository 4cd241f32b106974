"""Two different tiny models, `vllm serve` side by side against one `kvstore serve` started with no [layout]:
model A (2 layers, 2 KV heads of 64, block 64, chunk 128) and model B (3 layers, 1 KV head of 32, block 32, chunk
64), settings no other test uses. Each connector registers its model's layout with the daemon; both ask the same
token ids. Each server hits its own prefixes and none of the other's (the same tokens under the other model are
computed), and answers exactly as vLLM alone does (a baseline server per model, without the connector).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

from bench.vllm_server import Completion, Launcher, ServeSpec, VLLMServer
from service.process import Daemon
from tests.integration.conftest import llama_layout, start_daemon, start_servers, tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]
MAX_TOKENS, PROMPT_TOKENS = 6, 300


@dataclass(frozen=True)
class Model:
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block: int
    chunk: int
    seed: int

    def whole_chunks(self, num_tokens: int) -> int:
        """Tokens vLLM may take from kvstore for a prompt (whole chunks; it always computes the last token)."""
        return min(num_tokens // self.chunk * self.chunk, num_tokens - 1)

    def spec(self, model_dir: Path, daemon: Daemon | None) -> ServeSpec:
        connector = {"url": daemon.url, "chunk_tokens": self.chunk} if daemon is not None else None
        return ServeSpec(model_dir=model_dir, load_format="auto", block_size=self.block, connector=connector,
                         kv_cache_bytes=128 << 20, max_model_len=1024, max_num_seqs=4)


A = Model("a", num_layers=2, num_kv_heads=2, head_dim=64, block=64, chunk=128, seed=0)
B = Model("b", num_layers=3, num_kv_heads=1, head_dim=32, block=32, chunk=64, seed=1)
PROMPTS = [[random.Random(seed).randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for seed in (41, 42)]


@dataclass
class World:
    daemon: Daemon
    baseline: dict[tuple[str, int], Completion]  # (model, prompt index) -> vLLM alone's answer
    first: dict[tuple[str, int], Completion]  # the connector servers' first answers (both models asked)
    servers: dict[str, VLLMServer]


def stored_chunks(daemon: Daemon) -> int:
    return int(httpx.get(f"{daemon.url}/v1/stats", timeout=30.0).json()["chunks"])


def wait_for_chunks(daemon: Daemon, num_chunks: int, timeout_s: float = 120.0) -> None:
    """Poll until the daemon holds `num_chunks` (the connectors store in the background)."""
    deadline = time.monotonic() + timeout_s
    while stored_chunks(daemon) < num_chunks:
        assert time.monotonic() < deadline, f"the daemon holds {stored_chunks(daemon)} of {num_chunks} chunks"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, serve_launcher: Launcher) -> Iterator[World]:
    root = tmp_path_factory.mktemp("vllm_two_models")
    dirs = {m.name: tiny_llama(root / m.name, num_layers=m.num_layers, num_kv_heads=m.num_kv_heads,
                               head_dim=m.head_dim, weights=True, seed=m.seed) for m in (A, B)}
    # no [layout]: the tiers are sized in chunks of A's layout, which the daemon does not serve by default
    daemon = start_daemon(root / "daemon", llama_layout(A.chunk, head_dim=A.head_dim), host_chunks=64,
                          nvme_chunks=128, start_timeout_s=300.0, any_layout=True)
    try:
        servers = start_servers(*(VLLMServer(m.spec(dirs[m.name], d), root / f"{m.name}-{kind}.log",
                                             launcher=serve_launcher)
                                  for m in (A, B) for kind, d in (("alone", None), ("kvstore", daemon))))
        alone = {"a": servers[0], "b": servers[2]}
        connected = {"a": servers[1], "b": servers[3]}
        with connected["a"], connected["b"]:
            baseline = {}
            for name, server in alone.items():
                with server:
                    baseline.update({(name, i): server.complete(p, MAX_TOKENS) for i, p in enumerate(PROMPTS)})
            first, num_stored = {}, 0
            for model in (A, B):  # A's chunks of these tokens are all stored before B asks the same tokens
                for i, prompt in enumerate(PROMPTS):
                    first[(model.name, i)] = connected[model.name].complete(prompt, MAX_TOKENS)
                num_stored += sum(len(p) // model.chunk for p in PROMPTS)
                wait_for_chunks(daemon, num_stored)
            yield World(daemon, baseline, first, connected)
    finally:
        daemon.close()


def test_the_daemon_with_no_layout_serves_both_models(world: World) -> None:
    info = httpx.get(f"{world.daemon.url}/v1/info", timeout=30.0).json()
    assert info["any_layout"] is True


def test_neither_model_hits_the_other_models_chunks_of_the_same_tokens(world: World) -> None:
    """B asks each prompt right after A stored its chunks for the same token ids: B computes everything."""
    for (name, i), done in world.first.items():
        assert done.num_cached_tokens == 0, f"model {name}, prompt {i}: {done.num_cached_tokens} tokens not its own"
        assert done.token_ids == world.baseline[(name, i)].token_ids, f"model {name}, prompt {i}"


@pytest.mark.parametrize("model", [A, B], ids=["model-a", "model-b"])
def test_each_model_hits_its_own_prefixes_with_vllm_alones_answers(world: World, model: Model) -> None:
    for i, prompt in enumerate(PROMPTS):
        done = world.servers[model.name].complete(prompt, MAX_TOKENS)
        assert done.num_cached_tokens == model.whole_chunks(PROMPT_TOKENS) > 0, f"prompt {i}"
        assert done.token_ids == world.baseline[(model.name, i)].token_ids, f"prompt {i}"
