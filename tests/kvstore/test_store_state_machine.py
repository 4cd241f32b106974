"""Hypothesis state machine: the store against a dict model.

Invariants after every step: no tier over capacity, pinned chunks never leave the host tier,
every chunk put and not removed reads back byte-identical (the NVMe tier has room for all).
"""

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk, store_config

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, dtype="float16", chunk_tokens=4)
NUM_KEYS = 12


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="kvsm-"))
        self.store = TieredStore(store_config(LAYOUT, self.dir, host_chunks=3, nvme_chunks=NUM_KEYS + 2,
                                              put_timeout_s=0.05))
        self.keys = self.store.chunk_keys(list(range(NUM_KEYS * LAYOUT.chunk_tokens)))
        self.model: dict[int, torch.Tensor] = {}
        self.pinned: dict[int, set[int]] = {}  # key index -> levels holding it when pinned

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(i=st.integers(0, NUM_KEYS - 1), seed=st.integers(0, 3))
    def put(self, i: Any, seed: Any) -> None:
        chunk = make_chunk(LAYOUT, i * 10 + seed)
        result = self.store.put(self.keys[i], chunk)
        if i not in self.model and result.ok:
            self.model[i] = chunk  # a put of a key already present keeps the first bytes
        # A put fails only when the host is full of pinned chunks or pending writes, and says so.
        assert result.ok or "pinned" in result.not_stored[self.keys[i]]

    @rule(i=st.integers(0, NUM_KEYS - 1))
    def get(self, i: Any) -> None:
        out = torch.empty(LAYOUT.chunk_shape, dtype=torch.float16)
        ok = self.store.get(self.keys[i], out)
        assert ok == (i in self.model)
        if ok:
            assert torch.equal(out, self.model[i])

    @rule(i=st.integers(0, NUM_KEYS - 1))
    def remove(self, i: Any) -> None:
        if i in self.pinned:
            return
        assert self.store.remove(self.keys[i]) == (i in self.model)
        self.model.pop(i, None)

    @precondition(lambda self: len(self.pinned) < 2)
    @rule(i=st.integers(0, NUM_KEYS - 1))
    def pin(self, i: Any) -> None:
        if i in self.model and i not in self.pinned and self.store.pin([self.keys[i]]) == 1:
            self.pinned[i] = self._levels_holding(i)

    @rule()
    def unpin_all(self) -> None:
        self.store.unpin([self.keys[i] for i in self.pinned])
        self.pinned.clear()

    @rule()
    def drop_host(self) -> None:
        if not self.pinned:
            self.store.drop_tier_copies(TierKind.HOST)

    @rule(n=st.integers(0, NUM_KEYS))
    def lookup(self, n: Any) -> None:
        expected = next((j for j in range(n) if j not in self.model), n)
        assert self.store.lookup_keys(self.keys[:n]) == expected

    @invariant()
    def capacity_never_exceeded(self) -> None:
        for tier in self.store.stats()["tiers"].values():
            assert tier["used_bytes"] <= tier["capacity_bytes"]

    def _levels_holding(self, i: Any) -> set[int]:
        return {lv.index for lv in self.store.levels if lv.tier.contains(self.keys[i])}

    @invariant()
    def pinned_never_evicted(self) -> None:
        for i, levels in self.pinned.items():
            assert levels <= self._levels_holding(i)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
