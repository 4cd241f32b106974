"""EmbeddedStore (connector/embedded_store.py): the engine side over a TieredStore in the engine's process. A call
past its budget is a miss at the deadline while it keeps running on its worker thread, whose buffers stay its own
until `pending` completes; bad input still raises. The stalled store is a TieredStore whose reads wait on an event
(a stalled disk cannot be caused for real in a unit test)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from connector.deadlines import Deadlines
from connector.embedded_store import EmbeddedStore
from kvstore.config import StoreConfig
from kvstore.errors import BadChunkError
from kvstore.store import TieredStore
from tests.connector.test_vllm_plan_transfer import LAYOUT


class StalledReads(TieredStore):
    """Reads wait until `resume` is set: a store that stops answering."""

    resume = threading.Event()

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[bool]:  # type: ignore[override]
        self.resume.wait(60)
        return super().get_many(keys, outs)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[EmbeddedStore]:
    config = StoreConfig.embedded(layout=LAYOUT, root_dir=tmp_path, host_bytes=16 * LAYOUT.chunk_bytes,
                                  nvme_bytes=16 * (LAYOUT.chunk_bytes + 8192))
    StalledReads.resume = threading.Event()
    store = EmbeddedStore(StalledReads(config), Deadlines(load_timeout_s=0.2, breaker_cooldown_s=0.1), "test")
    yield store
    StalledReads.resume.set()
    store.close()


def test_a_read_past_its_budget_is_a_miss_and_keeps_its_buffers_until_it_ends(embedded: EmbeddedStore) -> None:
    keys = embedded.chunk_keys(list(range(2 * LAYOUT.chunk_tokens)))
    chunks = [torch.full(LAYOUT.chunk_shape, float(i + 1)) for i in range(2)]
    assert embedded.put_many(keys, chunks).ok and embedded.lookup_keys(keys) == 2
    outs = [torch.zeros(LAYOUT.chunk_shape) for _ in keys]
    late = embedded.get_guarded(keys, outs)
    assert late.value == [False, False] and late.pending is not None, "a miss now; the read still runs"
    assert embedded.breaker.is_open and embedded.counters["load_timeouts"] == 1
    StalledReads.resume.set()
    assert late.pending.result(timeout=30) == [True, True], "the late read ended and filled its own buffers"
    assert torch.equal(outs[1], chunks[1])


def test_bad_input_raises_through_the_embedded_store(embedded: EmbeddedStore) -> None:
    with pytest.raises(BadChunkError):
        embedded.lookup_keys([b"short"])
    assert not embedded.breaker.is_open
