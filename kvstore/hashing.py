"""Chained 128-bit chunk keys over token ids: key[i] = xxh3_128(key[i-1] || tokens of chunk i).

key[-1] is the namespace root, xxh3_128 of (model id, layout fingerprint, tenant salt), so two
prompts share key i exactly when they share the first (i+1)*chunk_tokens tokens and the namespace.
Token ids are hashed as little-endian int32, so keys are the same on every machine and process.
Only full chunks are keyed by the chain; a prompt's partial tail has a key of its own (`ChunkHasher.tail_key`,
domain-separated), used only where a partial chunk is handed from one engine to another (the vLLM connector's
prefill/decode handoff).
"""

from __future__ import annotations

import array
import marshal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, Union

import numpy as np
import xxhash

from kvstore import native_keys
from kvstore.errors import BadChunkError

if TYPE_CHECKING:
    import torch

KEY_BYTES = 16
TOKEN_DTYPE = np.dtype("<i4")
TOKEN_BYTES = TOKEN_DTYPE.itemsize
_NATIVE_INT32 = array.array("i").itemsize == 4 and sys.byteorder == "little"
_MARSHAL_HEAD, _MARSHAL_INT = 5, ord("i")  # a marshalled list: b"[" and a 4-byte count, then its items
_MARSHAL_ITEM = np.dtype([("type", "u1"), ("value", "<i4")])
ChunkKey = bytes
_TAIL_TAG = b"kvstore-tail/1\0"
TokenIds: TypeAlias = Union[Sequence[int], np.ndarray, "torch.Tensor"]  # a prompt's token ids: list, array or tensor
_NATIVE = native_keys.loaded()  # the C twins of _list_to_array's packing and chunk_keys' loop, or None (pure Python)


@dataclass(frozen=True, slots=True, kw_only=True)
class Namespace:
    """What separates one key space from another: model, layout and tenant."""

    model_id: str
    layout_fingerprint: int
    tenant_salt: str = ""

    @property
    def root_key(self) -> ChunkKey:
        text = f"kvstore-ns/1\0{self.model_id}\0{self.layout_fingerprint:016x}\0{self.tenant_salt}"
        return xxhash.xxh3_128_digest(text.encode())

    def for_tenant(self, tenant_salt: str) -> Namespace:
        return Namespace(model_id=self.model_id, layout_fingerprint=self.layout_fingerprint, tenant_salt=tenant_salt)


def as_token_array(token_ids: TokenIds) -> np.ndarray:
    """Token ids (list, numpy or CPU torch tensor) as a contiguous little-endian int32 array."""
    if hasattr(token_ids, "detach") and hasattr(token_ids, "cpu"):  # torch.Tensor, without importing torch
        token_ids = token_ids.detach().cpu().numpy()
    if isinstance(token_ids, (list, tuple)):
        array = _list_to_array(token_ids)
    else:
        array = _checked_array(token_ids)
    if array.ndim != 1:
        raise BadChunkError(f"token ids must be 1-D, got shape {array.shape}; pass one prompt at a time")
    if array.size and array.min() < 0:
        raise BadChunkError(f"token ids must be non-negative, got {array.min()}")
    return np.ascontiguousarray(array)


def _list_to_array(token_ids: list[int] | tuple[int, ...]) -> np.ndarray:
    if _NATIVE is not None:
        try:
            return np.frombuffer(_NATIVE.pack_int32(token_ids), dtype=TOKEN_DTYPE)
        except OverflowError as exc:
            raise BadChunkError(f"{exc}; token ids are a vocabulary's indices") from None
        except TypeError:  # an item that is not an int: the pure path converts it or names the problem
            pass
    return python_list_to_array(token_ids)


def keys_implementation() -> str:
    """How this process packs and chains keys: "C" (kvstore/native_keys.py's build) or "python"."""
    return "python" if _NATIVE is None else "C"


def python_list_to_array(token_ids: list[int] | tuple[int, ...]) -> np.ndarray:
    """The pure-Python twin of the C packing (and the path for items the C loop does not take)."""
    fast = _marshalled_int32(token_ids)
    if fast is not None:
        return fast
    # array.array refuses floats and out-of-range ints.
    if _NATIVE_INT32 and token_ids and not isinstance(token_ids[0], (list, tuple)):
        try:
            return np.frombuffer(array.array("i", token_ids), dtype=TOKEN_DTYPE)
        except (OverflowError, TypeError) as exc:
            raise BadChunkError(f"token ids must be integers in [0, 2**31): {exc}") from exc
    return _checked_array(token_ids)


def _marshalled_int32(token_ids: list[int] | tuple[int, ...]) -> np.ndarray | None:
    """The ids as int32 through marshal (format 2, no back-references), or None when any is not an int
    that fits in 32 bits. marshal writes such an int as b"i" and its 4 bytes little-endian, in one C loop
    over the list: 1.7x faster than array.array("i", ids), which parses a format per item
    (`kvstore bench lookup`, lookup.list_to_int32, 128k ids). Every type byte is checked, so anything else
    (a bool, a big or non-int value) takes the slow path and its error."""
    if not isinstance(token_ids, list) or not token_ids:
        return None
    try:
        data = marshal.dumps(token_ids, 2)
    except ValueError:  # an object marshal cannot write (e.g. a numpy scalar)
        return None
    if len(data) != _MARSHAL_HEAD + _MARSHAL_ITEM.itemsize * len(token_ids):
        return None
    items = np.frombuffer(data, dtype=_MARSHAL_ITEM, offset=_MARSHAL_HEAD)
    if not (items["type"] == _MARSHAL_INT).all():
        return None
    return items["value"].copy()


