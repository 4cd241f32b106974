"""Issue 27, item 1, the parts that need no daemon: tokens read from files (a named error for a file
that cannot be read or is empty), and every variable holding a token dropped from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.errors import ConfigError
from service.config import service_config_from_dict
from service.hardening import scrub_secret_env


def test_tokens_come_from_files(tmp_path: Path) -> None:
    (tmp_path / "a.token").write_text("file-token-aaaa-1\n")
    (tmp_path / "admin.token").write_text("  file-admin-token-0123456789  \n")
    config = service_config_from_dict({"admin_token_file": str(tmp_path / "admin.token"),
                                       "tenants": [{"name": "a", "token_file": str(tmp_path / "a.token"),
                                                    "salt": "s", "memory": "64MiB"}]}, env={})
    assert config.tenants[0].token == "file-token-aaaa-1" and config.admin_token == "file-admin-token-0123456789"
    assert config.tenants[0].memory_bytes == 64 << 20


@pytest.mark.parametrize(("content", "words"), [(None, "cannot read"), ("  \n", "is empty")])
def test_an_unreadable_or_empty_token_file_is_named(tmp_path: Path, content: str | None, words: str) -> None:
    path = tmp_path / "t.token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="tenant 'a' token_file: ") as tenant_error:
        service_config_from_dict({"tenants": [{"name": "a", "token_file": str(path), "salt": "s"}]}, env={})
    with pytest.raises(ConfigError, match="service.metrics_token_file: ") as role_error:
        service_config_from_dict({"metrics_token_file": str(path)}, env={})
    for error in (tenant_error, role_error):
        assert words in str(error.value) and str(path) in str(error.value)


def test_every_variable_holding_a_token_leaves_the_environment() -> None:
    env = {"TEAM_A": "tenant-token-1", "KVSTORE_ADMIN_TOKEN": "admin-token-0123456789", "PATH": "/usr/bin",
           "OTHER": "tenant-token-1 plus", "PADDED": " tenant-token-1\n", "KVSTORE_METRICS_TOKEN": "unused"}
    removed = scrub_secret_env(["tenant-token-1", None, "admin-token-0123456789"], env)
    assert sorted(removed) == ["KVSTORE_ADMIN_TOKEN", "KVSTORE_METRICS_TOKEN", "PADDED", "TEAM_A"]
    assert env == {"PATH": "/usr/bin", "OTHER": "tenant-token-1 plus"}


def test_the_memory_budget_and_socket_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="tenant_memory_bytes must be >= 1"):
        service_config_from_dict({"tenant_memory_bytes": 0}, env={})
    with pytest.raises(ConfigError, match="shm_socket_deadline_s must be positive"):
        service_config_from_dict({"shm_socket_deadline_s": 0}, env={})
    with pytest.raises(ConfigError, match="tenant 'a': memory must be positive"):
        service_config_from_dict({"tenants": [{"name": "a", "token": "tok-aaaaaaaa", "salt": "s", "memory": 0}]},
                                 env={})
