"""`StampedQueue` (keys in arrival order, lazy deletion) and `SlotTable` (key hashes in flat arrays, on linked lists).

`StampedQueue` is the LRU expert's list and S3-FIFO's ghost; `SlotTable` holds the hazard expert's
classes and ghost in about 40 bytes a key (see its docstring), and as a `KeySet` `adaptive`'s resident keys.

::

    keys    [ k1  k2  k7  k2  k9 ...]      an entry is live while index[key] == its stamp,
    stamps  [ s1  s2  s7  s2' s9 ...]      so moving k2 to the back is one dict store (index[k2] = s2')
              ^ start: entries before it are gone                   and one append per list

An OrderedDict does the same with a node per key, and under mypyc each `popitem`, `pop` and
`next(iter(...))` is a generic method call that builds a tuple or an iterator. Here the owner keeps
`index` (key -> stamp, stamps unique) and the queue holds two plain lists and an integer, so every
step is a native list operation; a dead entry costs one dict lookup when the front passes it. The
lists are compacted (the consumed front cut off, then dead entries dropped when they still
outnumber the live ones) whenever they outgrow their limit (twice their length after the last
compaction, plus SLACK), so they hold at most 4 entries per live key (as of that compaction) plus
3 x SLACK, and each dead entry costs at most two lookups over its life.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Final

from librt.vecs import vec
from mypy_extensions import i32, i64

SLACK: Final = 1024  # entries a queue may hold beyond twice its size before it is compacted


class StampedQueue:
    """The live entries of `index` in push order (see the module docstring); `live` counts them,
    kept by the owner: +1 per `push`, -1 whenever it removes a key of this queue from `index`."""

    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.stamps: list[int] = []
        self.start = 0
        self.live = 0
        self.limit = SLACK  # compact when the lists grow past this

    def push(self, key: Hashable, stamp: int, index: dict[Hashable, int]) -> None:
        """Append `key` (the owner has set index[key] = stamp)."""
        self.keys.append(key)
        self.stamps.append(stamp)
        self.live += 1
        if len(self.keys) > self.limit:
            self.compact(index)

    def first(self, index: dict[Hashable, int]) -> int:
        """The stamp of the oldest live entry (dead ones in front of it are passed); -1: none."""
        keys, stamps = self.keys, self.stamps
        i = self.start
        n = len(keys)
        while i < n:
            if index.get(keys[i], -1) == stamps[i]:
                self.start = i
                return stamps[i]
            i += 1
        self.start = n
        return -1

    def pop_first(self, index: dict[Hashable, int]) -> Hashable:
        """Remove the oldest live key from the queue and from `index`; the queue must hold one."""
        keys, stamps = self.keys, self.stamps
        i = self.start
        while index.get(keys[i], -1) != stamps[i]:
            i += 1
        key = keys[i]
        self.start = i + 1
        self.live -= 1
        del index[key]
        return key

    def compact(self, index: dict[Hashable, int]) -> None:
        """Cut off the consumed front; drop the dead entries too when they outnumber the live ones."""
        keys, stamps = self.keys, self.stamps
        if self.start:
            del keys[: self.start]
            del stamps[: self.start]
            self.start = 0
        if len(keys) > 2 * self.live + SLACK:  # mostly dead entries behind the front: drop them
            live = [i for i in range(len(keys)) if index.get(keys[i], -1) == stamps[i]]
            self.keys = [keys[i] for i in live]
            self.stamps = [stamps[i] for i in live]
        self.limit = 2 * len(self.keys) + SLACK

    def live_keys(self, index: dict[Hashable, int]) -> list[Hashable]:
        """The live keys, oldest first."""
        keys, stamps = self.keys, self.stamps
        return [keys[i] for i in range(self.start, len(keys)) if index.get(keys[i], -1) == stamps[i]]


_MIX: Final = 0xC2B2AE3D27D4EB4F - (1 << 64)  # odd, as a signed 64-bit int; not `sample_bits`' multiplier, so the
# buckets of a hash-sampled shadow's keys spread over the whole table
MAX_LOAD_NUM: Final = 3  # the index grows when it is over 3/4 full
MAX_LOAD_DEN: Final = 4
NO_SLOT: Final = -1
GROW_MIN: Final = 64  # free slots a SlotTable adds at least, when it has none left


def _home(h: int, shift: int, mask: int) -> int:
    """The bucket a hash starts probing at: the top bits of h x _MIX mod 2**64 (one wrapping multiply compiled)."""
    x: i64 = h
    return (x * _MIX) >> shift & mask


def _grown64(v: vec[i64], n: int) -> vec[i64]:
    """A copy of `v` grown to exactly `n` items (zeros after)."""
    out = vec[i64]([0] * n)
    for i in range(len(v)):
        out[i] = v[i]
    return out


def _grown32(v: vec[i32], n: int) -> vec[i32]:
    out = vec[i32]([0] * n)
    for i in range(len(v)):
        out[i] = v[i]
    return out


class SlotTable:
    """Key hashes -> slots in flat arrays, each slot on one of `num_lists` doubly linked lists.

    ::

        index   [ 0  3  0  1  0 ...]     open addressing (linear probing) on the hash, slot + 1 (0: empty)
        hashes  [h0 h1 h2 ...]           per slot: the key's hash, a stamp, the key object (None once
        stamps  [s0 s1 s2 ...]           only the hash is kept, as in a ghost), and its neighbours on
        keys    [k0 None k2 ...]         its list; freed slots are chained on `nexts` from `free`
        nexts / prevs (int32)

    The arrays are librt's `vec` (packed i64 / i32, indexed natively in the mypyc build: the stdlib's
    `array` boxes every element it hands compiled code, which made a decision half as fast), grown by
    an eighth at a time (`_grow_slots`; a vec's own `append` doubles its room). About 33 bytes a slot
    (up to an eighth more while the free slots last) and 4-5 bytes of index, where a dict entry with
    an int value costs about 74
    (and a key the caches no longer hold, about 48 more). A hash stands for its key: two keys with one
    64-bit hash would share a slot (int keys below 2**61 never do). The owner says which list a slot is
    on (it knows that from the slot's stamp), so the table stores no list number.
    """

    def __init__(self, num_lists: int, stamped: bool = True) -> None:
        self.stamped = stamped  # False: no stamps array (a KeySet)
        self.index: vec[i32] = vec[i32]([0] * 8)
        self.mask = 7
        self.shift = 61  # 64 - log2(len(index))
        self.count = 0  # slots in use
        self.hashes: vec[i64] = vec[i64]()
        self.stamps: vec[i64] = vec[i64]()
        self.nexts: vec[i32] = vec[i32]()
        self.prevs: vec[i32] = vec[i32]()
        self.keys: list[Hashable | None] = []
        self.free = NO_SLOT
        self.heads = [NO_SLOT] * num_lists
        self.tails = [NO_SLOT] * num_lists
        self.sizes = [0] * num_lists

    def find(self, h: int) -> int:
        """The slot of hash `h`; NO_SLOT: none."""
        index, hashes, mask = self.index, self.hashes, self.mask
        b = _home(h, self.shift, mask)
        while True:
            s = int(index[b]) - 1
            if s < 0 or hashes[s] == h:
                return s
            b = (b + 1) & mask

    def find_key(self, h: int, key: object) -> int:
        """The slot holding `key` (whose hash is `h`), comparing the keys too; NO_SLOT: none."""
        index, hashes, keys, mask = self.index, self.hashes, self.keys, self.mask
        b = _home(h, self.shift, mask)
        while True:
            s = int(index[b]) - 1
            if s < 0:
                return s
            if hashes[s] == h:
                other = keys[s]
                if other is key or other == key:
                    return s
            b = (b + 1) & mask

    def add(self, h: int, key: Hashable | None, stamp: int, lst: int) -> int:
        """A new slot for hash `h` (not in the table) at the back of list `lst`."""
        slot = self.free
        if slot >= 0:
            self.free = self.nexts[slot]
            self.hashes[slot] = h
            if self.stamped:
                self.stamps[slot] = stamp
            self.keys[slot] = key
        else:
            self._grow_slots()
            slot = self.free
            self.free = self.nexts[slot]
            self.hashes[slot] = h
            if self.stamped:
                self.stamps[slot] = stamp
            self.keys[slot] = key
        self.count += 1
        if self.count * MAX_LOAD_DEN > len(self.index) * MAX_LOAD_NUM:
            self._grow_index()
        else:
            self._put_index(h, slot)
        self.push(lst, slot)
        return slot

    def remove(self, slot: int, lst: int) -> None:
        """Take `slot` off list `lst` and out of the table."""
        self.unlink(lst, slot)
        self._drop_index(slot)
        self.keys[slot] = None
        self.nexts[slot] = self.free
        self.free = slot
        self.count -= 1

    def push(self, lst: int, slot: int) -> None:
        """Append `slot` (on no list) to the back of list `lst`."""
        tail = self.tails[lst]
        self.prevs[slot] = tail
        self.nexts[slot] = NO_SLOT
        if tail >= 0:
            self.nexts[tail] = slot
        else:
            self.heads[lst] = slot
        self.tails[lst] = slot
        self.sizes[lst] += 1

    def unlink(self, lst: int, slot: int) -> None:
        """Take `slot` off list `lst` (it stays in the table)."""
        prev, nxt = int(self.prevs[slot]), int(self.nexts[slot])
        if prev >= 0:
            self.nexts[prev] = nxt
        else:
            self.heads[lst] = nxt
        if nxt >= 0:
            self.prevs[nxt] = prev
        else:
            self.tails[lst] = prev
        self.sizes[lst] -= 1

    def slots(self, lst: int) -> list[int]:
        """The slots of list `lst`, front first."""
        out: list[int] = []
        slot = self.heads[lst]
        nexts = self.nexts
        while slot >= 0:
            out.append(slot)
            slot = nexts[slot]
        return out

    def _put_index(self, h: int, slot: int) -> None:
        index, mask = self.index, self.mask
        b = _home(h, self.shift, mask)
        while index[b]:
            b = (b + 1) & mask
        index[b] = slot + 1

    def _drop_index(self, slot: int) -> None:
        """Clear `slot`'s bucket and shift later entries of its probe run back (no tombstones)."""
        index, hashes, mask, shift = self.index, self.hashes, self.mask, self.shift
        i = _home(hashes[slot], shift, mask)
        while index[i] != slot + 1:
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            entry = index[j]
            if not entry:
                break
            k = _home(hashes[int(entry) - 1], shift, mask)
            # the entry at j may move to i unless its home lies cyclically in (i, j]
            if (i <= j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                index[i] = entry
                i = j
        index[i] = 0

    def _grow_index(self) -> None:
        size = len(self.index) * 2
        self.index = vec[i32]([0] * size)
        self.mask = size - 1
        self.shift -= 1
        hashes, keys_free = self.hashes, self._free_slots()
        for slot in range(len(hashes)):
            if slot not in keys_free:
                self._put_index(hashes[slot], slot)

    def _grow_slots(self) -> None:
        """Add free slots, an eighth more (at least GROW_MIN): built to size, where `append` doubles a vec's
        room (up to 2x the bytes the slots need; an eighth keeps it to 1.125x)."""
        old: int = len(self.hashes)  # a plain int: the new slots' numbers go into the i32 `nexts`
        new = old + max(GROW_MIN, old >> 3)
        self.hashes = _grown64(self.hashes, new)
        if self.stamped:
            self.stamps = _grown64(self.stamps, new)
        self.prevs = _grown32(self.prevs, new)
        nexts = _grown32(self.nexts, new)
        for slot in range(old, new - 1):  # the new slots, chained in order
            nexts[slot] = slot + 1
        nexts[new - 1] = self.free
        self.nexts = nexts
        self.free = old
        self.keys.extend([None] * (new - old))

    def _free_slots(self) -> set[int]:
        out: set[int] = set()
        slot = self.free
        while slot >= 0:
            out.add(slot)
            slot = self.nexts[slot]
        return out


class KeySet:
    """A set of keys that iterates in insertion order, as a dict's keys do: one unstamped SlotTable list,
    about 25-35 bytes a key where a dict that keys come and go through holds 40-85 (it keeps room for
    three times its keys after a rebuild)."""

    def __init__(self) -> None:
        self.table = SlotTable(1, stamped=False)

    def __contains__(self, key: object) -> bool:
        return self.table.find_key(hash(key), key) >= 0

    def __len__(self) -> int:
        return self.table.count

    def __iter__(self) -> Iterator[Hashable]:
        table = self.table
        slot = table.heads[0]
        while slot >= 0:
            key = table.keys[slot]
            slot = table.nexts[slot]
            if key is not None:
                yield key

    def add(self, key: Hashable) -> None:
        """Add `key` at the end (no change when it is in already)."""
        h = hash(key)
        if self.table.find_key(h, key) < 0:
            self.table.add(h, key, 0, 0)

    def discard(self, key: Hashable) -> None:
        slot = self.table.find_key(hash(key), key)
        if slot >= 0:
            self.table.remove(slot, 0)
