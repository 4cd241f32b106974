"""`kvstore pd-proxy` in front of a prefill `vllm serve` (kv_producer) and a decode `vllm serve` (kv_consumer)
on one daemon: streamed answers through the proxy equal the decode server's own answers computed alone,
the decode server loads all the prefill server saved (every whole chunk and the partial last one) and
computes only each prompt's last token, and a killed prefill server degrades to decode-side prefill without
a failed request (the proxy counts the fallbacks).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import httpx

from bench.pd_proxy_process import PDProxy
from bench.vllm_server import Completion, Launcher, ServeSpec, VLLMServer, stream_completion
from service.process import Daemon
from tests.integration.conftest import llama_layout, start_daemon, start_servers, tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]
BLOCK, CHUNK, MAX_TOKENS = 32, 128, 6
LENGTHS = (300, 256, 100, 700)  # a partial last chunk, whole chunks only, under one chunk, several chunks


def token_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def loadable(num_tokens: int) -> int:
    """What a decode server takes from kvstore: the whole prompt (a producer saves its partial last chunk
    too), but never its last token."""
    return num_tokens - 1


def spec(model: Path, daemon: Daemon, role: str) -> ServeSpec:
    return ServeSpec(model_dir=model, load_format="auto", block_size=BLOCK, kv_role=role, kv_cache_bytes=192 << 20,
                     connector={"url": daemon.url, "chunk_tokens": CHUNK, "handoff_wait_s": 20}, max_model_len=2048)


def stream_all(url: str, prompts: Sequence[Sequence[int]]) -> list[Completion]:
    """Every prompt at once through `url`, streamed."""

    async def run() -> list[Completion]:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0)) as client:
            return list(await asyncio.gather(*(stream_completion(client, p, MAX_TOKENS) for p in prompts)))

    return asyncio.run(run())


@dataclass
class World:
    daemon: Daemon
    prefill: VLLMServer
    decode: VLLMServer
    proxy: PDProxy


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, serve_launcher: Launcher) -> Iterator[World]:
    root = tmp_path_factory.mktemp("vllm_pd_proxy")
    model = tiny_llama(root / "model", weights=True, seed=3)
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK), host_chunks=96, nvme_chunks=0, start_timeout_s=300.0)
    prefill = VLLMServer(spec(model, daemon, "kv_producer"), root / "prefill.log", launcher=serve_launcher)
    decode = VLLMServer(spec(model, daemon, "kv_consumer"), root / "decode.log", launcher=serve_launcher)
    try:
        with prefill, decode:
            start_servers(prefill, decode)
            with PDProxy([prefill.url], [decode.url], root / "proxy.log", extra_args=["--health-interval", "0.5"]).start() as proxy:
                yield World(daemon, prefill, decode, proxy)
    finally:
        daemon.close()


def test_streamed_answers_through_the_proxy_equal_the_decode_servers_own(world: World) -> None:
    prompts = [token_ids(10 + i, n) for i, n in enumerate(LENGTHS)]
    alone = stream_all(world.decode.url, prompts)  # a kv_consumer without a handoff computes (and saves nothing)
    assert [c.num_cached_tokens for c in alone] == [0] * len(prompts)
    through = stream_all(world.proxy.url, prompts)
    for prompt, mine, reference in zip(prompts, through, alone, strict=True):
        assert mine.token_ids == reference.token_ids, f"{len(prompt)}-token prompt"
        assert mine.num_cached_tokens == loadable(len(prompt)), f"{len(prompt)}-token prompt"
    assert world.proxy.metric_total("kvstore_pd_prefill_fallbacks_total") == 0  # under one chunk too: its tail is saved


def test_a_killed_prefill_server_degrades_to_decode_side_prefill(world: World) -> None:
    prompts = [token_ids(40 + i, n) for i, n in enumerate(LENGTHS)]
    before = world.proxy.metric_total("kvstore_pd_prefill_fallbacks_total")
    world.prefill.stop(timeout_s=5.0)
    through = stream_all(world.proxy.url, prompts)
    alone = stream_all(world.decode.url, prompts)
    assert [c.token_ids for c in through] == [c.token_ids for c in alone]
    assert [c.num_cached_tokens for c in through] == [0] * len(prompts)
    assert world.proxy.metric_total("kvstore_pd_prefill_fallbacks_total") - before == len(prompts)
