"""Store configuration: frozen dataclasses, loaded from TOML or YAML, with KVSTORE_* env overrides.

File format (TOML; YAML has the same keys)::

    model_id = "llama-3-8b"        # also picks the layout when it names a preset
    [layout]                       # optional: explicit geometry (or hf_config = "path/config.json")
                                   # none of the two (nor model, chunk_tokens, dtype): any_layout, every
                                   # model whose client registers is served (kvstore/store/layouts.py)
    chunk_tokens = 256
    [[tiers]]
    kind = "host"
    capacity = "4GiB"
    [[tiers]]
    kind = "nvme"
    capacity = "200GiB"
    path = "/mnt/nvme/kvstore"
    eviction = "adaptive"

Capacities need a unit (kvstore/units.py): `capacity = 4` is refused, `capacity_bytes = 4096` is a byte count.

Environment overrides: KVSTORE_<FIELD> for top-level fields (KVSTORE_MODEL_ID, KVSTORE_PUT_TIMEOUT_S)
and KVSTORE_<KIND>_<FIELD> for a tier's (KVSTORE_HOST_CAPACITY=8GiB, KVSTORE_NVME_PATH=/mnt/x). They
layer onto the configuration in force (the file, or the no-file default host + NVMe): a tier variable
changes or adds that tier and leaves the others as they are. `kvstore config show` prints every field
with where it came from (kvstore/config_origins.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from kvstore.errors import ConfigError
from kvstore.flags import parse_bool, parse_bool_or_auto
from kvstore.layout import PRESETS, KVLayout
from kvstore.types import TierKind
from kvstore.units import parse_bytes

DISK_KINDS = (TierKind.NVME, TierKind.PFS, TierKind.REDIS)


@dataclass(frozen=True, slots=True, kw_only=True)
class TierConfig:
    """One tier: its kind, size, where it lives and which policies govern it.

    Attributes:
        kind: host, gpu, nvme, pfs or redis (one tier of each kind at most).
        capacity_bytes: how much the tier may hold, with a unit (`capacity = "64GiB"`); a bare number is refused.
        path: the folder of a disk tier (nvme, pfs); default: under the cache dir; for redis its URL.
        eviction: which chunk leaves when the tier is full: adaptive, lru, lfu, arc or s3fifo.
        admission: which chunks the tier takes from a put: always, second_hit (a chunk's second put) or ghost.
        codec: none, blosc-lz4, zstd, nvcomp-lz4, int8, fp8 (lossy: allow_lossy) or auto (the compression policy's).
        codec_threads: threads per decode, and chunks encoded at once by background writes (at most 8);
            0 = every core.
        read_bytes_per_s, write_bytes_per_s: the device's bandwidth, for compression = "measured";
            0 = probed at start (disk tiers) or a default.
        raw_when_encoder_busy: a background write that finds every encoder busy stores its chunk raw (puts keep
            the disk's pace, less disk saved); "auto": only where the codec encodes under 0.9 of the tier's write.
        num_workers: threads of the tier's own I/O pool.
        options: tier-specific settings (redis: prefix, pool sizes, socket_timeout_s...).
    """

    kind: TierKind
    capacity_bytes: int
    path: str | None = None
    eviction: str = "adaptive"
    admission: str = "always"
    codec: str = "none"
    codec_threads: int = 0  # threads per decode; chunks encoded at once by background writes (<= 8); 0 = every core
    read_bytes_per_s: float = 0.0  # bandwidth for the `measured` compression policy; 0 = probed (disk tiers) or default
    write_bytes_per_s: float = 0.0
    # A background write that finds every encoder busy with other chunks stores its chunk raw instead of
    # waiting: the disk never idles behind a CPU-bound encoder (puts at least as fast as a raw tier, less disk
    # saved). "auto": only where the codec's put falls below 0.9 of the tier's write by the compression policy's
    # speeds (policies/compression/speed_check.py), i.e. where always compressing would make puts slower than raw
    raw_when_encoder_busy: bool | str = "auto"
    num_workers: int = 4
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, TierKind):
            object.__setattr__(self, "kind", TierKind.parse(self.kind))
        if self.capacity_bytes <= 0:
            raise ConfigError(f"tier {self.kind.value}: capacity must be positive, got {self.capacity_bytes}")
        if self.kind in (TierKind.NVME, TierKind.PFS) and not self.path:
            raise ConfigError(f"tier {self.kind.value}: needs a path (a directory on that device)")
        if self.num_workers < 1:
            raise ConfigError(f"tier {self.kind.value}: num_workers must be >= 1, got {self.num_workers}")
        if self.codec_threads < 0:
            raise ConfigError(f"tier {self.kind.value}: codec_threads must be >= 0 (0 = every core), "
                              f"got {self.codec_threads}")
        if not isinstance(self.raw_when_encoder_busy, bool) and self.raw_when_encoder_busy != "auto":
            raise ConfigError(f"tier {self.kind.value}: raw_when_encoder_busy must be true, false or \"auto\", "
                              f"got {self.raw_when_encoder_busy!r}")

    @property
    def is_disk(self) -> bool:
        return self.kind in DISK_KINDS


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """A TieredStore: the model's layout, its tiers (any order; sorted fastest first) and limits.

    Attributes:
        model_id: the model whose KV is stored: a preset (llama-3-8b, llama-3-70b, qwen2.5-7b, mistral-7b,
            deepseek-v3) also picks the layout; else give a [layout] table or hf_config.
        tenant_salt: folded into every key of an embedded store (the daemon's tenants have their own salts).
        write_queue_depth: chunks queued per lower tier before a put waits (backpressure).
        writers_per_tier, readers_per_tier: threads that write to and read from each disk tier.
        put_timeout_s: how long a put waits for room or queue space before reporting the chunk
            as not stored / not replicated.
        replicate_to: lower tiers that get a copy of every put; None = every disk tier.
        promote_on_read: copy a chunk read from a disk tier into the top memory tier.
        compression: the compression policy (`static`: each tier's fixed codec; `utility`: codec per
            chunk for tiers with codec "auto", and compress-in-place vs demote vs drop under pressure;
            `measured`: for tiers with codec "auto", the codec that calibrated speeds say beats the raw tier).
        allow_lossy: permit the lossy codecs (int8, fp8); off by default, they change model output.
        any_layout: serve every layout a client registers besides `layout` (kvstore/store/layouts.py), one
            memory and disk budget for all of them; the default for a config that names no layout (no
            [layout], hf_config, model or model_id), where `layout` is the default preset.
    """

    layout: KVLayout
    tiers: tuple[TierConfig, ...]
    model_id: str = "default"
    tenant_salt: str = ""
    write_queue_depth: int = 64
    writers_per_tier: int = 2
    readers_per_tier: int = 4
    put_timeout_s: float = 5.0
    replicate_to: tuple[TierKind, ...] | None = None
    promote_on_read: bool = True
    compression: str = "static"
    allow_lossy: bool = False
    any_layout: bool = False

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("a store needs at least one tier; add e.g. [[tiers]] kind = 'host'")
        kinds = [t.kind for t in self.tiers]
        if len(set(kinds)) != len(kinds):
            raise ConfigError(f"each tier kind may appear once, got {[k.value for k in kinds]}")
        order = list(TierKind)
        object.__setattr__(self, "tiers", tuple(sorted(self.tiers, key=lambda t: order.index(t.kind))))
        if self.write_queue_depth < 1 or self.readers_per_tier < 1 or self.writers_per_tier < 1:
            raise ConfigError("write_queue_depth, readers_per_tier and writers_per_tier must be >= 1")
        if self.put_timeout_s < 0:
            raise ConfigError(f"put_timeout_s must be >= 0, got {self.put_timeout_s}")
        if self.replicate_to is not None:
            object.__setattr__(self, "replicate_to", tuple(TierKind.parse(k) if isinstance(k, str) else k
                                                           for k in self.replicate_to))

    def tier(self, kind: TierKind) -> TierConfig | None:
        return next((t for t in self.tiers if t.kind is kind), None)

    @classmethod
    def embedded(cls, *, layout: KVLayout, root_dir: str | Path | None = None, model_id: str = "default",
                 host_bytes: int = 2 << 30, nvme_bytes: int = 16 << 30, **overrides: Any) -> StoreConfig:
        """The default that needs nothing: host tier in RAM, NVMe tier under the user cache dir."""
        root = Path(root_dir) if root_dir is not None else default_cache_dir()
        tiers = (
            TierConfig(kind=TierKind.HOST, capacity_bytes=host_bytes),
            TierConfig(kind=TierKind.NVME, capacity_bytes=nvme_bytes, path=str(root / "nvme")),
        )
        return cls(layout=layout, tiers=tiers, model_id=model_id, **overrides)


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """$KVSTORE_CACHE_DIR, else the user's cache directory (~/.cache/kvstore on Linux)."""
    import platformdirs

    env = os.environ if env is None else env
    return Path(env.get("KVSTORE_CACHE_DIR") or platformdirs.user_cache_dir("kvstore"))


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> StoreConfig:
    """Read a TOML/YAML config (or the embedded default when `path` is None), then apply env overrides."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        data = read_config_file(Path(path))
    data = apply_env_overrides(data, env)
    return config_from_dict(data, cache_dir=default_cache_dir(env))


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


_TOP_FIELDS = {f.name for f in dataclasses.fields(StoreConfig)} - {"layout", "tiers"}
_TIER_FIELDS = {f.name for f in dataclasses.fields(TierConfig)} | {"capacity"}
LAYOUT_KEYS = ("layout", "model", "chunk_tokens", "dtype", "hf_config")  # read by _layout_from
DEFAULT_TIER_KINDS = (TierKind.HOST, TierKind.NVME)  # the no-file default (StoreConfig.embedded)
NOT_OVERRIDES = ("KVSTORE_CACHE_DIR",)


@dataclass(frozen=True, slots=True)
class EnvOverride:
    """One KVSTORE_* variable that sets a config field: `tier` is a tier kind, or None for a top-level key."""

    variable: str
    tier: str | None
    key: str
    value: str


def env_overrides(env: Mapping[str, str]) -> list[EnvOverride]:
    """The KVSTORE_<FIELD> and KVSTORE_<KIND>_<FIELD> variables in `env` that set config fields.

    Other KVSTORE_* variables (KVSTORE_PORT, KVSTORE_CACHE_DIR...) belong to other parts and are left
    alone; a tier variable with an unknown field is refused, naming the valid ones.
    """
    kinds = {k.value for k in TierKind}
    found = []
    for name, value in sorted(env.items()):
        if not name.startswith("KVSTORE_") or name in NOT_OVERRIDES:
            continue
        rest = name[len("KVSTORE_"):].lower()
        head, _, tail = rest.partition("_")
        if head in kinds and tail:
            if tail not in _TIER_FIELDS:
                raise ConfigError(f"{name}: unknown tier field {tail!r}; valid: {sorted(_TIER_FIELDS - {'kind'})}")
            found.append(EnvOverride(name, head, tail, value))
        elif rest in _TOP_FIELDS or rest in LAYOUT_KEYS[1:]:
            found.append(EnvOverride(name, None, rest, value))
    return found


def apply_env_overrides(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """`data` with the environment's overrides layered on: a tier variable changes that tier of the
    configuration in force (the file's tiers, or the no-file default host + NVMe), adding the tier
    when it is not there; it never replaces the tier list."""
    overrides = env_overrides(env)
    tiers = [dict(t) for t in data.get("tiers") or []]
    if not tiers and any(o.tier for o in overrides):
        tiers = [{"kind": kind.value} for kind in DEFAULT_TIER_KINDS]
    data = {**data, "tiers": tiers}
    for override in overrides:
        if override.tier is None:
            data[override.key] = override.value
            continue
        tier = next((t for t in tiers if str(t.get("kind", "")).lower() == override.tier), None)
        if tier is None:
            tier = {"kind": override.tier}
            tiers.append(tier)
        if override.key in ("capacity", "capacity_bytes"):  # one capacity: the variable's replaces the file's
            tier.pop("capacity", None)
            tier.pop("capacity_bytes", None)
        tier[override.key] = override.value
    return data


def config_from_dict(data: Mapping[str, Any], *, cache_dir: Path | None = None) -> StoreConfig:
    """A StoreConfig from parsed TOML/YAML/env data; missing parts take the embedded defaults."""
    data = dict(data)
    # [service] and [cluster] tables belong to the daemon (service/config.py, kvstore/cluster/config.py)
    data.pop("service", None)
    data.pop("cluster", None)
    valid = _TOP_FIELDS | {"tiers", "service", "cluster", *LAYOUT_KEYS}
    unknown = set(data) - valid
    if unknown:
        raise ConfigError(f"unknown config keys {sorted(unknown)}; valid: {sorted(valid)}")
    names_layout = any(key in data for key in (*LAYOUT_KEYS, "model_id"))
    data.setdefault("any_layout", not names_layout)  # no layout named: serve every model that registers
    model_id = str(data.pop("model", None) or data.get("model_id") or "llama-3-8b")
    data["model_id"] = model_id
    layout = _layout_from(data, model_id)
    cache_dir = cache_dir or default_cache_dir()
    tiers = tuple(_tier_from(t, cache_dir) for t in data.pop("tiers", None) or [])
    if not tiers:
        tiers = StoreConfig.embedded(layout=layout, root_dir=cache_dir).tiers
    top: dict[str, Any] = {}
    for key in _TOP_FIELDS & set(data):
        top[key] = _coerce(key, data[key], StoreConfig)
    return StoreConfig(layout=layout, tiers=tiers, **top)


def _layout_from(data: dict[str, Any], model_id: str) -> KVLayout:
    chunk_tokens = int(data.pop("chunk_tokens", 256))
    dtype = str(data.pop("dtype", "bfloat16"))
    layout = data.pop("layout", None)
    hf_config = data.pop("hf_config", None)
    if isinstance(layout, Mapping):
        return KVLayout.from_dict({"chunk_tokens": chunk_tokens, "dtype": dtype, **layout})
    if hf_config:
        return KVLayout.from_hf_config(hf_config, chunk_tokens=chunk_tokens)
    if model_id.lower() in PRESETS:
        return KVLayout.from_preset(model_id, dtype=dtype, chunk_tokens=chunk_tokens)
    raise ConfigError(f"model {model_id!r} is not a preset ({', '.join(sorted(PRESETS))}); "
                      "give a [layout] table or hf_config = 'path/to/config.json'")


def _tier_from(raw: Mapping[str, Any], cache_dir: Path) -> TierConfig:
    """One [[tiers]] entry; a disk tier without a path gets its folder under the cache directory."""
    raw = dict(raw)
    if "kind" not in raw:
        raise ConfigError(f"a tier entry needs a kind (one of {[k.value for k in TierKind]}), got {raw}")
    kind = TierKind.parse(raw.pop("kind"))
    unknown = set(raw) - _TIER_FIELDS
    if unknown:
        raise ConfigError(f"tier {kind.value}: unknown keys {sorted(unknown)}; valid: {sorted(_TIER_FIELDS - {'kind'})}")
    if "capacity" in raw and "capacity_bytes" in raw:
        raise ConfigError(f"tier {kind.value}: both capacity and capacity_bytes are set; keep one")
    if "capacity" in raw:  # a unit is required: `capacity = 4` would be a 4-byte tier
        raw["capacity_bytes"] = parse_bytes(raw.pop("capacity"), field=f"tier {kind.value}: capacity",
                                            require_unit=True)
    raw.setdefault("capacity_bytes", _DEFAULT_CAPACITY[kind])
    if kind in (TierKind.NVME, TierKind.PFS) and not raw.get("path"):
        raw["path"] = str(cache_dir / kind.value)
    fields = {key: _coerce(key, value, TierConfig, where=f"tier {kind.value}: ") for key, value in raw.items()}
    return TierConfig(kind=kind, **fields)


_DEFAULT_CAPACITY = {TierKind.GPU: 1 << 30, TierKind.HOST: 2 << 30, TierKind.NVME: 16 << 30,
                     TierKind.PFS: 64 << 30, TierKind.REDIS: 4 << 30}


def _coerce(key: str, value: Any, cls: type, *, where: str = "") -> Any:
    if key.endswith("_bytes"):
        return parse_bytes(value, field=where + key)
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    kind = str(types.get(key, ""))
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("bool | str"):  # true, false or "auto"
            return parse_bool_or_auto(value, field=where + key)
        if kind.startswith("bool"):
            return parse_bool(value, field=where + key)
        if key == "replicate_to" and isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if key == "replicate_to":
            return tuple(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}{key}: cannot use {value!r}: {exc}") from exc
    return value
