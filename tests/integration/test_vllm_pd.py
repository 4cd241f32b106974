"""Prefill/decode disaggregation with `vllm serve`: a prefill server (kv_role kv_producer) and a decode server
(kv_consumer), in vLLM's default process layout, joined through kvstore; settings no other test uses (3 layers,
4 KV heads, head_dim 96, block 32, chunk 160).

The prefill server answers each prompt with one token and names the chunks it saved in its answer's
`kv_transfer_params`, the prompt's partial last chunk included; the decode server gets the prompt with those
params, loads them (waiting for any still in flight) and computes only the prompt's last token. Answers must
equal a server without the connector, token for token. First through one daemon, then across "nodes": two
daemons over one shared PFS directory, the prefill server on one (saving whole chunks only, so the decode
server recomputes each partial last chunk), the decode server on the other.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import httpx

from bench.vllm_server import SERVED_MODEL, Completion, Launcher, ServeSpec, VLLMServer, stream_completion
from connector.client import KVStoreClient
from kvstore.layout import KVLayout
from service.process import Daemon
from tests.integration.conftest import llama_layout, start_daemon, start_servers, tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]
BLOCK, CHUNK, LAYERS, KV_HEADS, HEAD_DIM, MAX_TOKENS = 32, 160, 3, 4, 96, 6
LENGTHS = (480, 517, 700, 159, 321, 800, 1000, 333)  # whole chunks only, a partial chunk, under one chunk, ...
DIMS = {"num_layers": LAYERS, "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM}


def token_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


PROMPTS = [token_ids(100 + i, n) for i, n in enumerate(LENGTHS)]
CROSS_NODE = [token_ids(200 + i, n) for i, n in enumerate((640, 555, 401))]


def loadable(num_tokens: int, tail: bool = True) -> int:
    """What a decode server takes from kvstore: every whole chunk and the handed-over partial one (`tail`),
    but never the prompt's last token."""
    return num_tokens - 1 if tail else min(num_tokens // CHUNK * CHUNK, num_tokens - 1)


def spec(model: Path, url: str | None, role: str = "kv_both", tail: bool = True) -> ServeSpec:
    connector = {"url": url, "chunk_tokens": CHUNK, "handoff_wait_s": 20, "save_partial_chunk": tail} if url else None
    return ServeSpec(model_dir=model, load_format="auto", block_size=BLOCK, connector=connector, kv_role=role,
                     kv_cache_bytes=192 << 20, max_model_len=2048)


async def prefill(client: httpx.AsyncClient, prompt: Sequence[int]) -> dict[str, Any] | None:
    """The prefill half: one token, not streamed; the answer's kv_transfer_params (what the proxy forwards;
    none for a prompt under one chunk: nothing was saved)."""
    body = {"model": SERVED_MODEL, "prompt": list(prompt), "max_tokens": 1, "temperature": 0.0,
            "kv_transfer_params": {"do_remote_decode": True}}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    params = response.json().get("kv_transfer_params")
    assert isinstance(params, dict), f"the prefill answer carries no kv_transfer_params: {response.text[:500]}"
    return params


def disaggregated(prefill_url: str, decode_url: str, prompts: Sequence[Sequence[int]]) -> list[Completion]:
    """Every prompt prefilled on one server and decoded on the other, all at once (streamed from the decode)."""

    async def one(p: httpx.AsyncClient, d: httpx.AsyncClient, prompt: Sequence[int]) -> Completion:
        params = await prefill(p, prompt)
        return await stream_completion(d, prompt, MAX_TOKENS, kv_transfer_params=params)

    async def run() -> list[Completion]:
        timeout = httpx.Timeout(900.0)
        async with (httpx.AsyncClient(base_url=prefill_url, timeout=timeout) as p,
                    httpx.AsyncClient(base_url=decode_url, timeout=timeout) as d):
            return list(await asyncio.gather(*(one(p, d, prompt) for prompt in prompts)))

    return asyncio.run(run())


def computed_prompt_tokens(server: VLLMServer) -> float:
    """vLLM's own count of the prompt tokens it computed (not cached), summed over finished requests."""
    return server.metric_total("vllm:request_prefill_kv_computed_tokens_sum")


def chunks_in(url: str) -> int:
    with KVStoreClient(url) as client:
        return int(client.stats()["chunks"])


@dataclass
class World:
    model: Path
    baseline: dict[tuple[int, ...], list[int]]
    daemon: Daemon
    producer: VLLMServer
    consumer: VLLMServer


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, serve_launcher: Launcher) -> Iterator[World]:
    root = tmp_path_factory.mktemp("vllm_pd")
    model = tiny_llama(root / "model", weights=True, seed=7, **DIMS)
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK, **DIMS), host_chunks=96, nvme_chunks=0,
                          start_timeout_s=300.0)
    try:
        alone, producer, consumer = start_servers(*(VLLMServer(spec(model, url, role), root / log, launcher=serve_launcher)
                                                    for url, role, log in ((None, "kv_both", "colocated.log"),
                                                                           (daemon.url, "kv_producer", "prefill.log"),
                                                                           (daemon.url, "kv_consumer", "decode.log"))))
        with producer, consumer:
            with alone:
                baseline = {tuple(p): alone.complete(p, MAX_TOKENS).token_ids for p in [*PROMPTS, *CROSS_NODE]}
            yield World(model, baseline, daemon, producer, consumer)
    finally:
        daemon.close()


