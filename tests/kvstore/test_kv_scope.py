"""What a cached chunk is valid for: every field of a scope separates key spaces, the chain stays stable."""

from __future__ import annotations

import dataclasses

import pytest

from kvstore.errors import ConfigError
from kvstore.hashing import ChunkHasher, chunk_keys
from kvstore.kv_scope import ModelIdentity, named_key, scope_root, shard_keys

STORE_ROOT = b"\x01" * 16
BASE = ModelIdentity(model="org/base-8b", revision="main", kv_dtype="bfloat16", layout_fingerprint=0x1234,
                     tp_size=2, pp_size=1, engine="vllm")


def test_every_field_of_the_scope_separates_keys() -> None:
    variants = [dataclasses.replace(BASE, model="org/fine-tune-8b"), dataclasses.replace(BASE, revision="v2"),
                dataclasses.replace(BASE, kv_dtype="fp8_e4m3"), dataclasses.replace(BASE, layout_fingerprint=0x1235),
                dataclasses.replace(BASE, tp_size=4), dataclasses.replace(BASE, pp_size=2),
                dataclasses.replace(BASE, engine="sglang")]
    roots = {scope_root(STORE_ROOT, BASE)} | {scope_root(STORE_ROOT, v) for v in variants}
    roots |= {scope_root(STORE_ROOT, BASE, adapter="sql"), scope_root(STORE_ROOT, BASE, salt="tenant-1"),
              scope_root(b"\x02" * 16, BASE)}
    assert len(roots) == len(variants) + 4, "no two scopes share a root"
    assert scope_root(STORE_ROOT, BASE) != STORE_ROOT, "a scoped key never equals the pre-scope key"


def test_fields_cannot_run_into_each_other() -> None:
    """Length-prefixed fields: moving a separator between model and revision gives another root."""
    a = dataclasses.replace(BASE, model="org/a", revision="bc")
    b = dataclasses.replace(BASE, model="org/ab", revision="c")
    assert scope_root(STORE_ROOT, a) != scope_root(STORE_ROOT, b)
    assert scope_root(STORE_ROOT, BASE, adapter="x", salt="") != scope_root(STORE_ROOT, BASE, adapter="", salt="x")


def test_the_same_scope_gives_the_same_keys_in_any_process() -> None:
    """Pinned: keys are part of the on-disk format, so a change of derivation must be deliberate."""
    root = BASE.scope(adapter="sql", salt="t1").root(STORE_ROOT)
    assert root.hex() == "35a2912189c9da38ae240123fe940b40"
    assert root == scope_root(STORE_ROOT, BASE, adapter="sql", salt="t1")


def test_shards_of_one_chunk_have_their_own_keys_and_rank_zero_keeps_the_chain() -> None:
    keys = chunk_keys(list(range(64)), scope_root(STORE_ROOT, BASE), 16)
    assert shard_keys(keys, 0, 0) == keys
    ranks = [shard_keys(keys, t, p) for t in range(2) for p in range(2)]
    assert len({k for rank in ranks for k in rank}) == 4 * len(keys)


def test_named_keys_depend_on_the_root_and_the_name() -> None:
    a, b = scope_root(STORE_ROOT, BASE), scope_root(STORE_ROOT, BASE, salt="s")
    assert named_key(a, "chunk-1") != named_key(b, "chunk-1") != named_key(a, "chunk-2")
    assert len(named_key(a, "chunk-1")) == 16


def test_a_scope_needs_a_model_and_sane_parallel_sizes() -> None:
    with pytest.raises(ConfigError, match="model"):
        ModelIdentity(model="", kv_dtype="bfloat16", layout_fingerprint=1)
    with pytest.raises(ConfigError, match="parallel sizes"):
        ModelIdentity(model="m", kv_dtype="bfloat16", layout_fingerprint=1, tp_size=0)


def test_incremental_keys_match_the_batch_under_a_scope() -> None:
    root = BASE.scope(salt="t").root(STORE_ROOT)
    tokens = list(range(1000, 1000 + 16 * 9 + 5))
    hasher = ChunkHasher(root, 16)
    got = hasher.extend(tokens[:20]) + hasher.extend(tokens[20:21]) + hasher.extend(tokens[21:])
    assert got == hasher.keys == chunk_keys(tokens, root, 16)
    assert hasher.num_tokens == len(tokens)
