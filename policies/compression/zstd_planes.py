"""Lossless `zstd` (id 7): Zstandard on the values' top byte plane (sign, exponent), the mantissa bytes as they are.

Why not blosc2's zstd (`blosc-zstd`, id 5, now read-only): blosc2 runs Zstandard level 1 over every
byte, and on bf16 KV half of them are mantissa that no codec shrinks; its level 1 also searches
matches that barely pay on exponents, whose gain is entropy coding. On the engine model's KV, one
core, CPU time: blosc-zstd encoded 0.66 GB/s for a ratio of 1.40; Zstandard's fast strategy with
7-byte matches and a 128-entry hash (MIN_MATCH, HASH_LOG) on the top plane only, about 1.25 GB/s
(this codec whole: 0.85-0.99) for a ratio of 1.50. On two threads (`kvstore bench codecs`, quiet)
it encodes at 1.31-1.42x and decodes at 2.58-2.91x the raw O_DIRECT write / read.

    payload: header (version, itemsize, pieces, piece_bytes, raw_bytes)
             table: per piece (top length, rest length, flags: bit 0 top is a zstd frame, bit 1 rest is)
             per piece: top plane (zstd frame or raw), rest planes (raw, or a zstd frame when they shrink)

A chunk is cut into pieces of PIECE_BYTES, coded independently on `threads` threads (numpy,
numba and zstandard release the GIL) and decoded straight into the caller's buffer. A plane that does not
shrink (the mantissa bytes, found by coding their first PROBE_BYTES) is stored raw, so the payload
never exceeds the raw chunk plus the header.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch
import zstandard

from kvstore.chunk_format import aligned_empty
from kvstore.errors import ConfigError, CorruptChunkError
from kvstore.layout import KVLayout
from policies.compression import planes, zstd_native
from policies.compression.blocks import default_threads, for_each
from policies.compression.lossless import chunk_bytes, cpu_bytes_of
from policies.compression.registry import register_codec
from policies.compression.streaming import PieceDecoder
from policies.compression.zstd_native import PlaneCompressor

VERSION = 1
PIECE_BYTES = 1 << 20  # raw bytes per independently coded piece
PROBE_BYTES = 1 << 16  # the rest planes are coded only when their first PROBE_BYTES shrink ...
PROBE_GAIN = 0.9  # ... to under this fraction
TOP_ZSTD, REST_ZSTD = 1, 2
_HEADER = np.dtype([("version", "<u2"), ("itemsize", "<u2"), ("pieces", "<u4"), ("piece_bytes", "<u4"),
                    ("raw_bytes", "<u8")])
_ENTRY = np.dtype([("top", "<u4"), ("rest", "<u4"), ("flags", "<u4")])
WINDOW_LOG, HASH_LOG, MIN_MATCH = 17, 7, 7  # picked by `kvstore bench codec_sweep` (docs/compression.md)
_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    if "dctx" not in _local.__dict__:
        _local.dctx = zstandard.ZstdDecompressor()
    return _local.dctx  # type: ignore[no-any-return]


def _top_frame(coder: PlaneCompressor, src: np.ndarray, itemsize: int, slot: np.ndarray) -> np.ndarray | None:
    """The piece's top plane as a zstd frame in `slot` (one byte smaller than the plane), or None when it does
    not fit there (then the plane is stored raw)."""
    top = _scratch(src.nbytes // itemsize)
    planes.top_only(src, itemsize, top)
    size = coder.compress_into(top, slot)
    return slot[:size] if size else None


def _rest_frame(coder: PlaneCompressor, src: np.ndarray, itemsize: int) -> np.ndarray | None:
    """The piece's rest planes as a zstd frame when their first PROBE_BYTES shrink (and the whole does),
    else None: mantissas are stored raw, taken from the chunk straight into the payload."""
    rest_bytes = src.nbytes - src.nbytes // itemsize
    if rest_bytes == 0:
        return None
    values = min(src.nbytes, PROBE_BYTES * itemsize // (itemsize - 1)) // itemsize  # values whose rest is probed
    rest, probe = _scratch(rest_bytes), values * (itemsize - 1)
    planes.rest_only(src[: values * itemsize], itemsize, rest[:probe])
    if not coder.compress_into(rest[:probe], _scratch(int(PROBE_GAIN * probe), "probe")):
        return None
    planes.rest_only(src, itemsize, rest)
    frame = np.empty(rest_bytes - 1, dtype=np.uint8)  # rare: rest planes that shrink keep a fresh array
    size = coder.compress_into(rest, frame)
    return frame[:size] if size else None


def _scratch(nbytes: int, name: str = "plane") -> np.ndarray:
    """This thread's buffer `name` of `nbytes` (reused: a fresh one faults in its pages on every piece)."""
    buffers: dict[str, np.ndarray] = _local.__dict__.setdefault("scratch", {})
    buffer = buffers.get(name)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[name] = np.empty(nbytes, dtype=np.uint8)
    return buffer[:nbytes]