def test_decode_server_computes_only_the_last_token_and_answers_as_one_colocated_server(world: World) -> None:
    computed_before = computed_prompt_tokens(world.consumer)
    answers = disaggregated(world.producer.url, world.consumer.url, PROMPTS)
    for prompt, done in zip(PROMPTS, answers, strict=True):
        assert done.token_ids == world.baseline[tuple(prompt)], f"{len(prompt)}-token prompt"
        assert done.num_cached_tokens == loadable(len(prompt)), f"{len(prompt)}-token prompt"
    computed = computed_prompt_tokens(world.consumer) - computed_before
    assert computed == len(PROMPTS), "the decode server computed one token of each prompt: its last"


def test_the_producer_never_loads_and_the_consumer_never_saves(world: World) -> None:
    held = chunks_in(world.daemon.url)
    again = world.producer.complete(PROMPTS[0], 1)  # its chunks are in kvstore; vLLM's prefix cache is off
    assert again.num_cached_tokens == 0, "a kv_producer computes its prompts"
    fresh = token_ids(999, 700)
    done = world.consumer.complete(fresh, MAX_TOKENS)  # no handoff, nothing stored: computed, and not saved
    assert done.num_cached_tokens == 0
    assert world.consumer.metric_total("vllm:kvstore_queued_save_chunks_total") == 0
    assert chunks_in(world.daemon.url) == held, "a kv_consumer saved nothing"


def test_a_foreign_or_malformed_handoff_is_ignored_not_an_error(world: World) -> None:
    prompt = token_ids(31, 500)
    bogus = {"kvstore_handoff": {"chunks": 3, "last_key": "00" * 16}}
    for params in (bogus, {"kvstore_handoff": "nonsense"}):
        async def run(p: dict[str, Any] = params) -> Completion:
            async with httpx.AsyncClient(base_url=world.consumer.url, timeout=httpx.Timeout(900.0)) as client:
                return await stream_completion(client, prompt, MAX_TOKENS, kv_transfer_params=p)

        done = asyncio.run(run())
        assert done.num_cached_tokens == 0 and len(done.token_ids) == MAX_TOKENS


def shared_pfs_config(root: Path, shared: Path, layout: KVLayout) -> Path:
    """A daemon of one "node": its own host tier, the PFS directory every node mounts."""
    lines = ['model_id = "pd-cross-node"', "[layout]"]
    lines += [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in layout.to_dict().items()]
    lines += ["[[tiers]]", 'kind = "host"', f"capacity = '{64 * layout.chunk_bytes}B'",
              "[[tiers]]", 'kind = "pfs"', f"capacity = '{256 * (layout.chunk_bytes + 8192)}B'",
              f'path = "{shared}"']
    root.mkdir(parents=True, exist_ok=True)
    (root / "kvstore.toml").write_text("\n".join(lines) + "\n")
    return root / "kvstore.toml"


def test_across_nodes_through_a_shared_pfs_tier(world: World, tmp_path: Path, serve_launcher: Launcher) -> None:
    """Prefill on node A's daemon, decode on node B's: nothing but the PFS directory joins them. The prefill
    server saves whole chunks only (save_partial_chunk false): the decode server computes the partial last
    chunk of each prompt, and nothing more (vLLM's own count)."""
    layout = llama_layout(CHUNK, **DIMS)
    daemons = [Daemon(shared_pfs_config(tmp_path / name, tmp_path / "pfs", layout), tmp_path / f"{name}.log")
               for name in ("node_a", "node_b")]
    try:
        for daemon in daemons:
            daemon.start(timeout_s=300.0)
        servers = start_servers(VLLMServer(spec(world.model, daemons[0].url, "kv_producer", tail=False), tmp_path / "p.log",
                                           launcher=serve_launcher),
                                VLLMServer(spec(world.model, daemons[1].url, "kv_consumer"), tmp_path / "d.log",
                                           launcher=serve_launcher))
        with servers[0], servers[1]:
            answers = disaggregated(servers[0].url, servers[1].url, CROSS_NODE)
            computed = computed_prompt_tokens(servers[1])
        for prompt, done in zip(CROSS_NODE, answers, strict=True):
            assert done.token_ids == world.baseline[tuple(prompt)], f"{len(prompt)}-token prompt"
            assert done.num_cached_tokens == loadable(len(prompt), tail=False), f"{len(prompt)}-token prompt"
        assert computed == sum(len(p) - loadable(len(p), tail=False) for p in CROSS_NODE)
        assert all(0 < len(p) - loadable(len(p), tail=False) < CHUNK for p in CROSS_NODE)
    finally:
        for daemon in daemons:
            daemon.close()
