"""`vllm serve` as users run it (OpenAI API server, V1 multiprocessing: engine core and worker in processes of
their own) beside a `kvstore serve` daemon, with settings no other test uses (block 64, chunk 128, head_dim 64;
vLLM's CPU attention takes block sizes in multiples of 32 only).

The three servers start side by side. A baseline server without the connector answers every prompt first. Server
A (connector) then computes and stores the shared prefixes and stops; server B, a fresh process group with
vLLM's own prefix cache off that has been asked nothing yet, then answers with the
expected cached tokens and the baseline's tokens: one request, 8 at once (one loading a long prefix), and
a two-turn conversation whose second turn should hit the first turn's answer too.
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

from bench.vllm_server import Completion, Launcher, ServeSpec, VLLMServer, live_group_members
from connector.client import KVStoreClient
from service.exposition import parse_samples
from service.process import Daemon
from tests.integration.conftest import llama_layout, start_daemon, start_servers, tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]
BLOCK, CHUNK, HEAD_DIM, MAX_TOKENS = 64, 128, 64, 8
SHARED_TOKENS, LONG_TOKENS = 260, 1000
TURN1_TOKENS, TURN1_ANSWER, TURN2_MESSAGE = 200, 100, 20


def whole_chunks(num_tokens: int) -> int:
    """Tokens of the whole chunks vLLM may take from kvstore for a prompt of num_tokens (it computes the last)."""
    return min(num_tokens // CHUNK * CHUNK, num_tokens - 1)


def token_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


SHARED = [token_ids(1, SHARED_TOKENS), token_ids(2, SHARED_TOKENS)]
LONG = token_ids(3, LONG_TOKENS)
FRESH = [token_ids(10 + i, 40 + 30 * i) for i in range(5)]  # never stored: computed beside the long load
CONCURRENT = [LONG, SHARED[1], *FRESH, SHARED[1][:200]]
TURN1 = token_ids(4, TURN1_TOKENS)
MESSAGE = token_ids(5, TURN2_MESSAGE)


@dataclass
class World:
    """The daemon, the baseline's answers and server B (connector on, fresh, vLLM's prefix cache off)."""

    daemon: Daemon
    model: Path
    baseline: dict[tuple[int, ...], Completion]
    turn1: Completion
    server_b: VLLMServer
    stopped_code: int | None  # None: still running (then the test fails)
    num_outlived: int
    num_left: int


def spec(model: Path, daemon: Daemon | None) -> ServeSpec:
    connector = {"url": daemon.url, "chunk_tokens": CHUNK} if daemon is not None else None
    return ServeSpec(model_dir=model, load_format="auto", block_size=BLOCK, connector=connector,
                     kv_cache_bytes=256 << 20, max_model_len=2048)


def chunks_in(daemon: Daemon) -> int:
    with KVStoreClient(daemon.url) as client:
        return int(client.stats()["chunks"])


def wait_for_chunks(daemon: Daemon, num_chunks: int, timeout_s: float = 120.0) -> bool:
    """Poll the daemon until it holds num_chunks chunks (the connector stores in the background)."""
    deadline = time.monotonic() + timeout_s
    while chunks_in(daemon) < num_chunks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def turn2_of(turn1: Completion) -> list[int]:
    return [*TURN1, *turn1.token_ids, *MESSAGE]


def baseline_answers(server: VLLMServer) -> dict[tuple[int, ...], Completion]:
    """Every prompt through the server without the connector; the server then stopped."""
    try:
        answers = {tuple(p): server.complete(p, MAX_TOKENS) for p in [*SHARED, *CONCURRENT]}
        answers[tuple(TURN1)] = turn1 = server.complete(TURN1, TURN1_ANSWER)
        answers[tuple(turn2_of(turn1))] = server.complete(turn2_of(turn1), MAX_TOKENS)
    finally:
        server.stop()
    return answers


def store_with_server_a(server_a: VLLMServer, daemon: Daemon) -> Completion:
    """Server A computes the shared prefixes, the long one and turn 1 (with its answer), storing their chunks.
    vLLM's SIGTERM kills its engine at once, so the chunks are awaited while A still runs."""
    with server_a:
        for prompt in [*SHARED, LONG]:
            server_a.complete(prompt, MAX_TOKENS)
        turn1 = server_a.complete(TURN1, TURN1_ANSWER)
        prompt_chunks = sum(len(p) // CHUNK for p in [*SHARED, LONG, TURN1])  # computed by the prefills
        assert wait_for_chunks(daemon, prompt_chunks), f"server A stored {chunks_in(daemon)} of {prompt_chunks}"
        history_chunks = (TURN1_TOKENS + TURN1_ANSWER - 1) // CHUNK - TURN1_TOKENS // CHUNK  # turn 1's answer's
        assert wait_for_chunks(daemon, prompt_chunks + history_chunks), "turn 1's answer chunks (save_decode)"
    return turn1


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, serve_launcher: Launcher) -> Iterator[World]:
    root = tmp_path_factory.mktemp("vllm_serve")
    model = tiny_llama(root / "model", head_dim=HEAD_DIM, weights=True)
    daemon = start_daemon(root / "daemon", llama_layout(CHUNK, head_dim=HEAD_DIM), host_chunks=128, nvme_chunks=256,
                          start_timeout_s=300.0)  # imports take a minute on a loaded machine
    try:
        # All three side by side (each start imports vLLM and loads the model); B asks for nothing until A stopped
        stopped, server_a, server_b = start_servers(*(VLLMServer(spec(model, d), root / log, launcher=serve_launcher)
                                                      for d, log in ((None, "baseline.log"), (daemon, "server_a.log"),
                                                                     (daemon, "server_b.log"))))
        with server_a, server_b:  # stopped on any failure; A stops on its own once it stored
            baseline = baseline_answers(stopped)
            assert stopped.proc is not None
            turn1 = store_with_server_a(server_a, daemon)
            yield World(daemon, model, baseline, turn1, server_b, stopped.proc.returncode, stopped.num_outlived,
                        len(live_group_members(stopped.proc.pid)))
    finally:
        daemon.close()