def _header_bytes(pieces: int) -> int:
    return _HEADER.itemsize + pieces * _ENTRY.itemsize


@register_codec
class ZstdPlanesCodec:
    """Zstandard (fast strategy) on the top byte plane, the other planes raw unless they shrink (see module)."""

    name = "zstd"
    codec_id = 7
    lossless = True

    def __init__(self, threads: int = 0, window_log: int = WINDOW_LOG, hash_log: int = HASH_LOG,
                 min_match: int = MIN_MATCH) -> None:
        if threads < 0:
            raise ConfigError(f"codec zstd: threads must be >= 0 (0 = all cores), got {threads}")
        if not (10 <= window_log <= 27 and 6 <= hash_log <= 26 and 3 <= min_match <= 7):
            raise ConfigError(f"codec zstd: window_log must be 10..27, hash_log 6..26 and min_match 3..7 "
                              f"(defaults {WINDOW_LOG}, {HASH_LOG}, {MIN_MATCH}), got {window_log}, {hash_log}, "
                              f"{min_match}")
        self.threads = threads or default_threads()
        self.settings = (window_log, hash_log, min_match)
        planes.warm()

    def encode(self, chunk: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        return self._encode(chunk, layout, aligned_empty)

    def encode_into(self, chunk: torch.Tensor, layout: KVLayout, buffer: torch.Tensor) -> torch.Tensor:
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.max_encoded_bytes(layout.chunk_bytes):
            raise ConfigError(f"codec zstd: encode_into needs a 1-D uint8 buffer of at least "
                              f"{self.max_encoded_bytes(layout.chunk_bytes)} bytes, got {tuple(buffer.shape)} {buffer.dtype}")
        return self._encode(chunk, layout, lambda nbytes: buffer[:nbytes])

    def _encode(self, chunk: torch.Tensor, layout: KVLayout, allocate: Callable[[int], torch.Tensor]) -> torch.Tensor:
        raw = chunk_bytes(chunk, layout).numpy()
        k = layout.itemsize
        piece_bytes = max(k, PIECE_BYTES - PIECE_BYTES % k)
        pieces = -(-raw.nbytes // piece_bytes)
        slot_bytes = piece_bytes // k - 1  # a top frame must be smaller than its plane
        slots = _scratch(pieces * slot_bytes, "frames")  # the calling thread's, shared by the pieces' threads
        frames: list[tuple[np.ndarray | None, np.ndarray | None]] = [(None, None)] * pieces  # None: stored raw

        def code(index: int) -> None:
            src, coder = raw[index * piece_bytes : (index + 1) * piece_bytes], zstd_native.compressor(self.settings)
            slot = slots[index * slot_bytes : index * slot_bytes + src.nbytes // k - 1]
            frames[index] = (_top_frame(coder, src, k, slot), _rest_frame(coder, src, k))

        for_each(pieces, self.threads, code)
        return _assemble(raw, frames, k, piece_bytes, self.threads, allocate)

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        src = payload.to("cpu").numpy()
        table, piece_bytes = _read_table(src, layout)
        _check_body(src.nbytes, table)
        starts = _piece_starts(table)
        with cpu_bytes_of(out, layout) as dst:
            for_each(len(table), self.threads,
                     lambda index: _decode_piece(src, table, starts, index, dst, piece_bytes, layout.itemsize))

    def max_encoded_bytes(self, raw_bytes: int) -> int:
        return raw_bytes + _header_bytes(-(-raw_bytes // PIECE_BYTES) + 1)  # a plane is stored raw if it grows


def _assemble(raw: np.ndarray, frames: list[tuple[np.ndarray | None, np.ndarray | None]], itemsize: int, piece_bytes: int,
              threads: int, allocate: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Header, table and planes in one 4 KiB-aligned tensor from `allocate` (an O_DIRECT tier writes it in
    place); the frames are copied in and raw planes taken from the chunk again, straight into place, on
    `threads` threads."""
    sizes = [min(piece_bytes, raw.nbytes - i * piece_bytes) for i in range(len(frames))]
    table = np.array([(size // itemsize if top is None else len(top),
                       size - size // itemsize if rest is None else len(rest),
                       TOP_ZSTD * (top is not None) | REST_ZSTD * (rest is not None))
                      for size, (top, rest) in zip(sizes, frames, strict=True)], dtype=_ENTRY)
    head = _header_bytes(len(frames))
    starts = head + np.concatenate(([0], np.cumsum(table["top"] + table["rest"], dtype=np.int64)))
    payload = allocate(int(starts[-1]))
    out = payload.numpy()
    out[: _HEADER.itemsize] = np.array([(VERSION, itemsize, len(frames), piece_bytes, raw.nbytes)],
                                       dtype=_HEADER).view(np.uint8)
    out[_HEADER.itemsize : head] = table.view(np.uint8)

    def place(index: int) -> None:
        src = raw[index * piece_bytes : index * piece_bytes + sizes[index]]
        at, top_len, (top, rest) = int(starts[index]), int(table["top"][index]), frames[index]
        top_out, rest_out = out[at : at + top_len], out[at + top_len : at + top_len + int(table["rest"][index])]
        if top is None:  # rare: a top plane that does not shrink
            planes.top_only(src, itemsize, top_out)
        else:
            top_out[:] = top
        if rest is None and rest_out.nbytes:
            planes.rest_only(src, itemsize, rest_out)
        elif rest is not None:
            rest_out[:] = rest

    for_each(len(frames), threads, place)
    return payload


def _read_table(src: np.ndarray, layout: KVLayout) -> tuple[np.ndarray, int]:
    """The piece table and piece size, after checking the header against the layout (CorruptChunkError)."""
    if src.nbytes < _HEADER.itemsize:
        raise CorruptChunkError(f"zstd payload of {src.nbytes} bytes is shorter than its {_HEADER.itemsize}-byte header")
    found = _table_if_in(src, layout)
    if found is None:
        raise CorruptChunkError(f"zstd payload of {src.nbytes} bytes is shorter than its header and table")
    return found


def _table_if_in(src: np.ndarray, layout: KVLayout) -> tuple[np.ndarray, int] | None:
    """`_read_table` of a payload's front, or None while `src` (the bytes in so far) does not hold it all."""
    if src.nbytes < _HEADER.itemsize:
        return None
    header = src[: _HEADER.itemsize].view(_HEADER)[0]
    version, itemsize, pieces, piece_bytes, raw_bytes = (int(v) for v in header)
    if version != VERSION or itemsize != layout.itemsize or raw_bytes != layout.chunk_bytes:
        raise CorruptChunkError(f"zstd payload header (version {version}, itemsize {itemsize}, {raw_bytes} bytes) "
                                f"does not match version {VERSION} and the layout ({layout.itemsize}, "
                                f"{layout.chunk_bytes} bytes)")
    if piece_bytes <= 0 or piece_bytes % itemsize or pieces != -(-raw_bytes // piece_bytes):
        raise CorruptChunkError(f"zstd payload header: {pieces} pieces of {piece_bytes} bytes cannot hold "
                                f"{raw_bytes} bytes of {itemsize}-byte values")
    head = _header_bytes(pieces)
    if src.nbytes < head:
        return None
    return src[_HEADER.itemsize : head].view(_ENTRY).copy(), piece_bytes


def _check_body(nbytes: int, table: np.ndarray) -> None:
    body = int(table["top"].sum(dtype=np.int64) + table["rest"].sum(dtype=np.int64))
    if _header_bytes(len(table)) + body != nbytes:
        raise CorruptChunkError(f"zstd payload is {nbytes} bytes, its table says {_header_bytes(len(table)) + body}")


def _piece_starts(table: np.ndarray) -> np.ndarray:
    """Where each piece starts in the payload, and (last entry) where the payload ends."""
    return _header_bytes(len(table)) + np.concatenate(([0], np.cumsum(table["top"] + table["rest"], dtype=np.int64)))


def _decode_piece(src: np.ndarray, table: np.ndarray, starts: np.ndarray, index: int, dst: np.ndarray,
                  piece_bytes: int, itemsize: int) -> None:
    """Decode piece `index` of the payload `src` into its place in `dst` (the chunk's bytes)."""
    piece = dst[index * piece_bytes : (index + 1) * piece_bytes]
    top_len, rest_len, flags = (int(v) for v in table[index])
    at = int(starts[index])
    if at + top_len + rest_len > src.nbytes:
        raise CorruptChunkError(f"zstd payload: piece {index} ends past the payload's {src.nbytes} bytes")
    top = _plane(src[at : at + top_len], bool(flags & TOP_ZSTD), piece.nbytes // itemsize)
    rest = _plane(src[at + top_len : at + top_len + rest_len], bool(flags & REST_ZSTD),
                  piece.nbytes - piece.nbytes // itemsize)
    planes.merge(top, rest, itemsize, piece)


class ZstdStreamDecoder(PieceDecoder):
    """Decodes each piece once its bytes are read (policies/compression/streaming.py), into `out` (CPU, contiguous)."""

    def __init__(self, codec: ZstdPlanesCodec, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        super().__init__(codec.threads)
        self.src = payload.numpy()
        self.dst = out.reshape(-1).view(torch.uint8).numpy()
        self.layout = layout
        self.table: np.ndarray | None = None
        self.starts = np.zeros(1, dtype=np.int64)
        self.piece_bytes = 0

    def pieces_within(self, ready_bytes: int) -> int:
        if self.table is None:
            found = _table_if_in(self.src[:ready_bytes], self.layout)
            if found is None:
                return 0
            self.table, self.piece_bytes = found
            self.starts = _piece_starts(self.table)
        return int(np.searchsorted(self.starts[1:], ready_bytes, side="right"))

    def decode_piece(self, index: int) -> None:
        assert self.table is not None
        end = int(self.starts[-1])
        _decode_piece(self.src[:end], self.table, self.starts, index, self.dst, self.piece_bytes, self.layout.itemsize)

    def check_complete(self, nbytes: int) -> None:
        if self.table is None:
            raise CorruptChunkError(f"zstd payload of {nbytes} bytes is shorter than its header and table")
        _check_body(nbytes, self.table)


def _plane(data: np.ndarray, is_frame: bool, size: int) -> np.ndarray:
    """A stored plane as `size` bytes: the raw bytes, or its zstd frame decompressed."""
    if not is_frame:
        if data.nbytes != size:
            raise CorruptChunkError(f"zstd payload: a raw plane holds {data.nbytes} bytes, its piece needs {size}")
        return data
    try:
        plane = _decompressor().decompress(data.data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise CorruptChunkError(f"zstd payload: a plane does not decompress: {exc}") from exc
    if len(plane) != size:
        raise CorruptChunkError(f"zstd payload: a plane decompressed to {len(plane)} bytes, its piece needs {size}")
    return np.frombuffer(plane, dtype=np.uint8)
