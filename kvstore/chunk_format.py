"""The on-disk / on-wire chunk format shared by every tier that stores bytes.

    offset 0                                          HEADER_BYTES (64)        PAYLOAD_OFFSET (4096)
    | magic | ver | codec | layout fp | key | raw | stored | payload xxh3 | header xxh3 | zero pad | payload ... | pad to 4 KiB |

The header block is padded to 4 KiB so the payload starts aligned for O_DIRECT, and the file is a
whole number of 4 KiB blocks. A reader checks the header checksum, then the payload checksum; any
mismatch raises CorruptChunkError, which the store treats as a miss.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import xxhash

from kvstore.errors import CorruptChunkError
from kvstore.hashing import KEY_BYTES

if TYPE_CHECKING:
    import torch

MAGIC = b"KVC\x01"
FORMAT_VERSION = 1
ALIGN = 4096
PAYLOAD_OFFSET = ALIGN
_BODY = struct.Struct("<4sHHQ16sQQQ")  # everything the header checksum covers
_HEADER = struct.Struct("<4sHHQ16sQQQQ")
HEADER_BYTES = _HEADER.size  # 64


def aligned_empty(nbytes: int, align: int = ALIGN, *, pin_memory: bool = False) -> torch.Tensor:
    """A 1-D uint8 CPU tensor of `nbytes` whose first byte is `align`-aligned, so O_DIRECT reads and
    writes it in place (an unaligned one moves through a staging buffer, one more copy per chunk)."""
    import torch

    raw = torch.empty(nbytes + align, dtype=torch.uint8, pin_memory=pin_memory)
    start = (-raw.data_ptr()) % align
    return raw[start : start + nbytes]


def round_up(nbytes: int, align: int = ALIGN) -> int:
    return (nbytes + align - 1) // align * align


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkHeader:
    """What a stored chunk says about itself."""

    codec_id: int
    layout_fingerprint: int
    key: bytes
    raw_bytes: int
    stored_bytes: int
    payload_checksum: int

    @property
    def file_bytes(self) -> int:
        return PAYLOAD_OFFSET + round_up(self.stored_bytes)

    def pack(self) -> bytes:
        body = _BODY.pack(MAGIC, FORMAT_VERSION, self.codec_id, self.layout_fingerprint, self.key,
                          self.raw_bytes, self.stored_bytes, self.payload_checksum)
        return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> ChunkHeader:
        if len(data) < HEADER_BYTES:
            raise CorruptChunkError(f"chunk header is {len(data)} bytes, expected {HEADER_BYTES}")
        magic, version, codec_id, fingerprint, key, raw, stored, payload_sum, header_sum = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptChunkError(f"bad chunk magic {magic!r}; not a kvstore chunk file")
        if xxhash.xxh3_64_intdigest(bytes(data[: _BODY.size])) != header_sum:
            raise CorruptChunkError("chunk header checksum mismatch (torn or corrupted header)")
        if version != FORMAT_VERSION:
            raise CorruptChunkError(f"chunk format version {version} is not {FORMAT_VERSION}")
        return cls(codec_id=codec_id, layout_fingerprint=fingerprint, key=key, raw_bytes=raw,
                   stored_bytes=stored, payload_checksum=payload_sum)


def payload_checksum(payload: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(payload)


def make_header(*, key: bytes, payload: bytes | memoryview, codec_id: int, raw_bytes: int,
                layout_fingerprint: int) -> ChunkHeader:
    assert len(key) == KEY_BYTES
    return ChunkHeader(codec_id=codec_id, layout_fingerprint=layout_fingerprint, key=key,
                       raw_bytes=raw_bytes, stored_bytes=len(payload),
                       payload_checksum=payload_checksum(payload))


def verify_payload(header: ChunkHeader, payload: bytes | memoryview) -> None:
    """Raise CorruptChunkError unless `payload` is exactly what `header` describes."""
    if len(payload) != header.stored_bytes:
        raise CorruptChunkError(f"chunk payload is {len(payload)} bytes, header says {header.stored_bytes}")
    if payload_checksum(payload) != header.payload_checksum:
        raise CorruptChunkError(f"chunk {header.key.hex()} payload checksum mismatch")
