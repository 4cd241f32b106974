"""`BackgroundSaver`: a step only pins pages and queues; the put happens on the saver thread, the pages
stay the sequence's until their chunks are in the store, and a full queue holds the step back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from connector.engine.llm_engine import LLMEngine
from connector.engine.saver import BackgroundSaver
from connector.engine.sequence import SamplingParams
from kvstore.store import TieredStore
from kvstore.types import PutResult
from tests.connector.conftest import CHUNK, engine_config, make_store, prompt


class GatedStore:
    """The real store, with puts held at a gate: a slow disk or daemon, which a test cannot make on demand."""

    def __init__(self, store: TieredStore) -> None:
        self._store = store
        self.gate = threading.Event()
        self.puts_started = threading.Semaphore(0)

    def put_many(self, keys: list[bytes], chunks: list[torch.Tensor]) -> PutResult:
        self.puts_started.release()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return self._store.put_many(keys, chunks)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def _eventually(predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[GatedStore]:
    with make_store(tmp_path) as store:
        yield GatedStore(store)


def test_a_finished_request_keeps_its_pages_pinned_until_its_chunks_are_stored(gated: GatedStore) -> None:
    engine = LLMEngine.with_store(engine_config(), gated)  # type: ignore[arg-type]
    assert engine.connector is not None
    tokens = prompt(1, 3 * CHUNK + 5)
    seq = engine.add_request(tokens, SamplingParams(max_tokens=2))
    pages = None
    while engine.has_unfinished():
        pages = list(seq.block_ids) or pages
        engine.step()
    assert pages is not None and seq.is_finished_by_params
    pinned = pages[: 3 * CHUNK // engine.config.page_size]
    assert all(engine.pool.ref_counts[b] > 0 for b in pinned), "finished, but its chunks are not stored yet"
    assert gated.lookup(tokens, engine.connector.scope) == 0  # type: ignore[operator]
    gated.gate.set()
    engine.wait_for_save()
    assert all(engine.pool.ref_counts[b] == 0 for b in pages)
    assert gated.lookup(tokens, engine.connector.scope) == 3 * CHUNK  # type: ignore[operator]
    engine.close()


def test_a_full_queue_blocks_the_submitter_and_counts_a_wait(gated: GatedStore) -> None:
    engine = LLMEngine.with_store(engine_config(), gated)  # type: ignore[arg-type]
    assert engine.connector is not None and engine.saver is not None
    engine.saver.close()
    saver = BackgroundSaver(engine.connector, engine.pool, engine.runner.kv_cache, max_jobs=1)
    pages = engine.pool.allocate(4 * CHUNK // engine.config.page_size)
    tokens = prompt(2, 4 * CHUNK)
    saver.submit(tokens, pages, num_tokens=CHUNK, first_chunk=0)
    assert gated.puts_started.acquire(timeout=60)  # the thread holds job 1 at the gate
    saver.submit(tokens, pages, num_tokens=2 * CHUNK, first_chunk=1)  # job 2 fills the queue
    third = threading.Thread(target=saver.submit, args=(tokens, pages),
                             kwargs={"num_tokens": 3 * CHUNK, "first_chunk": 2})
    third.start()
    assert _eventually(lambda: saver.counters["waits"] == 1)
    assert third.is_alive(), "a full queue must hold the submitter back"
    gated.gate.set()
    third.join(timeout=60)
    assert not third.is_alive()
    saver.close()
    assert gated.lookup(tokens, engine.connector.scope) == 3 * CHUNK and saver.counters == {"jobs": 3, "waits": 1, "failed": 0}  # type: ignore[operator]
    assert [engine.pool.ref_counts[b] for b in pages] == [1] * len(pages), "every pin was released"
