"""Config tables through msgspec (kvstore/config_convert.py): environment strings read as their field's type, errors
naming the setting, the value and the fix, and the retired keys read with a warning naming their replacement."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvstore.config import config_from_dict, load_config
from kvstore.errors import ConfigError
from kvstore.types import TierKind


def test_environment_strings_take_their_fields_types(tmp_path: Path) -> None:
    config = load_config(env={"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_PROMOTE_ON_READ": "off",
                              "KVSTORE_REPLICATE_TO": "nvme, pfs", "KVSTORE_PUT_TIMEOUT_S": "0.25",
                              "KVSTORE_NVME_RAW_WHEN_ENCODER_BUSY": "yes",
                              "KVSTORE_REDIS_OPTIONS": '{url = "redis://127.0.0.1:1/0", prefix = "kv"}'})
    assert config.promote_on_read is False and config.put_timeout_s == 0.25
    assert config.replicate_to == (TierKind.NVME, TierKind.PFS)
    nvme, redis = config.tier(TierKind.NVME), config.tier(TierKind.REDIS)
    assert nvme is not None and nvme.raw_when_encoder_busy is True
    assert redis is not None and dict(redis.options) == {"url": "redis://127.0.0.1:1/0", "prefix": "kv"}
    assert type(nvme.capacity_bytes) is int  # the size types are for decoding only: messages encode plain ints


@pytest.mark.parametrize(("data", "words"), [
    ({"write_queue_depth": "many"}, "write_queue_depth = 'many': expected `int`, got `str`; write a whole number"),
    ({"promote_on_read": "maybe"}, "promote_on_read = 'maybe' is not on or off"),
    ({"replicate_to": ["NVMe"]}, "replicate_to = ['NVMe']: invalid enum value 'NVMe'"),
    ({"tiers": [{"kind": "host", "capacity": "4 GiBs"}]}, "tier host: capacity = '4 GiBs': 'GiBs' is not a size unit"),
    ({"tiers": [{"kind": "host", "num_workers": 1.5}]}, "tier host: num_workers = 1.5"),
    ({"chunk_tokens": "abc"}, "chunk_tokens = 'abc'"),
    ({"tiers": "host"}, "tiers = 'host' is not a list of tables"),
])
def test_a_bad_value_names_the_setting_the_value_and_the_fix(tmp_path: Path, data: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, cache_dir=tmp_path)
    assert words in str(caught.value)


def test_retired_keys_are_read_as_their_replacement_with_a_warning(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kvstore.config"):
        config = config_from_dict({"model": "mistral-7b", "tiers": [{"kind": "host", "capacity_bytes": 4096}]},
                                  cache_dir=tmp_path)
    assert config.model_id == "mistral-7b" and config.tiers[0].capacity_bytes == 4096
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "write model_id = 'mistral-7b'" in said and "write capacity = '4096B'" in said


@pytest.mark.parametrize(("data", "words"), [
    ({"model": "a", "model_id": "b"}, "model and model_id are both set"),
    ({"tiers": [{"kind": "host", "capacity": "1GiB", "capacity_bytes": 1}]}, "capacity_bytes and capacity are both set"),
    ({"cluster": {"url": "redis://x"}}, "KVSTORE_CLUSTER_URL"),
])
def test_two_spellings_at_once_and_the_unread_cluster_table_are_refused(tmp_path: Path, data: dict[str, object],
                                                                         words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        config_from_dict(data, cache_dir=tmp_path)


def test_an_override_replaces_the_retired_spelling_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('model = "mistral-7b"\n[[tiers]]\nkind = "host"\ncapacity_bytes = 4096\n')
    config = load_config(path, env={"KVSTORE_MODEL_ID": "qwen2.5-7b", "KVSTORE_HOST_CAPACITY": "1MiB"})
    assert config.model_id == "qwen2.5-7b" and config.tiers[0].capacity_bytes == 1 << 20
