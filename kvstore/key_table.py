"""`KeyTable`: chunk key -> value in flat arrays, about 30-40 bytes a key where a dict takes 42-120.

The daemon keeps a record per chunk it holds in several places (a file tier's metadata, each tenant's
ledger), millions of them. A dict that keys come and go through is rebuilt with room for three times
its keys, so at steady state it costs 60-120 bytes a key (20 bytes per slot of a table sized to the
power of two above 3x its keys), 42 right after one fill. This table keeps its slots in flat arrays
(grown by a sixteenth; its lists of keys and values by an eighth), freed slots reused, and its open-addressing
index (4 bytes a bucket, at most 3/4 full, no tombstones: a removal shifts its probe run back) is the only part
that doubles::

    index   [ 0  3  0  1  0 ...]     bucket -> slot + 1 (0: empty); linear probing from hash & mask
    hashes  [h0 h1 h2 ...]           per slot: the key's hash, the key, its value; freed slots are
    keys    [k0 None k2 ...]         chained on `nexts` from `free`; an ordered table also keeps its
    values  [v0 None v2 ...]         slots on one doubly linked list (oldest first, `move_to_end`)
    nexts / prevs (int32)

Values are any objects, or machine integers (`int_values=True`: 8 bytes each, no int objects).
Pure Python: a lookup costs about a microsecond, where a dict's costs a tenth of that, so it holds
records read beside I/O or once per chunk of a request, never the lookup path's index. Not
thread-safe: its owner locks around every call, reads included (a read that overlaps a removal's
shift could miss a key).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from kvstore import native_keys

V = TypeVar("V")

_NO_SLOT = -1
_MIN_INDEX = 8


class KeyTable(Generic[V]):
    """Hashable key -> value; see the module docstring. `ordered`: slots on a list, oldest first."""

    __slots__ = ("_count", "_free", "_hashes", "_head", "_index", "_int_values", "_keys", "_mask", "_nexts",
                 "_ordered", "_prevs", "_tail", "_values")

    def __init__(self, *, ordered: bool = False, int_values: bool = False) -> None:
        self._ordered = ordered
        self._int_values = int_values
        self._reset()

    def _reset(self) -> None:
        self._index = array("i", bytes(4 * _MIN_INDEX))
        self._mask = _MIN_INDEX - 1
        self._count = 0
        self._hashes = array("q")
        self._keys: list[object] = []
        self._values: Any = array("q") if self._int_values else []  # list[V | None], or array[int] of int values
        self._nexts = array("i")
        self._prevs = array("i")
        self._free = _NO_SLOT
        self._head = _NO_SLOT
        self._tail = _NO_SLOT

    # ----- reads ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        return self._find(key) >= 0

    def get(self, key: object, default: V | None = None) -> V | None:
        slot = self._find(key)
        return default if slot < 0 else self._values[slot]

    def keys(self) -> list[object]:
        """The keys (oldest first when ordered)."""
        return [self._keys[slot] for slot in self._slots()]

    def items(self) -> Iterator[tuple[object, V]]:
        """(key, value) pairs, oldest first when ordered; lazily: the owner holds its lock while iterating."""
        keys, values = self._keys, self._values
        for slot in self._slots():
            yield keys[slot], values[slot]

    def values(self) -> Iterator[V]:
        values = self._values
        for slot in self._slots():
            yield values[slot]

    def nbytes(self) -> int:
        """The bytes its arrays take (the key and value objects themselves not counted)."""
        arrays = [self._index, self._hashes, self._nexts, self._prevs]
        if isinstance(self._values, array):
            arrays.append(self._values)
        size = sum(a.buffer_info()[1] * a.itemsize for a in arrays)
        return size + 8 * len(self._keys) * (1 if isinstance(self._values, array) else 2)

    # ----- changes --------------------------------------------------------------------------------------
    def put(self, key: object, value: V) -> None:
        """Set `key`'s value; a new key goes to the back of an ordered table, a known one stays where it is."""
        h = hash(key)
        slot = self._find_hashed(key, h)
        if slot >= 0:
            self._values[slot] = value
            return
        slot = self._free
        if slot >= 0:
            self._free = self._nexts[slot]
            self._hashes[slot] = h
            self._keys[slot] = key
            self._values[slot] = value
        else:
            slot = len(self._hashes)
            self._hashes.append(h)
            self._keys.append(key)
            self._values.append(value)
            self._nexts.append(_NO_SLOT)
            if self._ordered:
                self._prevs.append(_NO_SLOT)
        self._count += 1
        if 4 * self._count > 3 * len(self._index):
            self._grow_index()
        else:
            self._put_index(h, slot)
        if self._ordered:
            self._push(slot)

    def pop(self, key: object, default: V | None = None) -> V | None:
        """Remove `key`; its value, or `default` when it was not held."""
        slot = self._find(key)
        if slot < 0:
            return default
        value = self._values[slot]
        if self._ordered:
            self._unlink(slot)
        self._drop_index(slot)
        self._keys[slot] = None
        if not self._int_values:
            self._values[slot] = None
        self._nexts[slot] = self._free
        self._free = slot
        self._count -= 1
        if not self._count:
            self._reset()  # an emptied table gives its arrays back
        return value

    def move_to_end(self, key: object) -> bool:
        """Make `key` the newest of an ordered table; False when it is not held."""
        slot = self._find(key)
        if slot < 0:
            return False
        if self._ordered and slot != self._tail:
            self._unlink(slot)
            self._push(slot)
        return True

    def clear(self) -> None:
        self._reset()

    # ----- the index ------------------------------------------------------------------------------------
    def _find(self, key: object) -> int:
        return self._find_hashed(key, hash(key))

    def _find_hashed(self, key: object, h: int) -> int:
        index, hashes, keys, mask = self._index, self._hashes, self._keys, self._mask
        b = h & mask
        while True:
            s = index[b] - 1
            if s < 0:
                return _NO_SLOT
            if hashes[s] == h:
                other = keys[s]
                if other is key or other == key:
                    return s
            b = (b + 1) & mask

    def _put_index(self, h: int, slot: int) -> None:
        index, mask = self._index, self._mask
        b = h & mask
        while index[b]:
            b = (b + 1) & mask
        index[b] = slot + 1

    def _drop_index(self, slot: int) -> None:
        """Clear `slot`'s bucket and shift the later entries of its probe run back (no tombstones)."""
        index, hashes, mask = self._index, self._hashes, self._mask
        i = hashes[slot] & mask
        while index[i] != slot + 1:
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            entry = index[j]
            if not entry:
                break
            k = hashes[entry - 1] & mask
            # the entry at j may move to i unless its home lies cyclically in (i, j]
            if (i <= j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                index[i] = entry
                i = j
        index[i] = 0

    def _grow_index(self) -> None:
        """Double the index and rehash every held slot (built aside, then swapped in)."""
        size = 2 * len(self._index)
        while 4 * self._count > 3 * size:
            size *= 2
        index = array("i", bytes(4 * size))
        mask = size - 1
        hashes, keys = self._hashes, self._keys
        for slot in range(len(hashes)):
            if keys[slot] is not None:
                b = hashes[slot] & mask
                while index[b]:
                    b = (b + 1) & mask
                index[b] = slot + 1
        self._index, self._mask = index, mask

    # ----- the order ------------------------------------------------------------------------------------
    def _slots(self) -> Iterator[int]:
        if self._ordered:
            nexts, slot = self._nexts, self._head
            while slot >= 0:
                following = nexts[slot]  # read first: the owner may pop this key while iterating
                yield slot
                slot = following
        else:
            keys = self._keys
            for slot in range(len(keys)):
                if keys[slot] is not None:
                    yield slot

    def _push(self, slot: int) -> None:
        tail = self._tail
        self._prevs[slot] = tail
        self._nexts[slot] = _NO_SLOT
        if tail >= 0:
            self._nexts[tail] = slot
        else:
            self._head = slot
        self._tail = slot

    def _unlink(self, slot: int) -> None:
        prev, nxt = self._prevs[slot], self._nexts[slot]
        if prev >= 0:
            self._nexts[prev] = nxt
        else:
            self._head = nxt
        if nxt >= 0:
            self._prevs[nxt] = prev
        else:
            self._tail = prev


def key_map(*, int_values: bool = False) -> dict[Any, Any]:
    """A map for millions of chunk keys (bytes) that come and go: the C build's KeyIndex (kvstore/csrc/key_index.c,
    about 35 bytes a key at any turnover, lookups in C without running Python code), or its twin, a dict (42-120
    bytes a key), where there is no C build. Typed as the dict: KeyIndex has the part of a dict's interface
    kvstore uses (get, pop, [], del, in, len, keys/values/items as lists). `int_values`: the values are 64-bit
    signed integers, which the KeyIndex holds unboxed (no int object per key; a TypeError for another value)."""
    native = native_keys.loaded()
    return {} if native is None else native.KeyIndex(int_values=int_values)  # type: ignore[no-any-return]


def key_map_is_compact() -> bool:
    """Whether `key_map()` gives the compact KeyIndex (the C build is in use), not a dict."""
    return native_keys.loaded() is not None
