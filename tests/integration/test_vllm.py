"""vLLM 0.32 (its own `LLM`, on CPU) with the kvstore connector against a real `kvstore serve` daemon.

Engine A computes and stores four prompts; a fresh engine B loads them (num_cached_tokens = whole
chunks) and answers token for token as a run without the connector; chunks overwritten with other
valid KV change the answer (the loaded KV is used); the daemon stopped mid-run and a chunk corrupted
on disk both make vLLM recompute, with the same answer and no exception.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")


from connector.client import KVStoreClient
from tests.helpers.forkserver import ForkServer
from tests.integration.conftest import (
    connector_identity,
    finish_vllm,
    graft_prefix,
    llama_layout,
    run_vllm,
    run_vllm_together,
    start_daemon,
    tiny_llama,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
BLOCK, CHUNK, PROMPT_TOKENS, MAX_TOKENS = 32, 64, 200, 8
CACHED = min(PROMPT_TOKENS // CHUNK * CHUNK, PROMPT_TOKENS - 1)  # 192: three whole chunks; vLLM computes the rest


def prompts(n: int) -> list[list[int]]:
    rng = random.Random(12)
    return [[rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for _ in range(n)]


PROMPTS = prompts(4)
# The negative control's donor: P0 with its cached prefix replaced by one repeated token.
DONOR = [5] * CACHED + PROMPTS[0][CACHED:]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, vllm_engine_server: ForkServer) -> Iterator[Any]:
    """The model, the daemon, the no-connector baseline and engine A's stores."""
    vllm_engine_server.start()  # imports vLLM while the model and the daemon are made
    root = tmp_path_factory.mktemp("vllm")
    model = str(tiny_llama(root / "model", weights=True))
    layout = llama_layout(CHUNK)
    daemon = start_daemon(root / "daemon", layout)
    base = {"model_dir": model, "load_format": "auto", "block_size": BLOCK, "max_tokens": MAX_TOKENS}
    connector = {"url": daemon.url, "chunk_tokens": CHUNK}
    reports = run_vllm_together({name: {**base, "connector": spec, "steps": [{"generate": [*PROMPTS, DONOR]}]}
                                 for name, spec in (("baseline", None), ("a", connector))}, root)
    baseline, engine_a = reports["baseline"], reports["a"]
    yield {"root": root, "daemon": daemon, "base": base, "connector": connector,
           "baseline": baseline["results"][0], "a": engine_a["results"][0]}
    daemon.close()


def test_engine_a_stores_whole_chunks_and_answers_as_without_connector(world: Any) -> None:
    assert [r["token_ids"] for r in world["a"]] == [r["token_ids"] for r in world["baseline"]]
    with KVStoreClient(world["daemon"].url) as client:
        scope = connector_identity(world["base"]["model_dir"], llama_layout(CHUNK), BLOCK).scope()
        assert [client.lookup(p, scope) for p in [*PROMPTS, DONOR]] == [CACHED] * (len(PROMPTS) + 1)
        assert [client.lookup(p) for p in PROMPTS] == [0] * len(PROMPTS), "the connector's keys are scoped"
        assert client.stats()["chunks"] >= (len(PROMPTS) + 1) * CACHED // CHUNK


def test_fresh_engine_b_loads_the_prefix_and_matches_the_baseline(world: Any) -> None:
    engine_b = run_vllm({**world["base"], "connector": world["connector"], "steps": [{"generate": PROMPTS[:2]}]},
                        world["root"] / "b")
    results = engine_b["results"][0]
    assert [r["num_cached_tokens"] for r in results] == [CACHED, CACHED]
    assert [r["token_ids"] for r in results] == [r["token_ids"] for r in world["baseline"][:2]]
    assert all(r["num_cached_tokens"] == 0 for r in world["baseline"]), "the baseline computes everything"


