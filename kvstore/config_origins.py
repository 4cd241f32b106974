"""Where each field of the configuration in force came from: default, file or environment.

`explain_config` loads a config as `load_config` does and returns, beside it, one `FieldOrigin` per
field (top-level, layout, and every field of every tier), for `kvstore config show`::

    tiers.host.capacity_bytes   8.0 GiB (8589934592)            env KVSTORE_HOST_CAPACITY
    tiers.nvme.path             /home/me/.cache/kvstore/nvme     default (cache dir)
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.config import (
    EnvOverride,
    StoreConfig,
    TierConfig,
    apply_env_overrides,
    config_from_dict,
    default_cache_dir,
    env_overrides,
    read_config_file,
)
from kvstore.units import format_bytes


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
    file_data = read_config_file(Path(path)) if path is not None else {}
    overrides = env_overrides(env)
    config = config_from_dict(apply_env_overrides(file_data, env), cache_dir=default_cache_dir(env))
    origins = _Origins(file_data, f"file {path}" if path is not None else "", overrides)
    rows = [origins.top(f.name, getattr(config, f.name)) for f in dataclasses.fields(StoreConfig)
            if f.name not in ("layout", "tiers")]
    rows += origins.layout(config)
    for tier in config.tiers:
        rows += [origins.tier(tier, f.name) for f in dataclasses.fields(TierConfig) if f.name != "kind"]
    return config, rows


class _Origins:
    """Answers "where did this field come from" from the file's data and the environment's overrides."""

    def __init__(self, file_data: Mapping[str, Any], file_label: str, overrides: list[EnvOverride]) -> None:
        self.file_data = file_data
        self.file_label = file_label
        self.env = {(o.tier, o.key): o.variable for o in overrides}
        self.file_tiers = {str(t.get("kind", "")).lower(): t for t in file_data.get("tiers") or []}

    def top(self, name: str, value: object, aliases: tuple[str, ...] = ()) -> FieldOrigin:
        for key in (name, *aliases):
            if (None, key) in self.env:
                return FieldOrigin(name, show(value), f"env {self.env[(None, key)]}")
        if any(key in self.file_data for key in (name, *aliases)):
            return FieldOrigin(name, show(value), self.file_label)
        return FieldOrigin(name, show(value), "default")

    def layout(self, config: StoreConfig) -> list[FieldOrigin]:
        """Layout fields: top-level chunk_tokens/dtype, the file's [layout] table or hf_config, else the preset."""
        model = self.top("model_id", config.model_id, aliases=("model",))
        table = self.file_data.get("layout")
        table = table if isinstance(table, Mapping) else {}
        rows = []
        for f in dataclasses.fields(config.layout):
            value = show(getattr(config.layout, f.name))
            top_level = self.top(f.name, value) if f.name in ("chunk_tokens", "dtype") else None
            if top_level is not None and top_level.origin != "default":
                origin = top_level.origin
            elif f.name in table:
                origin = f"{self.file_label} [layout]"
            elif "hf_config" in self.file_data:
                origin = f"{self.file_label} hf_config"
            else:
                origin = "default" if top_level is not None else f"preset {config.model_id} ({model.origin})"
            rows.append(FieldOrigin(f"layout.{f.name}", value, origin))
        return [*rows, FieldOrigin("layout.chunk_bytes", show_bytes(config.layout.chunk_bytes), "derived")]

    def tier(self, tier: TierConfig, name: str) -> FieldOrigin:
        kind = tier.kind.value
        label = f"tiers.{kind}.{name}"
        value = getattr(tier, name)
        shown = show_bytes(value) if name == "capacity_bytes" else show(value)
        keys = ("capacity", "capacity_bytes") if name == "capacity_bytes" else (name,)
        for key in keys:
            if (kind, key) in self.env:
                return FieldOrigin(label, shown, f"env {self.env[(kind, key)]}")
        if any(key in self.file_tiers.get(kind, {}) for key in keys):
            return FieldOrigin(label, shown, self.file_label)
        if name == "path" and value:
            return FieldOrigin(label, shown, "default (cache dir: KVSTORE_CACHE_DIR or the user cache dir)")
        return FieldOrigin(label, shown, "default")


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
