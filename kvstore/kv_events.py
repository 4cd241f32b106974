"""KV events on the wire: vLLM's `KVEventBatch` of `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, as msgspec Structs.

The shape is vLLM's (vllm/distributed/kv_events.py), so a subscriber written for vLLM (llm-d's KV-cache
manager, Dynamo's KV router, vLLM's example subscriber) decodes kvstore's batches unchanged:

    batch   [ts, [event, ...], data_parallel_rank]          a msgpack array (array_like)
    event   {"type": "BlockStored", "block_hashes": [...],   a msgpack map tagged by class name;
             "parent_block_hash": ..., "token_ids": [...],   optional fields left at their default
             "block_size": N, "lora_id": ..., "medium": ..., are omitted
             "lora_name": ..., ...}

A block hash is `bytes` or an `int` (vLLM's `ExternalBlockHash`); msgpack carries at most 64-bit ints, so
kvstore's 128-bit chunk keys travel as their 16 bytes, or as their low 64 bits where a subscriber needs ints.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvstore.types import TierKind

BlockHash = bytes | int

# The medium each tier's events name. GPU and CPU are vLLM's names; a local disk is vLLM's STORAGE (its CPU
# offloading connector's second tier); the shared tiers get names of their own, so that a subscriber counting
# copies per medium never confuses a removal from one disk tier with one from another.
TIER_MEDIUM: dict[TierKind, str] = {TierKind.GPU: "GPU", TierKind.HOST: "CPU", TierKind.NVME: "STORAGE",
                                    TierKind.PFS: "PFS", TierKind.REDIS: "REDIS"}
OWNERSHIP = "kvstore"  # vLLM's `ownership`: the secondary tier that generated the event


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """One change to what a publisher holds; the msgpack map's "type" key names the class."""


class BlockStored(KVCacheEvent):
    """Blocks now held in `medium`: `block_hashes` in prefix order, the first one's parent given when known."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks no longer held in `medium` (held elsewhere still if another medium said so)."""

    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Forget every block this publisher announced: a restart or a resync follows with what is held now."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]


def block_hash(key: bytes, *, as_int: bool) -> BlockHash:
    """A chunk key as a block hash: its bytes, or (`as_int`) its low 64 bits, as vLLM's
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES folds its own hashes."""
    return int.from_bytes(key, "big") & ((1 << 64) - 1) if as_int else bytes(key)


def encode_batch(batch: KVEventBatch) -> bytes:
    return msgspec.msgpack.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its msgpack bytes; raises msgspec.DecodeError on anything else."""
    return msgspec.msgpack.decode(payload, type=KVEventBatch)
