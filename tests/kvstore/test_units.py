"""The size grammar: units required where the name does not say bytes, decimal units said once,
unknown units refused naming the tier and the field."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvstore.config import StoreConfig, TierConfig, load_config
from kvstore.errors import ConfigError
from kvstore.types import TierKind
from kvstore.units import parse_bytes


def _tier(config: StoreConfig, kind: TierKind) -> TierConfig:
    tier = config.tier(kind)
    assert tier is not None, f"no {kind.value} tier"
    return tier


def _host_capacity(tmp_path: Path, value: str) -> int:
    path = tmp_path / "kv.toml"
    path.write_text(f'[[tiers]]\nkind = "host"\ncapacity = {value}\n')
    return _tier(load_config(path, env={"KVSTORE_CACHE_DIR": str(tmp_path)}), TierKind.HOST).capacity_bytes


@pytest.mark.parametrize(("text", "nbytes"), [('"4GiB"', 4 << 30), ('"512 MiB"', 512 << 20), ('"1.5GiB"', 3 << 29),
                                              ('"4096B"', 4096), ('"2TiB"', 2 << 40)])
def test_binary_units(tmp_path: Path, text: str, nbytes: int) -> None:
    assert _host_capacity(tmp_path, text) == nbytes


@pytest.mark.parametrize("text", ["4", '"4"', "4.5"])
def test_a_bare_number_is_refused_with_the_fix(tmp_path: Path, text: str) -> None:
    """Regression (issue 25): `capacity = 4` ran a 4-byte host tier."""
    with pytest.raises(ConfigError, match=r"tier host: capacity = .* has no unit \(it would mean 4(\.5)? bytes\); "
                                          r"write e\.g\. '4(\.5)?GiB', or '4(\.5)?B' if bytes are meant"):
        _host_capacity(tmp_path, text)


def test_capacity_bytes_takes_a_byte_count(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('[[tiers]]\nkind = "host"\ncapacity_bytes = 4096\n')
    assert _tier(load_config(path, env={}), TierKind.HOST).capacity_bytes == 4096


def test_an_unknown_unit_names_the_tier_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tier host: capacity = '4 GiBs': 'GiBs' is not a size unit; write e.g. '4GiB'"):
        _host_capacity(tmp_path, '"4 GiBs"')


@pytest.mark.parametrize("text", ['"4GB"', '"4G"', '"4 gb"'])
def test_decimal_units_are_decimal_and_said_once(tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture) -> None:
    field = f"tier host ({tmp_path.name} {text})"  # a field no other test has logged
    with caplog.at_level(logging.WARNING, logger="kvstore.units"):
        assert parse_bytes(text.strip('"'), field=field) == 4 * 10**9
        assert parse_bytes(text.strip('"'), field=field) == 4 * 10**9
    said = [r.getMessage() for r in caplog.records if r.name == "kvstore.units"]
    assert len(said) == 1 and "decimal size: 4,000,000,000 bytes = 3.7 GiB" in said[0]
    assert _host_capacity(tmp_path, text) == 4 * 10**9


def test_decimal_unit_in_a_config_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kvstore.units"):
        _host_capacity(tmp_path, f'"{len(tmp_path.name)}MB"')
    assert any(f"'{len(tmp_path.name)}MB' is a decimal size" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value", [True, "lots", "-4GiB", ""])
def test_not_a_size(value: bool | str) -> None:
    with pytest.raises(ConfigError, match="is not a size"):
        parse_bytes(value, field="tier host: capacity")


@pytest.mark.parametrize(("value", "fixes"), [(1474560, ("'1474560B'", "'1.41MiB'")), (4, ("'4GiB'", "'4B'")),
                                              (1e12, ("'1000000000000B'", "'931GiB'"))])
def test_a_bare_number_gets_fixes_written_as_users_write_sizes(value: float, fixes: tuple[str, str]) -> None:
    """Regression: capacity = 1474560 was told to write '1.47456e+06GiB'."""
    with pytest.raises(ConfigError) as caught:
        parse_bytes(value, field="tier host: capacity", require_unit=True)
    assert all(fix in str(caught.value) for fix in fixes) and "e+" not in str(caught.value)
