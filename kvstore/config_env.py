"""The configuration's layers: a TOML/YAML file, then KVSTORE_* environment variables on top, each key's origin kept.

KVSTORE_<KEY> sets a top-level key (KVSTORE_PUT_TIMEOUT_S=2), KVSTORE_<KIND>_<KEY> one key of a tier
(KVSTORE_HOST_CAPACITY=8GiB); the values stay strings until kvstore/config_convert.py reads them as their
field's type. Which keys exist is the caller's (kvstore/config.py `env_keys`): this module only layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from kvstore.errors import ConfigError
from kvstore.types import TierKind

NOT_OVERRIDES = ("KVSTORE_CACHE_DIR",)
DEFAULT_TIER_KINDS = (TierKind.HOST, TierKind.NVME)  # the no-file default (StoreConfig.embedded)


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a TOML or YAML config file; ConfigError naming the file and the problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = tomllib.loads(text)
    except Exception as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix.lstrip('.') or 'TOML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


@dataclass(frozen=True, slots=True)
class EnvKeys:
    """The keys variables may set: top-level, per tier, and retired spellings (old -> new) of each."""

    top: frozenset[str]
    tier: frozenset[str]
    renamed: Mapping[str, str]
    tier_renamed: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class EnvOverride:
    """One KVSTORE_* variable that sets a config key: `tier` is a tier kind, or None for a top-level key."""

    variable: str
    tier: str | None
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class Layered:
    """The configuration's data (the file's, the environment's overrides on top) and where each key came from:
    {"put_timeout_s": "file kv.toml", "tiers.host.capacity": "env KVSTORE_HOST_CAPACITY", "layout.head_dim": ...}."""

    data: dict[str, Any]
    origins: dict[str, str]


def env_overrides(env: Mapping[str, str], keys: EnvKeys) -> list[EnvOverride]:
    """The KVSTORE_<KEY> and KVSTORE_<KIND>_<KEY> variables in `env` that set config keys.

    Other KVSTORE_* variables (KVSTORE_PORT, KVSTORE_CACHE_DIR...) belong to other parts and are left
    alone; a tier variable with an unknown key is refused, naming the valid ones.
    """
    kinds = {k.value for k in TierKind}
    found = []
    for name, value in sorted(env.items()):
        if not name.startswith("KVSTORE_") or name in NOT_OVERRIDES:
            continue
        rest = name[len("KVSTORE_"):].lower()
        head, _, tail = rest.partition("_")
        if head in kinds and tail:
            if tail not in keys.tier and tail not in keys.tier_renamed:
                raise ConfigError(f"{name}: unknown tier field {tail!r}; valid: {sorted(keys.tier)}")
            found.append(EnvOverride(name, head, tail, value))
        elif rest in keys.top or rest in keys.renamed:
            found.append(EnvOverride(name, None, rest, value))
    return found


def layer_env(data: Mapping[str, Any], label: str, env: Mapping[str, str], keys: EnvKeys) -> Layered:
    """`data` (from `label`) with the environment's overrides on top: a tier variable changes that tier of the
    configuration in force (the file's tiers, or the no-file default host + NVMe), adding the tier when it is not
    there; it never replaces the tier list."""
    origins = {keys.renamed.get(key, key): label for key in data if key != "tiers"}
    origins |= {f"{key}.{sub}": label for key, table in data.items() if isinstance(table, Mapping) for sub in table}
    listed = data.get("tiers")
    tiers: list[Any] = [dict(t) if isinstance(t, Mapping) else t for t in listed] if isinstance(listed, list) else []
    for entry in (t for t in tiers if isinstance(t, dict)):  # other entries are refused when the tiers are built
        kind = str(entry.get("kind", "")).lower()
        origins |= {f"tiers.{kind}.{keys.tier_renamed.get(k, k)}": label for k in entry}
    overrides = env_overrides(env, keys)
    if not tiers and any(o.tier for o in overrides):
        tiers = [{"kind": kind.value} for kind in DEFAULT_TIER_KINDS]
    merged = {**data, "tiers": tiers} if tiers or isinstance(listed, list) else dict(data)
    for override in overrides:
        if override.tier is None:
            _set(merged, override.key, override.value, keys.renamed)
            origins[keys.renamed.get(override.key, override.key)] = f"env {override.variable}"
            continue
        tier = next((t for t in tiers if isinstance(t, dict) and str(t.get("kind", "")).lower() == override.tier), {})
        if not tier:
            tier = {"kind": override.tier}
            tiers.append(tier)
        _set(tier, override.key, override.value, keys.tier_renamed)
        key = keys.tier_renamed.get(override.key, override.key)
        origins[f"tiers.{override.tier}.{key}"] = f"env {override.variable}"
    return Layered(merged, origins)


def _set(table: dict[str, Any], key: str, value: str, renamed: Mapping[str, str]) -> None:
    """table[key] = value, replacing the key's other spelling (an override of `capacity` replaces `capacity_bytes`)."""
    for old, new in renamed.items():
        if key in (old, new):
            table.pop(old, None)
            table.pop(new, None)
    table[key] = value
