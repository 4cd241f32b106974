"""The two tokens that are not tenants: the admin token and the metrics scraper's token.

    [service]
    admin_token_file = "/etc/kvstore/admin.token"  # best: a file (mode 0600); or
    admin_token_env = "KVSTORE_ADMIN_TOKEN"        # the default name; or admin_token = "..."
    metrics_token_env = "KVSTORE_METRICS_TOKEN"    # the default name; or metrics_token(_file) = "..."

An admin sees what spans tenants (global /v1/stats, per-tenant /metrics, the cluster event
stream); it holds no chunks and cannot use the data routes. The metrics token reads /metrics
(without per-tenant series) and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kvstore.errors import ConfigError

ROLES = ("admin", "metrics")


class _HasToken(Protocol):
    @property
    def token(self) -> str: ...


class _HasTokens(Protocol):
    @property
    def admin_token(self) -> str | None: ...
    @property
    def metrics_token(self) -> str | None: ...
    @property
    def tenants(self) -> Sequence[_HasToken]: ...


def role_tokens_from(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, str | None]:
    """Take `<role>_token_env` and `<role>_token_file` out of `raw` and resolve `<role>_token`
    (explicit value first, then the file, then the env)."""
    found: dict[str, str | None] = {}
    for role in ROLES:
        name = str(raw.pop(f"{role}_token_env", None) or f"KVSTORE_{role.upper()}_TOKEN")
        path = raw.pop(f"{role}_token_file", None)
        value = raw.get(f"{role}_token") or (read_token_file(path, f"service.{role}_token_file") if path else None)
        value = value or env.get(name) or None
        found[f"{role}_token"] = None if value is None else str(value)
    return found


def read_token_file(path: object, what: str) -> str:
    """A token kept in a file (its content, whitespace stripped); ConfigError naming the file otherwise."""
    try:
        token = Path(str(path)).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc}; point it at a readable file holding the token") from exc
    if not token:
        raise ConfigError(f"{what}: {path} is empty; write the token into it")
    return token


def check_role_tokens(config: _HasTokens) -> None:
    """Role tokens are long enough and never equal to a tenant's token or to each other."""
    tenant_tokens = {t.token for t in config.tenants}
    for role, token in (("admin", config.admin_token), ("metrics", config.metrics_token)):
        if token is None:
            continue
        if len(token) < 16:
            raise ConfigError(f"service.{role}_token is {len(token)} characters; use at least 16")
        if token in tenant_tokens:
            raise ConfigError(f"service.{role}_token equals a tenant's token; give the {role} its own token")
    if config.admin_token is not None and config.admin_token == config.metrics_token:
        raise ConfigError("service.admin_token and service.metrics_token must differ")