def test_overwritten_chunks_change_the_output(world: Any) -> None:
    """Negative control: P0's chunks replaced (through the API) by the KV the model computed for DONOR's prefix
    (same suffix, another prefix): vLLM then answers P0 exactly as it answers DONOR."""
    baseline_p0, baseline_donor = world["baseline"][0]["token_ids"], world["baseline"][-1]["token_ids"]
    assert baseline_p0 != baseline_donor, "the model's answer depends on the prefix (else no control)"
    scope = connector_identity(world["base"]["model_dir"], llama_layout(CHUNK), BLOCK).scope()  # the connector's key space
    graft_prefix(world["daemon"].url, scope, PROMPTS[0], DONOR)
    engine_c = run_vllm({**world["base"], "connector": world["connector"], "steps": [{"generate": [PROMPTS[0]]}]},
                        world["root"] / "c")
    (result,) = engine_c["results"][0]
    assert result["num_cached_tokens"] == CACHED
    assert result["token_ids"] != baseline_p0, "the loaded KV is what vLLM attends to"
    assert result["token_ids"] == baseline_donor


def test_daemon_stopped_mid_run_then_a_corrupt_chunk_are_recomputed(world: Any) -> None:
    root, daemon = world["root"] / "d", world["daemon"]
    root.mkdir()
    steps = [{"generate": [PROMPTS[2]]}, {"ready": str(root / "r1"), "wait_for": str(root / "go1")},
             {"generate": [PROMPTS[3]]}, {"ready": str(root / "r2"), "wait_for": str(root / "go2")},
             {"generate": [PROMPTS[1]]}]
    proc = run_vllm({**world["base"], "connector": world["connector"], "steps": steps}, root, wait=False)
    wait_for_file(root / "r1", proc)
    assert daemon.stop() == 0
    (root / "go1").touch()
    wait_for_file(root / "r2", proc)
    daemon.start()
    with KVStoreClient(daemon.url) as client:
        victim = client.chunk_keys(PROMPTS[1], connector_identity(world["base"]["model_dir"], llama_layout(CHUNK), BLOCK).scope())[1]
    corrupt_chunk_file(Path(daemon.config).parent, victim)
    (root / "go2").touch()
    report = finish_vllm(proc, root)
    loaded, daemon_down, corrupt = (r[0] for r in report["results"])
    baseline = world["baseline"]
    assert loaded["num_cached_tokens"] == CACHED and loaded["token_ids"] == baseline[2]["token_ids"]
    assert daemon_down["num_cached_tokens"] == 0, "with the daemon gone every lookup is a miss"
    assert daemon_down["token_ids"] == baseline[3]["token_ids"]
    assert corrupt["token_ids"] == baseline[1]["token_ids"], "the corrupt chunk was recomputed, not served"
    assert "failed to load; vLLM recomputes them" in report["log"]
    ours = [line for line in report["log"].splitlines() if 'File "' in line and "/connector/" in line]
    assert not ours, "no exception went through the connector:\n" + "\n".join(ours)


def test_embedded_store_survives_an_engine_restart(world: Any, tmp_path: Path) -> None:
    """No daemon: each engine process opens an embedded TieredStore on the same directory."""
    connector = {"root_dir": str(tmp_path / "store"), "chunk_tokens": CHUNK}
    first = run_vllm({**world["base"], "connector": connector, "steps": [{"generate": [PROMPTS[2]]}]}, tmp_path / "e1")
    second = run_vllm({**world["base"], "connector": connector, "steps": [{"generate": [PROMPTS[2]]}]}, tmp_path / "e2")
    (cold,), (warm,) = first["results"][0], second["results"][0]
    assert cold["num_cached_tokens"] == 0 and warm["num_cached_tokens"] == CACHED
    assert cold["token_ids"] == warm["token_ids"] == world["baseline"][2]["token_ids"]


def wait_for_file(path: Path, proc: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"vLLM exited early ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def corrupt_chunk_file(daemon_root: Path, key: bytes) -> None:
    """Flip payload bytes of the chunk's file on the NVMe tier (its header stays valid, so it is indexed)."""
    (path,) = list(daemon_root.rglob(f"{key.hex()}.*"))
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))
