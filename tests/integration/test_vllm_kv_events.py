"""vLLM 0.32 (its own `LLM`, on CPU) publishing KV events with the kvstore connector: the blocks the connector saves
to kvstore come out of vLLM's own ZMQ publisher (through `take_events()`) as BlockStored at vLLM's block size and
block hashes, the same hashes vLLM announces for its own cache, read by an independent subscriber."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run the integration suite in scripts/integration_env.sh's env")

import zmq
from msgspec.msgpack import Decoder

from service.process import free_port
from tests.integration.conftest import llama_layout, run_vllm, start_daemon, tiny_llama
from tests.service.kv_event_subscriber import BlockStored, KVEventBatch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
BLOCK, CHUNK, PROMPT_TOKENS, MAX_TOKENS = 32, 64, 200, 4
WHOLE = PROMPT_TOKENS // CHUNK * CHUNK  # 192: the whole chunks the connector saves


def _collect(sub: zmq.Socket[bytes], stop: threading.Event, out: list[tuple[int, bytes]]) -> None:
    while not stop.is_set():
        if sub.poll(100):
            _, seq, payload = sub.recv_multipart()
            out.append((int.from_bytes(seq, "big"), payload))


def test_connector_saves_are_published_at_vllm_block_hashes(tmp_path: Path) -> None:
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for _ in range(2)]
    model = str(tiny_llama(tmp_path / "model", weights=True))
    daemon = start_daemon(tmp_path / "daemon", llama_layout(CHUNK))
    port = free_port()
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.bind(f"tcp://127.0.0.1:{port}")  # vLLM's publisher connects to an endpoint without a wildcard
    sub.setsockopt_string(zmq.SUBSCRIBE, "kv-events")
    frames: list[tuple[int, bytes]] = []
    stop = threading.Event()
    reader = threading.Thread(target=_collect, args=(sub, stop, frames), daemon=True)
    reader.start()
    try:
        run_vllm({"model_dir": model, "load_format": "auto", "block_size": BLOCK, "max_tokens": MAX_TOKENS,
                  "prefix_caching": True, "connector": {"url": daemon.url, "chunk_tokens": CHUNK, "save_decode": False},
                  "kv_events": {"endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv-events"},
                  "steps": [{"generate": prompts}]}, tmp_path / "engine")
    finally:
        stop.set()
        reader.join(10)
        sub.close(linger=0)
        context.term()
        daemon.close()
    decoder = Decoder(type=KVEventBatch)
    stored = [e for _, payload in frames for e in decoder.decode(payload).events if isinstance(e, BlockStored)]
    ours = [e for e in stored if e.ownership == "kvstore"]
    vllm_blocks = {h: e.token_ids[j * e.block_size:(j + 1) * e.block_size]  # vLLM's own: hash -> its block's tokens
                   for e in stored if e.ownership is None for j, h in enumerate(e.block_hashes)}
    assert frames, "no KV event batch reached the subscriber"
    assert len(ours) == len(prompts), [(e.medium, len(e.block_hashes)) for e in stored]  # one save per prompt
    for event in ours:
        prompt = next(p for p in prompts if p[:WHOLE] == event.token_ids)
        assert (event.block_size, event.medium, event.parent_block_hash) == (BLOCK, "CPU", None)
        assert len(event.block_hashes) == WHOLE // BLOCK
        for i, h in enumerate(event.block_hashes):  # the hash vLLM itself gave this block of this prompt
            assert vllm_blocks[h] == prompt[i * BLOCK:(i + 1) * BLOCK]
