"""Config: TOML and YAML files, env overrides, the embedded default, and clear errors."""

from pathlib import Path
from typing import Any

import pytest

from kvstore.config import StoreConfig, TierConfig, load_config
from kvstore.errors import ConfigError, UnknownNameError, UnknownTierError
from kvstore.layout import KVLayout
from kvstore.types import TierKind


def test_embedded_default_needs_nothing(tmp_path: Path) -> None:
    config = load_config(env={"KVSTORE_CACHE_DIR": str(tmp_path)})
    assert [t.kind for t in config.tiers] == [TierKind.HOST, TierKind.NVME]
    assert config.tier(TierKind.NVME).path == str(tmp_path / "nvme")  # type: ignore[union-attr]
    assert config.layout == KVLayout.from_preset("llama-3-8b")


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('model_id = "qwen2.5-7b"\nchunk_tokens = 128\nput_timeout_s = 1.5\n'
                    '[[tiers]]\nkind = "host"\ncapacity = "512MiB"\n'
                    f'[[tiers]]\nkind = "pfs"\ncapacity = "2GiB"\npath = "{tmp_path}/pfs"\neviction = "lru"\n')
    config = load_config(path, env={})
    assert config.layout.chunk_tokens == 128 and config.layout.num_kv_heads == 4
    assert config.tier(TierKind.HOST).capacity_bytes == 512 * 2**20  # type: ignore[union-attr]
    assert config.tier(TierKind.PFS).capacity_bytes == 2 * 2**30  # type: ignore[union-attr]
    assert config.put_timeout_s == 1.5


def test_yaml_file_and_env_override(tmp_path: Path) -> None:
    path = tmp_path / "kv.yaml"
    path.write_text("model_id: mistral-7b\ntiers:\n  - kind: host\n    capacity: 1GiB\n")
    config = load_config(path, env={"KVSTORE_HOST_CAPACITY": "3GiB", "KVSTORE_NVME_PATH": str(tmp_path / "n"),
                                    "KVSTORE_WRITE_QUEUE_DEPTH": "7"})
    assert config.tier(TierKind.HOST).capacity_bytes == 3 * 2**30  # type: ignore[union-attr]
    assert config.tier(TierKind.NVME).path == str(tmp_path / "n")  # type: ignore[union-attr]
    assert config.write_queue_depth == 7


def test_unknown_tier_name_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('[[tiers]]\nkind = "floppy"\n')
    with pytest.raises(UnknownTierError, match="floppy.*valid kinds: gpu, host, nvme, pfs, redis"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("text", "match"),
    [('bogus = 1\n', "unknown config keys"),
     ('[[tiers]]\nkind = "host"\ncapacity = "lots"\n', "is not a size"),
     ('[[tiers]]\nkind = "host"\ncolour = "red"\n', "unknown keys"),
     ('model_id = "gpt-9"\n', "not a preset"),
     ('[[tiers\n', "not valid")],
)
def test_bad_files(tmp_path: Path, text: Any, match: Any) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(path, env={})


def test_dataclass_validation() -> None:
    layout = KVLayout.from_preset("llama-3-8b")
    with pytest.raises(ConfigError, match="needs a path"):
        TierConfig(kind=TierKind.NVME, capacity_bytes=1)
    with pytest.raises(ConfigError, match="once"):
        StoreConfig(layout=layout, tiers=(TierConfig(kind="host", capacity_bytes=1),) * 2)  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError):
        TierConfig(kind="tape", capacity_bytes=1)  # type: ignore[arg-type]
    tiers = (TierConfig(kind="nvme", capacity_bytes=1, path="/x"), TierConfig(kind="host", capacity_bytes=1))  # type: ignore[arg-type]
    assert [t.kind for t in StoreConfig(layout=layout, tiers=tiers).tiers] == [TierKind.HOST, TierKind.NVME]
