"""kvstore.flags: one on/off grammar everywhere; a word it does not know is an error, never a silent False."""

from __future__ import annotations

import pytest

from kvstore.errors import ConfigError
from kvstore.flags import FALSE_WORDS, TRUE_WORDS, parse_bool, parse_bool_or_auto


@pytest.mark.parametrize("word", [*TRUE_WORDS, "ON", " Yes ", True, 1])
def test_true_words(word: object) -> None:
    assert parse_bool(word, field="x") is True


@pytest.mark.parametrize("word", [*FALSE_WORDS, "OFF", False, 0])
def test_false_words(word: object) -> None:
    assert parse_bool(word, field="x") is False


@pytest.mark.parametrize("word", ["maybe", "", "2", "enabled"])
def test_an_unknown_word_names_the_field_and_the_words(word: str) -> None:
    with pytest.raises(ConfigError, match=r"use_shm = .* is not on or off; write one of 1, true, yes, on or 0"):
        parse_bool(word, field="use_shm")


def test_auto_is_a_third_answer_where_a_setting_has_one() -> None:
    assert parse_bool_or_auto("Auto", field="x") == "auto"
    assert parse_bool_or_auto("on", field="x") is True
    with pytest.raises(ConfigError, match=r"use true, false or \"auto\""):
        parse_bool_or_auto("sometimes", field="x")


def test_every_on_off_setting_takes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the cluster's KVSTORE_CLUSTER_REDIS_CLUSTER and an engine's use_shm refused 'on' (read as off)."""
    from connector.plugin_store import StoreOptions
    from service.cluster import cluster_config_from_env

    cluster = cluster_config_from_env({"KVSTORE_CLUSTER_URL": "redis://127.0.0.1:1", "KVSTORE_CLUSTER_REDIS_CLUSTER": "on"})
    assert cluster is not None and cluster.redis_cluster is True
    options = StoreOptions.from_mapping({"kvstore.url": "http://127.0.0.1:1", "kvstore.use_shm": "off"}, prefix="kvstore.")
    assert options.use_shm is False
