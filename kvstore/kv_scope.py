"""What a cached chunk is valid for: the model, its KV shape and shard, the request's adapter and salt.

Two engines may reuse each other's KV only when the same weights computed it (model name or path and
revision, or an explicit `model_id` naming identical weights), in the same KV dtype and layout, for the
same tensor/pipeline-parallel shard, under the same LoRA adapter; a request's salt (vLLM's
`cache_salt`) keeps tenants apart on top of that. `scope_root` folds all of it into the 16-byte root
that a prompt's chained chunk keys start from, so KV that differs in any of these never shares a key::

    root = xxh3_128("kvstore-scope/2" | store root | model | revision | dtype | layout | tp size
                    | pp size | engine extra | adapter | salt)
    key[0] = xxh3_128(root || tokens of chunk 0), key[i] = xxh3_128(key[i-1] || tokens of chunk i)
    rank r's key = key (rank 0) or xxh3_128(key || "|tp<r>|pp<p>")      (shard_keys)

An MLA latent is the same on every tensor-parallel rank (each rank caches the whole latent, not a slice of the
heads), so for MLA the TP size and rank are left out of the keys (`shard_role`): any TP size reads the chunks
any other wrote, and one rank writes them while the others only load.

The store root (`TieredStore.root_key`, the daemon's namespace and tenant) stays underneath, so a
daemon's tenants stay separate too. Every integration (vLLM, LMCache, SGLang, the own engine) derives
its keys through this one function; keys written before it existed start from the bare store root and
so read as misses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from kvstore.errors import ConfigError
from kvstore.layout import AttentionKind

SCOPE_VERSION = "kvstore-scope/2"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelIdentity:
    """The engine-wide part of a scope: what computed the KV and which shard of it this process holds.

    Args:
        model: the model's name or path as the engine loaded it, or an explicit id that names identical
            weights (set the same id on two paths to the same weights so that they share).
        revision: the weights' revision ("" when the engine has none).
        kv_dtype: the KV cache's element type ("bfloat16", "fp8_e4m3", ...).
        layout_fingerprint: `KVLayout.fingerprint` (layers, heads, head size, dtype, chunk size, kind).
        tp_size, pp_size: how the KV is sharded (each rank's keys then differ through `shard_keys`).
        engine: engine-specific fields that also change the KV bytes (e.g. LMCache's format).
    """

    model: str
    revision: str = ""
    kv_dtype: str
    layout_fingerprint: int
    tp_size: int = 1
    pp_size: int = 1
    engine: str = ""

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("a KV scope needs the model's name or path (or an explicit model_id)")
        if self.tp_size < 1 or self.pp_size < 1:
            raise ConfigError(f"parallel sizes must be >= 1, got tp={self.tp_size} pp={self.pp_size}")

    def scope(self, *, adapter: str = "", salt: str = "") -> KeyScope:
        """This model's scope for one request (its LoRA adapter and salt)."""
        return KeyScope(identity=self, adapter=adapter, salt=salt)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyScope:
    """A request's scope: the model identity, its LoRA adapter ("" for the base model) and its salt."""

    identity: ModelIdentity
    adapter: str = ""
    salt: str = ""
    _roots: dict[bytes, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def root(self, store_root: bytes) -> bytes:
        """The root key of this scope's chunk keys under `store_root` (cached per store root)."""
        cached = self._roots.get(store_root)
        if cached is None:
            cached = self._roots[store_root] = scope_root(store_root, self.identity, adapter=self.adapter,
                                                          salt=self.salt)
        return cached


def scope_root(store_root: bytes, identity: ModelIdentity, *, adapter: str = "", salt: str = "") -> bytes:
    """The one function that derives a chunk-key root from everything that makes KV reusable."""
    i = identity
    fields = (SCOPE_VERSION, store_root.hex(), i.model, i.revision, i.kv_dtype, f"{i.layout_fingerprint:016x}",
              f"tp{i.tp_size}", f"pp{i.pp_size}", i.engine, adapter, salt)
    return xxhash.xxh3_128_digest("\0".join(f"{len(f)}:{f}" for f in fields).encode())


def shard_keys(keys: Sequence[bytes], tp_rank: int, pp_rank: int = 0) -> list[bytes]:
    """The keys of one rank's shard of the chunks `keys` name: rank (0, 0) keeps them (so the scheduler's
    lookups, which see rank 0 only, need no rank), every other rank gets its own."""
    if tp_rank == 0 and pp_rank == 0:
        return list(keys)
    tag = f"|tp{tp_rank}|pp{pp_rank}".encode()
    return [xxhash.xxh3_128_digest(key + tag) for key in keys]


@dataclass(frozen=True, slots=True)
class ShardRole:
    """Which shard of a model's KV one tensor-parallel rank's keys name, and whether that rank writes it."""

    key_tp_size: int  # the TP size folded into the scope (ModelIdentity.tp_size)
    key_tp_rank: int  # the TP rank its keys carry (shard_keys)
    writes: bool  # False: another rank holds and writes the same bytes; this one only loads


def shard_role(kind: AttentionKind, tp_size: int, tp_rank: int) -> ShardRole:
    """A rank's role: MHA/GQA ranks hold their own heads (own keys, each writes); MLA ranks hold the same latent
    (the keys of TP size 1, rank 0), which only rank 0 writes."""
    if kind is AttentionKind.MLA:
        return ShardRole(key_tp_size=1, key_tp_rank=0, writes=tp_rank == 0)
    return ShardRole(key_tp_size=tp_size, key_tp_rank=tp_rank, writes=True)


def named_key(root: bytes, name: str) -> bytes:
    """A 16-byte key for a chunk an engine names itself (LMCache's and SGLang's own prefix hashes), under a
    scope's root."""
    return xxhash.xxh3_128_digest(root + b"|" + name.encode())
