"""Environment overrides layer onto the configuration in force (the no-file default or a file), and
`explain_config` / `kvstore config show` name where every field came from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.config import StoreConfig, TierConfig, load_config
from kvstore.config_origins import explain_config
from kvstore.errors import ConfigError
from kvstore.types import TierKind

GiB = 1 << 30


def _tier(config: StoreConfig, kind: TierKind) -> TierConfig:
    tier = config.tier(kind)
    assert tier is not None, f"no {kind.value} tier"
    return tier


def _origins(path: Path | None, env: dict[str, str]) -> dict[str, tuple[str, str]]:
    _, rows = explain_config(path, env=env)
    return {row.name: (row.value, row.origin) for row in rows}


def test_host_override_on_the_default_keeps_the_nvme_tier(tmp_path: Path) -> None:
    """Regression (issue 25): KVSTORE_HOST_CAPACITY on the no-file default dropped the NVMe tier."""
    config = load_config(env={"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_HOST_CAPACITY": "1GiB"})
    assert [t.kind for t in config.tiers] == [TierKind.HOST, TierKind.NVME]
    assert _tier(config, TierKind.HOST).capacity_bytes == GiB
    assert _tier(config, TierKind.NVME).capacity_bytes == 16 * GiB
    assert _tier(config, TierKind.NVME).path == str(tmp_path / "nvme")


def test_nvme_override_on_the_default_needs_no_path(tmp_path: Path) -> None:
    """Regression (issue 25): KVSTORE_NVME_CAPACITY alone failed with `tier nvme: needs a path`."""
    config = load_config(env={"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_NVME_CAPACITY": "4GiB"})
    assert _tier(config, TierKind.NVME).capacity_bytes == 4 * GiB
    assert _tier(config, TierKind.NVME).path == str(tmp_path / "nvme")
    assert _tier(config, TierKind.HOST).capacity_bytes == 2 * GiB


def test_override_on_a_file_changes_one_field_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('[[tiers]]\nkind = "host"\ncapacity = "3GiB"\neviction = "lru"\n'
                    f'[[tiers]]\nkind = "nvme"\ncapacity = "8GiB"\npath = "{tmp_path / "n"}"\n')
    config = load_config(path, env={"KVSTORE_NVME_CAPACITY": "5GiB", "KVSTORE_PFS_CAPACITY": "6GiB",
                                    "KVSTORE_CACHE_DIR": str(tmp_path / "cache")})
    assert [t.kind for t in config.tiers] == [TierKind.HOST, TierKind.NVME, TierKind.PFS]
    assert _tier(config, TierKind.HOST).capacity_bytes == 3 * GiB and _tier(config, TierKind.HOST).eviction == "lru"
    assert _tier(config, TierKind.NVME).capacity_bytes == 5 * GiB
    assert _tier(config, TierKind.NVME).path == str(tmp_path / "n")
    assert _tier(config, TierKind.PFS).path == str(tmp_path / "cache" / "pfs")


def test_a_file_without_tiers_gets_the_default_tiers_under_an_override(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text("put_timeout_s = 2.0\n")
    config = load_config(path, env={"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_HOST_EVICTION": "lru"})
    assert [t.kind for t in config.tiers] == [TierKind.HOST, TierKind.NVME]
    assert _tier(config, TierKind.HOST).eviction == "lru" and config.put_timeout_s == 2.0


def test_origins_name_default_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text('put_timeout_s = 2.0\n[[tiers]]\nkind = "host"\ncapacity = "3GiB"\n')
    rows = _origins(path, {"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_HOST_CAPACITY": "1GiB",
                           "KVSTORE_WRITE_QUEUE_DEPTH": "9"})
    assert rows["put_timeout_s"] == ("2.0", f"file {path}")
    assert rows["write_queue_depth"] == ("9", "env KVSTORE_WRITE_QUEUE_DEPTH")
    assert rows["tiers.host.capacity"] == (f"1.0 GiB ({GiB})", "env KVSTORE_HOST_CAPACITY")
    assert rows["tiers.host.eviction"] == ("adaptive", "default")
    assert rows["layout.num_layers"] == ("32", "preset llama-3-8b (default)")


def test_origins_cover_every_field_of_the_default(tmp_path: Path) -> None:
    config, rows = explain_config(env={"KVSTORE_CACHE_DIR": str(tmp_path)})
    names = {row.name for row in rows}
    assert {"model_id", "compression", "layout.head_dim", "tiers.nvme.path", "tiers.host.codec"} <= names
    assert len(names) == len(rows)
    assert all(row.origin in ("default", "derived") or row.origin.startswith(("preset", "default (cache dir"))
               for row in rows)
    assert config == load_config(env={"KVSTORE_CACHE_DIR": str(tmp_path)})


def test_unknown_tier_field_in_the_environment_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KVSTORE_HOST_CAPACTY: unknown tier field 'capacty'; valid:"):
        load_config(env={"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_HOST_CAPACTY": "1GiB"})


def test_unknown_key_error_lists_every_accepted_key(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text("bogus = 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    for key in ("chunk_tokens", "hf_config", "dtype", "model_id", "layout", "tiers", "service", "put_timeout_s"):
        assert f"'{key}'" in str(caught.value)


def test_config_show_command_prints_origins(tmp_path: Path) -> None:
    env = {"KVSTORE_CACHE_DIR": str(tmp_path), "KVSTORE_NVME_CAPACITY": "4GiB", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", "from kvstore.cli import app; app()", "config", "show"],
                          env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("tiers.nvme.capacity "))
    assert "4.0 GiB" in line and line.endswith("env KVSTORE_NVME_CAPACITY")
    assert any(line.startswith("tiers.host.capacity ") and line.endswith("default")
               for line in done.stdout.splitlines())


def test_config_show_lists_service_fields_without_token_values(tmp_path: Path) -> None:
    from kvstore.cli.config_show import service_rows

    rows = {r.name: r for r in service_rows({"lease_s": 12}, "file kv.toml",
                                            {"KVSTORE_ADMIN_TOKEN": "admin-secret-0123456789"})}
    assert (rows["service.lease_s"].value, rows["service.lease_s"].origin) == ("12.0", "file kv.toml")
    assert rows["service.header_timeout_s"].origin == "default"
    assert (rows["service.admin_token"].value, rows["service.admin_token"].origin) == ("(set)", "env KVSTORE_ADMIN_TOKEN")
    assert all("admin-secret" not in r.value for r in rows.values())
