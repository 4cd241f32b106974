"""`SlotAllocator`: first-fit allocation of variable-size slots in one arena, with coalescing.

    arena: | slot A | free | slot B | slot C | free ............ |
              ^offset         ^offset

Sizes are rounded up to `align` bytes. Frees merge with free neighbours, so a run of evictions
of adjacent slots yields one large hole. The allocator keeps no record per slot: the owner says
what it frees (offset and size, as the tier's slot knows them), and a free that overlaps a hole
(a double free, a size larger than allocated) is refused. Not thread-safe: the owning tier holds its lock.
"""

from __future__ import annotations

import bisect


class SlotAllocator:
    """Offsets into an arena of `capacity_bytes`; `allocate` returns None when no hole fits."""

    def __init__(self, capacity_bytes: int, *, align: int = 256) -> None:
        self.capacity_bytes = capacity_bytes - capacity_bytes % align
        self.align = align
        self._free_starts: list[int] = [0] if self.capacity_bytes else []  # sorted hole offsets
        self._free_size: dict[int, int] = {0: self.capacity_bytes} if self.capacity_bytes else {}
        self._sizes: dict[int, int] = {}  # the rounded sizes seen, each as one shared object
        self.used_bytes = 0

    def rounded(self, nbytes: int) -> int:
        size = max(self.align, (nbytes + self.align - 1) // self.align * self.align)
        # one int object per distinct size (at most capacity / align of them), not one per slot held
        return self._sizes.setdefault(size, size)

    def allocate(self, nbytes: int) -> int | None:
        size = self.rounded(nbytes)
        for start in self._free_starts:
            hole = self._free_size[start]
            if hole >= size:
                self._take(start, hole, size)
                return start
        return None

    def _take(self, start: int, hole: int, size: int) -> None:
        index = bisect.bisect_left(self._free_starts, start)
        del self._free_starts[index]
        del self._free_size[start]
        if hole > size:
            rest = start + size
            self._free_starts.insert(index, rest)
            self._free_size[rest] = hole - size
        self.used_bytes += size

    def free(self, offset: int, nbytes: int) -> None:
        """Free the slot `allocate(nbytes)` gave at `offset`.

        Raises:
            ValueError: the span is not wholly allocated (a double free, or larger than allocated there);
                nothing changes.
        """
        size = self.rounded(nbytes)
        index = bisect.bisect_left(self._free_starts, offset)
        after = self._free_starts[index] if index < len(self._free_starts) else self.capacity_bytes
        before = self._free_starts[index - 1] + self._free_size[self._free_starts[index - 1]] if index else 0
        if offset % self.align or offset < before or offset + size > after:
            raise ValueError(f"free({offset}, {nbytes}): bytes {offset}..{offset + size} are not one allocated slot "
                             f"(free space from {after}, the hole before ends at {before})")
        self.used_bytes -= size
        # merge with the next hole
        if index < len(self._free_starts) and self._free_starts[index] == offset + size:
            size += self._free_size.pop(self._free_starts[index])
            del self._free_starts[index]
        # merge with the previous hole
        if index > 0:
            prev = self._free_starts[index - 1]
            if prev + self._free_size[prev] == offset:
                self._free_size[prev] += size
                return
        self._free_starts.insert(index, offset)
        self._free_size[offset] = size

    def largest_hole(self) -> int:
        return max(self._free_size.values(), default=0)

    def can_allocate(self, nbytes: int) -> bool:
        return self.largest_hole() >= self.rounded(nbytes)
