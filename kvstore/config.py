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

A capacity needs its unit (kvstore/units.py): `capacity = 4` is refused, `capacity = "4096B"` is 4096 bytes.
Each table becomes its dataclass through msgspec (kvstore/config_convert.py), which names the setting, the
value and the fix when a value does not fit.

Environment overrides: KVSTORE_<FIELD> for top-level fields (KVSTORE_MODEL_ID, KVSTORE_PUT_TIMEOUT_S)
and KVSTORE_<KIND>_<FIELD> for a tier's (KVSTORE_HOST_CAPACITY=8GiB, KVSTORE_NVME_PATH=/mnt/x). They
layer onto the configuration in force (the file, or the no-file default host + NVMe): a tier variable
changes or adds that tier and leaves the others as they are. `layered` keeps where each key came from,
for `kvstore config show` (kvstore/config_origins.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvstore.config_convert import FILE_KEYS, convert
from kvstore.config_env import EnvKeys, Layered, layer_env, read_config_file
from kvstore.errors import ConfigError
from kvstore.layout import PRESETS, KVLayout
from kvstore.types import TierKind
from kvstore.units import Size

logger = logging.getLogger(__name__)

DISK_KINDS = (TierKind.NVME, TierKind.PFS, TierKind.REDIS)


@dataclass(frozen=True, slots=True, kw_only=True)
class TierConfig:
    """One tier: its kind, size, where it lives and which policies govern it.

    Attributes:
        kind: host, gpu, nvme, pfs or redis (one tier of each kind at most).
        capacity_bytes: how much the tier may hold, with a unit (`capacity = "64GiB"`); a bare number is refused.
        path: the folder of a disk tier (nvme, pfs); default: under the cache dir (redis: options.url).
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
    capacity_bytes: Size
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
    raw_when_encoder_busy: bool | Literal["auto"] = "auto"
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



@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutKeys:
    """The top-level keys that choose the layout with `model_id` (read before the StoreConfig is built).

    Attributes:
        chunk_tokens: tokens per chunk, the unit of storage and lookup (a multiple of the engine's block size).
        dtype: the KV dtype of a preset's layout.
        hf_config: a Hugging Face config.json to read the layout from (layers, KV heads, head dim).
        layout: the layout spelled out: num_layers, num_kv_heads, head_dim, dtype, chunk_tokens.
    """

    chunk_tokens: int = 256
    dtype: str = "bfloat16"
    hf_config: str | None = None
    layout: dict[str, Any] | None = None

    def to_layout(self, model_id: str) -> KVLayout:
        """The [layout] table, else hf_config, else the preset `model_id` names; ConfigError naming the fix."""
        if self.layout is not None:
            return KVLayout.from_dict({"chunk_tokens": self.chunk_tokens, "dtype": self.dtype, **self.layout})
        if self.hf_config:
            return KVLayout.from_hf_config(self.hf_config, chunk_tokens=self.chunk_tokens)
        if model_id.lower() in PRESETS:
            return KVLayout.from_preset(model_id, dtype=self.dtype, chunk_tokens=self.chunk_tokens)
        raise ConfigError(f"model {model_id!r} is not a preset ({', '.join(sorted(PRESETS))}); "
                          "give a [layout] table or hf_config = 'path/to/config.json'")


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """$KVSTORE_CACHE_DIR, else the user's cache directory (~/.cache/kvstore on Linux)."""
    import platformdirs

    env = os.environ if env is None else env
    return Path(env.get("KVSTORE_CACHE_DIR") or platformdirs.user_cache_dir("kvstore"))


LAYOUT_KEYS = tuple(f.name for f in dataclasses.fields(LayoutKeys))
DEFAULT_CAPACITY = {TierKind.GPU: "1GiB", TierKind.HOST: "2GiB", TierKind.NVME: "16GiB", TierKind.PFS: "64GiB",
                    TierKind.REDIS: "4GiB"}
RENAMED = {"model": "model_id"}  # keys that duplicated another: read as it, with a warning naming it
TIER_RENAMED = {"capacity_bytes": "capacity"}
CLUSTER_TABLE = ("the [cluster] table is not read: a daemon joins a cluster by its environment (KVSTORE_CLUSTER_URL, "
                 "and optionally KVSTORE_CLUSTER_NAME, _NODE_ID, _NODE_URL, _REDIS_CLUSTER, _PFS_BUDGET; "
                 "docs/operations.md); remove the table")


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> StoreConfig:
    """Read a TOML/YAML config (or the embedded default when `path` is None), then apply env overrides."""
    env = os.environ if env is None else env
    return config_from_dict(layered(path, env).data, cache_dir=default_cache_dir(env))


def env_keys() -> EnvKeys:
    """The keys KVSTORE_* variables may set: top-level (with the layout keys but the [layout] table) and per tier."""
    top = {f.name for f in dataclasses.fields(StoreConfig)} - {"layout", "tiers"}
    tier = {FILE_KEYS.get(f.name, f.name) for f in dataclasses.fields(TierConfig)} - {"kind"}
    return EnvKeys(top=frozenset(top | set(LAYOUT_KEYS[:-1])), tier=frozenset(tier), renamed=RENAMED,
                   tier_renamed=TIER_RENAMED)


def layered(path: str | Path | None, env: Mapping[str, str]) -> Layered:
    """The file at `path` (none: no file) with the environment's overrides layered on, and each key's origin."""
    data = read_config_file(Path(path)) if path is not None else {}
    return layer_env(data, f"file {path}", env, env_keys())


def config_from_dict(data: Mapping[str, Any], *, cache_dir: Path | None = None) -> StoreConfig:
    """A StoreConfig from parsed TOML/YAML/env data; missing parts take the embedded defaults."""
    data = dict(data)
    data.pop("service", None)  # the daemon's (service/config.py)
    if "cluster" in data:
        raise ConfigError(CLUSTER_TABLE)
    _rename(data, "model", RENAMED["model"], "")
    data.setdefault("any_layout", not any(key in data for key in (*LAYOUT_KEYS, "model_id")))  # none: every model
    keys = convert({key: data.pop(key) for key in LAYOUT_KEYS if key in data}, LayoutKeys)
    data.setdefault("model_id", "llama-3-8b")
    cache_dir = cache_dir or default_cache_dir()
    raw_tiers = data.pop("tiers", None) or []
    if not isinstance(raw_tiers, list):
        raise ConfigError(f"tiers = {raw_tiers!r} is not a list of tables; write [[tiers]] tables, e.g. "
                          "[[tiers]] kind = 'host' capacity = '4GiB'")
    layout = keys.to_layout(str(data["model_id"]))
    tiers = tuple(_tier_from(t, cache_dir) for t in raw_tiers) or StoreConfig.embedded(layout=layout,
                                                                                       root_dir=cache_dir).tiers
    return convert({**data, "layout": layout, "tiers": tiers}, StoreConfig, also_valid=(*LAYOUT_KEYS, "service"))


def _tier_from(raw: object, cache_dir: Path) -> TierConfig:
    """One [[tiers]] entry; a disk tier without a path gets its folder under the cache directory."""
    if not isinstance(raw, Mapping) or "kind" not in raw:
        raise ConfigError(f"a tier entry needs a kind (one of {[k.value for k in TierKind]}), got {raw}")
    table = dict(raw)
    kind = TierKind.parse(table.pop("kind"))
    where = f"tier {kind.value}: "
    _rename(table, "capacity_bytes", TIER_RENAMED["capacity_bytes"], where, _with_bytes_unit)
    table.setdefault("capacity", DEFAULT_CAPACITY[kind])
    if kind in (TierKind.NVME, TierKind.PFS) and not table.get("path"):
        table["path"] = str(cache_dir / kind.value)
    return convert({**table, "kind": kind}, TierConfig, where=where)


def _rename(table: dict[str, Any], old: str, new: str, where: str,
            value_as: Callable[[Any], Any] = lambda value: value) -> None:
    """A retired key that duplicated `new`: read as `new`, with a warning giving the line to write instead."""
    if old not in table:
        return
    if new in table:
        raise ConfigError(f"{where}{old} and {new} are both set; {old} is no longer a setting: remove it, keep {new}")
    table[new] = value_as(table.pop(old))
    logger.warning("%s%s is no longer a setting; write %s = %r instead (read as that now)", where, old, new, table[new])


def _with_bytes_unit(value: Any) -> Any:
    """A bare byte count (what `capacity_bytes` took) as a size with its unit: 4096 -> "4096B"."""
    plain = isinstance(value, int) and not isinstance(value, bool)
    return f"{value}B" if plain or (isinstance(value, str) and value.strip().isdigit()) else value
