"""connector/plugin_store.py (how the engine plugins reach kvstore) and the plugins' import isolation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from connector.plugin_store import StoreOptions, open_store
from kvstore.errors import ConfigError, LayoutMismatchError
from kvstore.kv_scope import named_key
from kvstore.layout import KVLayout

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", chunk_tokens=16)


def test_options_read_the_prefixed_keys_and_refuse_unknown_ones() -> None:
    extra = {"p.url": "http://127.0.0.1:1", "p.use_shm": "false", "p.class_name": "X", "other": 1}
    options = StoreOptions.from_mapping(extra, prefix="p.", ignore=("class_name",))
    assert options.url == "http://127.0.0.1:1" and options.use_shm is False
    with pytest.raises(ConfigError, match=r"p\.chunk_size"):
        StoreOptions.from_mapping({"p.chunk_size": 3}, prefix="p.")


def test_an_embedded_store_with_another_layout_is_refused_with_both_layouts(tmp_path: Path) -> None:
    config = tmp_path / "kvstore.toml"
    config.write_text('[layout]\nnum_layers = 3\nnum_kv_heads = 2\nhead_dim = 8\ndtype = "float32"\nchunk_tokens = 16\n'
                      f'[[tiers]]\nkind = "host"\ncapacity = "{1 << 22}B"\n')
    with pytest.raises(LayoutMismatchError, match="num_layers=2"):
        open_store(StoreOptions(config=str(config)), LAYOUT)
    store = open_store(StoreOptions(root_dir=str(tmp_path / "default")), LAYOUT)
    assert store.layout == LAYOUT
    store.close()


def test_an_embedded_store_from_a_config_with_no_layout_takes_the_engines(tmp_path: Path) -> None:
    config = tmp_path / "kvstore.toml"
    config.write_text(f'[[tiers]]\nkind = "host"\ncapacity = "{1 << 22}B"\n')
    store = open_store(StoreOptions(config=str(config)), LAYOUT)
    try:
        assert store.layout == LAYOUT
        chunk = torch.randn(LAYOUT.chunk_shape).to(LAYOUT.torch_dtype)
        out = store.empty_chunk()
        assert store.put_many([b"k" * 16], [chunk]).ok and store.get_many([b"k" * 16], [out]) == [True]
        assert torch.equal(out, chunk)
    finally:
        store.close()


def test_named_keys_are_stable_and_namespaced() -> None:
    assert named_key(b"a" * 16, "x") == named_key(b"a" * 16, "x") and len(named_key(b"a" * 16, "x")) == 16
    assert named_key(b"a" * 16, "x") != named_key(b"b" * 16, "x")


def test_nothing_on_the_main_import_path_imports_an_engine() -> None:
    code = ("import sys, kvstore.cli, connector.client, service.app, bench.vllm, connector.plugin_store, "
            "connector.vllm.paged, connector.vllm.plan, connector.vllm.transfer; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'lmcache', 'sglang'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