def test_stop_ends_the_server_and_its_engine_processes(world: World) -> None:
    assert world.stopped_code == 0, f"vllm serve exited {world.stopped_code} on SIGTERM"
    assert world.num_outlived == 0, "vLLM's engine core or worker outlived its API server"
    assert world.num_left == 0, "nothing of the process group runs after stop()"


def test_second_server_answers_a_shared_prefix_from_kvstore(world: World) -> None:
    done = world.server_b.complete(SHARED[0], MAX_TOKENS)
    expected = world.baseline[tuple(SHARED[0])]
    assert expected.num_cached_tokens == 0, "the baseline computes everything"
    assert done.num_cached_tokens == whole_chunks(SHARED_TOKENS) > 0
    assert done.token_ids == expected.token_ids


def daemon_metrics(daemon: Daemon, model: Path) -> dict[str, float]:
    """The daemon's kvstore_model_* samples of `model` (no auth here: the default tenant), by name and tier."""
    samples = parse_samples(httpx.get(f"{daemon.url}/metrics", timeout=30.0).text)
    mine = {("tenant", "default"), ("model", str(model))}
    return {name + "".join(f"{{{k}={v}}}" for k, v in sorted(labels - mine)): value
            for (name, labels), value in samples.items() if mine <= labels}


def test_daemon_metrics_count_the_hit_under_the_models_label(world: World) -> None:
    """The connector names vLLM's model to the daemon: its /metrics give the hit per model and per tier."""
    before = daemon_metrics(world.daemon, world.model)
    done = world.server_b.complete(SHARED[0], MAX_TOKENS)
    after = daemon_metrics(world.daemon, world.model)
    num_chunks = whole_chunks(SHARED_TOKENS) // CHUNK
    assert done.num_cached_tokens == num_chunks * CHUNK > 0

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("kvstore_model_lookup_hit_chunks_total") >= num_chunks, sorted(after)
    assert grew("kvstore_model_get_hit_chunks_total{tier=host}") == num_chunks
    assert grew("kvstore_model_get_hit_bytes_total{tier=host}") == num_chunks * llama_layout(CHUNK, head_dim=HEAD_DIM).chunk_bytes


def test_eight_concurrent_requests_one_loading_a_long_prefix_all_correct(world: World) -> None:
    hits_before = world.server_b.metric_total("vllm:external_prefix_cache_hits_total")
    answers = world.server_b.complete_many(CONCURRENT, MAX_TOKENS)
    for prompt, done in zip(CONCURRENT, answers, strict=True):
        assert done.token_ids == world.baseline[tuple(prompt)].token_ids, f"{len(prompt)}-token prompt"
    cached = [done.num_cached_tokens for done in answers]
    assert cached[0] == whole_chunks(LONG_TOKENS), "the long prefix came from kvstore"
    assert cached[1] == whole_chunks(SHARED_TOKENS)
    assert cached[2:7] == [0] * len(FRESH), "never stored: computed"
    assert cached[7] == whole_chunks(200)
    hits = world.server_b.metric_total("vllm:external_prefix_cache_hits_total") - hits_before
    assert hits == sum(cached), "vLLM's /metrics count the connector's tokens"


def test_second_turn_hits_the_first_turns_answer(world: World) -> None:
    """Turn 2 = turn 1's prompt + its answer + a new message, on another server than turn 1: its whole history
    is in kvstore, not only turn 1's prompt (server B's own prefix cache is off: every cached token is kvstore's)."""
    assert world.turn1.token_ids == world.baseline[tuple(TURN1)].token_ids
    turn2 = turn2_of(world.turn1)
    done = world.server_b.complete(turn2, MAX_TOKENS)
    assert done.token_ids == world.baseline[tuple(turn2)].token_ids
    history = TURN1_TOKENS + TURN1_ANSWER - 1  # the last answer token's KV is never computed
    assert done.num_cached_tokens > whole_chunks(TURN1_TOKENS + 1), "more than turn 1's prompt"
    assert done.num_cached_tokens == history // CHUNK * CHUNK, "the whole history's chunks"
