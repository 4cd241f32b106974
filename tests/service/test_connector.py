"""The engine through the sidecar: KVConnector over KVStoreClient gives the same greedy outputs as
without a store, and the second pass loads the shared prefixes from the daemon."""

from __future__ import annotations

from typing import Any

import pytest

from connector.client import KVStoreClient
from connector.engine.llm_engine import LLMEngine
from connector.engine.sequence import SamplingParams
from tests.connector.conftest import CHUNK, engine_config
from tests.connector.test_store_path import workload


@pytest.mark.parametrize("use_shm", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["shm", "http"])
def test_engine_outputs_identical_through_the_daemon(daemon: Any, use_shm: Any) -> None:
    sampling = SamplingParams(max_tokens=8)
    want = LLMEngine(engine_config()).generate(workload(), sampling)
    with KVStoreClient(daemon.url, use_shm=use_shm) as client:
        assert client.use_shm is use_shm
        assert LLMEngine.with_store(engine_config(), client).generate(workload(), sampling) == want
        again = LLMEngine.with_store(engine_config(), client)  # second pass: prefixes come from the daemon
        assert again.generate(workload(), sampling) == want
        assert sum(s.num_store_hit_tokens for s in again.finished) >= 5 * 2 * CHUNK
        assert again.connector.stats()["load_failed_chunks"] == 0  # type: ignore[union-attr]