def _checked_array(token_ids: object) -> np.ndarray:
    try:
        values = np.asarray(token_ids)
    except (OverflowError, TypeError, ValueError) as exc:
        raise BadChunkError(f"token ids must be a flat sequence of ints: {exc}") from exc
    if values.dtype == TOKEN_DTYPE:
        return values
    if values.size and (values.dtype.kind not in "iu" or values.min() < 0 or values.max() > np.iinfo(np.int32).max):
        raise BadChunkError(f"token ids must be non-negative integers below 2**31, got dtype {values.dtype} "
                            f"with range [{values.min()}, {values.max()}]")
    return values.astype(TOKEN_DTYPE)


def chunk_keys(token_ids: TokenIds, root_key: ChunkKey, chunk_tokens: int) -> list[ChunkKey]:
    """Keys of every full chunk of `token_ids`, in prefix order."""
    tokens = as_token_array(token_ids)
    if _NATIVE is not None:
        keys: list[ChunkKey] = _NATIVE.chain_keys(tokens, root_key, chunk_tokens * TOKEN_BYTES)
        return keys
    return python_chunk_keys(tokens, root_key, chunk_tokens)


def python_chunk_keys(tokens: np.ndarray, root_key: ChunkKey, chunk_tokens: int) -> list[ChunkKey]:
    """The pure-Python twin of the C chain: keys of every full chunk of an int32 array."""
    data = tokens.data.cast("B")
    step = chunk_tokens * TOKEN_BYTES
    keys: list[ChunkKey] = []
    key = root_key
    digest = xxhash.xxh3_128_digest
    for start in range(0, len(data) - step + 1, step):
        key = digest(key + data[start : start + step])
        keys.append(key)
    return keys


def iter_chunk_keys(token_ids: TokenIds, root_key: ChunkKey, chunk_tokens: int) -> Iterable[ChunkKey]:
    """Like `chunk_keys` but lazy, so a lookup can stop hashing at the first miss."""
    data = as_token_array(token_ids).data.cast("B")
    step = chunk_tokens * TOKEN_BYTES
    key = root_key
    for start in range(0, len(data) - step + 1, step):
        key = xxhash.xxh3_128_digest(key + data[start : start + step])
        yield key


class ChunkHasher:
    """Incremental keys for tokens that arrive a few at a time (a prompt, then generated tokens).

    `extend(tokens)` returns the keys of the chunks that became full; `keys` holds all so far. Each token
    is converted and hashed once, so keeping a growing request's keys costs O(new tokens) per call.
    """

    def __init__(self, root_key: ChunkKey, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self.keys: list[ChunkKey] = []
        self.num_tokens = 0
        self._last = root_key
        self._pending = np.empty(0, dtype=TOKEN_DTYPE)

    def extend(self, token_ids: TokenIds) -> list[ChunkKey]:
        if _NATIVE is not None and isinstance(token_ids, (list, tuple)):
            done = self._chain_list(token_ids)
            if done is not None:
                return self._advance(len(token_ids), *done)
        tokens = as_token_array(token_ids)
        count = tokens.size
        if self._pending.size:
            tokens = np.concatenate([self._pending, tokens])
        full = tokens.size - tokens.size % self.chunk_tokens
        new = chunk_keys(tokens[:full], self._last, self.chunk_tokens) if full else []
        return self._advance(count, new, tokens[full:].copy())

    def _chain_list(self, token_ids: list[int] | tuple[int, ...]) -> tuple[list[ChunkKey], np.ndarray] | None:
        """The C path for a list (what engines hand a connector): packing and hashing in one pass, no int32
        copy of the whole prompt; the new keys and the ids left over. None when an item is not an int: the
        general path converts it or names it."""
        assert _NATIVE is not None
        try:
            new, tail = _NATIVE.chain_ids(token_ids, self._last, self.chunk_tokens, self._pending.tobytes())
        except OverflowError as exc:
            raise BadChunkError(f"{exc}; token ids are a vocabulary's indices") from None
        except TypeError:
            return None
        return new, np.frombuffer(tail, dtype=TOKEN_DTYPE)

    def _advance(self, count: int, new: list[ChunkKey], pending: np.ndarray) -> list[ChunkKey]:
        """`count` more tokens taken: `new` chunk keys made, `pending` the ids not yet in a whole chunk."""
        self.num_tokens += count
        if new:
            self._last = new[-1]
            self.keys.extend(new)
        self._pending = pending
        return new

    def tail_key(self) -> ChunkKey | None:
        """The key of the tokens after the last whole chunk (None when there are none): xxh3_128 of a
        domain tag, the last chunk key and the tail's tokens, so it never equals a chain key."""
        if not self._pending.size:
            return None
        return xxhash.xxh3_128_digest(_TAIL_TAG + self._last + self._pending.tobytes())


def validate_key(key: object) -> ChunkKey:
    """`key` as 16 bytes; accepts bytes or a 32-char hex string. Raises BadChunkError otherwise."""
    if isinstance(key, str):
        try:
            key = bytes.fromhex(key)
        except ValueError:
            raise BadChunkError(f"chunk key {key[:40]!r} is not hex; keys are 32 hex characters") from None
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise BadChunkError(f"a chunk key is {KEY_BYTES} bytes (32 hex characters), got {key!r:.60}")
    return bytes(key)
