"""Where each field of the configuration in force came from: default, file or environment.

`explain_config` loads a config as `load_config` does and returns, beside it, one `FieldOrigin` per
field (top-level, layout, and every field of every tier), named by its key in the file, for
`kvstore config show`::

    tiers.host.capacity   8.0 GiB (8589934592)            env KVSTORE_HOST_CAPACITY
    tiers.nvme.path       /home/me/.cache/kvstore/nvme     default (cache dir: KVSTORE_CACHE_DIR or the user cache dir)
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvstore.config import StoreConfig, TierConfig, config_from_dict, default_cache_dir, layered
from kvstore.config_convert import FILE_KEYS
from kvstore.units import format_bytes

CACHE_DIR_DEFAULT = "default (cache dir: KVSTORE_CACHE_DIR or the user cache dir)"


@dataclass(frozen=True, slots=True)
class FieldOrigin:
    """One field: its dotted name, its value as shown, and where it came from."""

    name: str
    value: str
    origin: str


def explain_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None,
                   ) -> tuple[StoreConfig, list[FieldOrigin]]:
    """The config `load_config(path, env=env)` gives, and the origin of every one of its fields."""
    env = os.environ if env is None else env
    layers = layered(path, env)
    config = config_from_dict(layers.data, cache_dir=default_cache_dir(env))
    origins = layers.origins
    rows = [FieldOrigin(f.name, show(getattr(config, f.name)), origins.get(f.name, "default"))
            for f in dataclasses.fields(StoreConfig) if f.name not in ("layout", "tiers")]
    rows += layout_rows(config, origins)
    for tier in config.tiers:
        for f in dataclasses.fields(TierConfig):
            if f.name == "kind":
                continue
            name, value = f"tiers.{tier.kind.value}.{FILE_KEYS.get(f.name, f.name)}", getattr(tier, f.name)
            default = CACHE_DIR_DEFAULT if f.name == "path" and value else "default"
            shown = show_bytes(value) if f.name == "capacity_bytes" else show(value)
            rows.append(FieldOrigin(name, shown, origins.get(name, default)))
    return config, rows


def layout_rows(config: StoreConfig, origins: Mapping[str, str]) -> list[FieldOrigin]:
    """Layout fields: the [layout] table's, else top-level chunk_tokens/dtype, else hf_config's, else the preset's."""
    rows = []
    for f in dataclasses.fields(config.layout):
        value = show(getattr(config.layout, f.name))
        if f"layout.{f.name}" in origins:
            origin = f"{origins[f'layout.{f.name}']} [layout]"
        elif f.name in ("chunk_tokens", "dtype"):
            origin = origins.get(f.name, "default")
        elif "hf_config" in origins:
            origin = f"{origins['hf_config']} hf_config"
        else:
            origin = f"preset {config.model_id} ({origins.get('model_id', 'default')})"
        rows.append(FieldOrigin(f"layout.{f.name}", value, origin))
    return [*rows, FieldOrigin("layout.chunk_bytes", show_bytes(config.layout.chunk_bytes), "derived")]


def show(value: object) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ", ".join(show(v) for v in value) or "(none)"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    return "(none)" if value is None else str(value)


def show_bytes(nbytes: int) -> str:
    return f"{format_bytes(nbytes)} ({nbytes})"
