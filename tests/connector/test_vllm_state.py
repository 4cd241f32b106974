"""connector/vllm/state.py: a Mamba / linear-attention group's state pages through a real store, as the hybrid
path hands them over (connector.vllm.hybrid.group_specs: one key and one block per boundary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from connector.deadlines import Deadlines
from connector.embedded_store import EmbeddedStore
from connector.vllm.hybrid import Group, group_specs
from connector.vllm.plan import TransferSpec
from connector.vllm.state import StateTransfer, check_state_caches
from connector.vllm.window import GroupKind, GroupShape, group_layout
from kvstore.config import StoreConfig
from kvstore.errors import LayoutMismatchError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore

LAYERS, BLOCK, NUM_BLOCKS = 3, 64, 12
PAGE = 2304 + 65536 + 8  # conv + SSM state bytes of one layer, not a multiple of torch's copy grain
ATTN = KVLayout(num_layers=1, num_kv_heads=4, head_dim=128, dtype="bfloat16", chunk_tokens=BLOCK)


def state_caches(seed: int | None = None) -> list[torch.Tensor]:
    """Each layer's cache as vLLM hands it over: int8 pages [blocks, 1, 1, page], a strided view of a buffer whose
    blocks are padded (vLLM pads a state page to the attention page)."""
    caches = []
    for layer in range(LAYERS):
        padded = torch.zeros(NUM_BLOCKS, 1, 1, PAGE + 100, dtype=torch.int8)
        if seed is not None:
            padded.random_(-128, 127, generator=torch.Generator().manual_seed(seed + layer))
        caches.append(padded[..., :PAGE])
    return caches


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    shape = GroupShape(GroupKind.STATE, BLOCK, PAGE, LAYERS)
    layout = group_layout(shape, ATTN)
    config = StoreConfig.embedded(layout=layout, root_dir=tmp_path, host_bytes=16 * layout.chunk_bytes,
                                  nvme_bytes=16 * (layout.chunk_bytes + 8192))
    tiered = TieredStore(config)
    yield EmbeddedStore(tiered, Deadlines(), "test")
    tiered.close()


def test_a_boundary_state_round_trips_byte_for_byte_into_another_block(store: EmbeddedStore) -> None:
    group = Group(GroupShape(GroupKind.STATE, BLOCK, PAGE, LAYERS), 1, store.layout)
    source, target = state_caches(seed=3), state_caches()
    keys = tuple(bytes([i]) * 16 for i in range(4))  # chunks 0..3: one block each
    # vLLM's align mode: only the block where the prefill step stopped (boundary 256, block 3) holds a state
    saves = group_specs(group, TransferSpec("r", keys, 0, 0, 4 * BLOCK, ()), (0, 0, 0, 7), BLOCK, load=False)
    assert [(s.keys, s.block_ids) for s in saves] == [((group.keys(keys)[3],), (7,))]
    writer = StateTransfer(store, source)
    writer.save(saves)
    writer.wait()
    (load,) = group_specs(group, TransferSpec("r", keys, 0, 0, 4 * BLOCK, ()), (0, 0, 0, 9), BLOCK, load=True)
    assert StateTransfer(store, target).load(load) == set()
    for src, dst in zip(source, target, strict=True):
        assert torch.equal(dst[9], src[7])
        assert not dst[7].any(), "only the loaded block is written"


def test_a_missing_state_reports_its_block(store: EmbeddedStore) -> None:
    transfer = StateTransfer(store, state_caches())
    assert transfer.load(TransferSpec("r", (b"x" * 16,), 0, 0, BLOCK, (5,))) == {5}
    assert transfer.take_counters()["failed_chunks"] == 1


def test_caches_that_are_not_the_groups_state_pages_are_refused() -> None:
    with pytest.raises(LayoutMismatchError, match="not int8 pages of 100 bytes"):
        check_state_caches(state_caches(), 100)
    with pytest.raises(LayoutMismatchError, match="int8 pages"):
        check_state_caches([torch.zeros(NUM_BLOCKS, 1, 1, PAGE, dtype=torch.bfloat16)], PAGE)
