"""Decoding a payload while it is still being read: `StreamDecoder`, fed as the payload's front lands.

    reader thread:  read seg 0 | read seg 1 | read seg 2 | ... | finish: decode what is left, wait
    decode threads:              decode pieces in seg 0 | pieces in seg 1 | ...

A codec whose payload is cut into independently coded pieces, with their sizes up front (`zstd`),
decodes each piece as soon as its bytes are in, on the shared background pool (blocks.submit), straight
into the caller's buffer; so a disk tier's get costs about the slower of its read and its decode
instead of their sum. Every other codec decodes the whole payload at `finish` (`WholeDecoder`).
Which one a payload gets: `stream_decoder` (policies/compression/stream_decoders.py).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Protocol

from policies.compression.blocks import submit

if TYPE_CHECKING:
    import torch

    from kvstore.layout import KVLayout
    from policies.compression.base import Codec


class StreamDecoder(Protocol):
    """Decodes a payload buffer into a chunk as the buffer fills, front to back."""

    def feed(self, ready_bytes: int) -> None:
        """The payload's first `ready_bytes` bytes are in; returns at once (decoding goes on behind)."""
        ...

    def finish(self, nbytes: int) -> None:
        """The whole payload (`nbytes`) is in: decode the rest and return when `out` holds the chunk.

        Raises:
            CorruptChunkError: the payload does not decode to a chunk of the layout.
        """
        ...

    def cancel(self) -> None:
        """The read failed: wait until no decode still touches the buffers, then return."""
        ...


class WholeDecoder:
    """Any codec: decodes the whole payload at `finish`."""

    def __init__(self, codec: Codec, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        self.codec, self.payload, self.out, self.layout = codec, payload, out, layout

    def feed(self, ready_bytes: int) -> None:
        pass

    def finish(self, nbytes: int) -> None:
        self.codec.decode_into(self.payload[:nbytes], self.out, self.layout)

    def cancel(self) -> None:
        pass


class PieceDecoder(ABC):
    """A payload of independently decodable pieces: each is decoded on the background pool once its bytes
    are in; the reader thread decodes alongside at `finish`. Subclasses say where pieces lie and decode one."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._lock = threading.Lock()
        self._available = 0  # pieces whose bytes are all in
        self._next = 0  # next piece to claim
        self._futures: list[Future[None]] = []

    @abstractmethod
    def pieces_within(self, ready_bytes: int) -> int:
        """How many leading pieces lie wholly in the payload's first `ready_bytes` (parses the table as it
        arrives; CorruptChunkError when it is bad)."""

    @abstractmethod
    def decode_piece(self, index: int) -> None:
        """Decode piece `index` into the output (thread-safe: pieces never overlap)."""

    @abstractmethod
    def check_complete(self, nbytes: int) -> None:
        """CorruptChunkError unless the `nbytes` payload is exactly the pieces the table names."""

    def feed(self, ready_bytes: int) -> None:
        available = self.pieces_within(ready_bytes)
        with self._lock:
            self._available = max(self._available, available)
            unclaimed = self._available - self._next
        busy = sum(not f.done() for f in self._futures)
        for _ in range(min(unclaimed, self.threads - busy)):
            self._futures.append(submit(self.threads, self._work))

    def _claim(self) -> int | None:
        with self._lock:
            if self._next >= self._available:
                return None
            self._next += 1
            return self._next - 1

    def _work(self) -> None:
        while (index := self._claim()) is not None:
            self.decode_piece(index)

    def finish(self, nbytes: int) -> None:
        try:
            self.feed(nbytes)
            self.check_complete(nbytes)
            self._work()
        finally:
            self.cancel()
        for future in self._futures:
            future.result()  # the first piece that failed to decode

    def cancel(self) -> None:
        with self._lock:
            self._available = self._next  # nothing more is claimed
        wait(self._futures)
