"""One TieredStore, chunks of several layouts in the same host arena and NVMe folder (kvstore/store/layouts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstore.config import StoreConfig, TierConfig, config_from_dict
from kvstore.errors import LayoutMismatchError
from kvstore.layout import AttentionKind, KVLayout
from kvstore.store import TieredStore
from kvstore.store.layouts import MAX_LAYOUTS
from kvstore.types import TierKind
from tests.conftest import make_chunk

# Three models that differ in heads, dtype, chunk tokens and attention kind: 8 KiB, 6 KiB and 4.5 KiB chunks.
GQA = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)
WIDE = KVLayout(num_layers=2, num_kv_heads=3, head_dim=32, dtype="float32", chunk_tokens=8)
MLA = KVLayout(num_layers=2, num_kv_heads=1, head_dim=72, dtype="bfloat16", chunk_tokens=16, kind=AttentionKind.MLA)
LAYOUTS = (GQA, WIDE, MLA)


def _config(root: Path, *, any_layout: bool = True, host_bytes: int = 1 << 20, codec: str = "none") -> StoreConfig:
    tiers = (TierConfig(kind=TierKind.HOST, capacity_bytes=host_bytes),
             TierConfig(kind=TierKind.NVME, capacity_bytes=8 << 20, path=str(root / "nvme"), codec=codec))
    return StoreConfig(layout=GQA, tiers=tiers, any_layout=any_layout, put_timeout_s=2.0)


def _keys(tag: int, n: int) -> list[bytes]:
    return [bytes([tag, i]) * 8 for i in range(n)]


def _fill(store: TieredStore) -> dict[bytes, torch.Tensor]:
    written: dict[bytes, torch.Tensor] = {}
    for tag, layout in enumerate(LAYOUTS):
        store.register_layout(layout)
        keys = _keys(tag, 4)
        chunks = [make_chunk(layout, 100 * tag + i) for i in range(4)]
        assert store.put_many(keys, chunks).not_stored == {}
        written.update(zip(keys, chunks, strict=True))
    return written


def _read(store: TieredStore, key: bytes, layout: KVLayout) -> torch.Tensor | None:
    out = torch.full(layout.chunk_shape, 7, dtype=layout.torch_dtype)
    return out if store.get(key, out) else None


def _layout_of(key: bytes) -> KVLayout:
    return LAYOUTS[key[0]]


def test_chunks_of_three_layouts_share_the_tiers_and_read_back_exactly(tmp_path: Path) -> None:
    with TieredStore(_config(tmp_path)) as store:
        written = _fill(store)
        store.flush()
        for key, chunk in written.items():
            got = _read(store, key, _layout_of(key))
            assert got is not None and torch.equal(got, chunk)
        assert store.stats()["tiers"]["host"]["chunks"] == len(written)  # one arena holds all three sizes


def test_a_read_under_another_layout_is_a_miss_never_bytes(tmp_path: Path) -> None:
    with TieredStore(_config(tmp_path)) as store:
        written = _fill(store)
        store.flush()
        for key in written:
            for other in LAYOUTS:
                if other is not _layout_of(key):
                    assert _read(store, key, other) is None
        store.drop_tier_copies(TierKind.HOST)  # the same from the NVMe copies (headers)
        for key in written:
            for other in LAYOUTS:
                assert (_read(store, key, other) is not None) == (other is _layout_of(key))
        assert store.stats()["tiers"]["nvme"]["layout_misses"] > 0


def test_restart_recovers_every_layout_from_the_chunk_headers(tmp_path: Path) -> None:
    """The headers name each chunk's layout fingerprint, layouts.json its shape: after a restart every layout's
    chunks (compressed on NVMe) read back exact before any client registers again."""
    with TieredStore(_config(tmp_path, codec="blosc-lz4")) as store:
        written = _fill(store)
        store.flush()
    with TieredStore(_config(tmp_path, codec="blosc-lz4")) as store:
        assert len(store.index) == len(written)
        assert {layout.fingerprint for layout in store.layouts} == {layout.fingerprint for layout in LAYOUTS}
        for key, chunk in written.items():
            got = _read(store, key, _layout_of(key))
            assert got is not None and torch.equal(got, chunk), key.hex()


def test_restart_without_the_layouts_file_serves_a_layout_once_registered(tmp_path: Path) -> None:
    with TieredStore(_config(tmp_path)) as store:
        written = _fill(store)
        store.flush()
    (tmp_path / "nvme" / "layouts.json").unlink()
    with TieredStore(_config(tmp_path)) as store:
        assert len(store.index) == len(written)  # indexed from the headers all the same
        with pytest.raises(LayoutMismatchError):  # a buffer of an unknown layout is bad input
            _read(store, _keys(1, 1)[0], WIDE)
        store.register_layout(WIDE)
        for key, chunk in written.items():
            if _layout_of(key) is not MLA:
                got = _read(store, key, _layout_of(key))
                assert got is not None and torch.equal(got, chunk)


def test_eviction_runs_across_layouts_in_one_arena(tmp_path: Path) -> None:
    # 40 KiB of host arena: the three models' 72 KiB of chunks cannot all stay; the oldest go, whatever their layout
    with TieredStore(_config(tmp_path, host_bytes=40 << 10)) as store:
        written = _fill(store)
        store.flush()
        host = store.levels[0].tier
        assert host.used_bytes <= host.capacity_bytes
        assert store.stats()["tiers"]["host"]["evictions"] > 0
        for key, chunk in written.items():  # evicted ones come back from NVMe, exact
            got = _read(store, key, _layout_of(key))
            assert got is not None and torch.equal(got, chunk)


def test_a_fixed_store_refuses_another_layout_naming_both(tmp_path: Path) -> None:
    with TieredStore(_config(tmp_path, any_layout=False)) as store:
        store.register_layout(GQA)
        with pytest.raises(LayoutMismatchError, match="kv_heads=3.*no \\[layout\\]"):
            store.register_layout(WIDE)
        with pytest.raises(LayoutMismatchError, match="once registered"):
            store.put(_keys(1, 1)[0], make_chunk(WIDE, 1))


def test_a_config_that_names_no_layout_serves_any() -> None:
    assert config_from_dict({}).any_layout
    assert config_from_dict({"tiers": [{"kind": "host", "capacity": "1MiB"}]}).any_layout
    assert not config_from_dict({"model_id": "llama-3-8b"}).any_layout
    assert not config_from_dict({"layout": GQA.to_dict()}).any_layout
    assert not config_from_dict({"chunk_tokens": 64}).any_layout


def test_the_layouts_a_store_keeps_are_capped(tmp_path: Path) -> None:
    with TieredStore(_config(tmp_path)) as store:
        for heads in range(1, MAX_LAYOUTS):  # the default layout is the first
            store.register_layout(KVLayout(num_layers=1, num_kv_heads=heads, head_dim=8, dtype="float16"))
        with pytest.raises(LayoutMismatchError, match=f"serves {MAX_LAYOUTS} layouts"):
            store.register_layout(KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float16"))
        store.register_layout(GQA)  # one it serves already: still fine
