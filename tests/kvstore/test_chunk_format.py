"""The chunk header: round trip, alignment, and every corruption detected."""

import pytest

from kvstore.chunk_format import HEADER_BYTES, PAYLOAD_OFFSET, ChunkHeader, make_header, verify_payload
from kvstore.errors import CorruptChunkError

KEY = bytes(range(16))


def test_round_trip_and_sizes() -> None:
    payload = b"x" * 5000
    header = make_header(key=KEY, payload=payload, codec_id=1, raw_bytes=8192, layout_fingerprint=99)
    packed = header.pack()
    assert len(packed) == HEADER_BYTES == 64
    assert ChunkHeader.unpack(packed) == header
    assert header.file_bytes == PAYLOAD_OFFSET + 8192 and header.file_bytes % 4096 == 0
    verify_payload(header, payload)


def test_every_header_byte_flip_is_detected() -> None:
    packed = bytearray(make_header(key=KEY, payload=b"abc", codec_id=0, raw_bytes=3, layout_fingerprint=1).pack())
    for i in range(len(packed)):
        damaged = bytearray(packed)
        damaged[i] ^= 0x01
        with pytest.raises(CorruptChunkError):
            ChunkHeader.unpack(bytes(damaged))


def test_payload_corruption_and_truncation() -> None:
    header = make_header(key=KEY, payload=b"abcdef", codec_id=0, raw_bytes=6, layout_fingerprint=1)
    with pytest.raises(CorruptChunkError, match="checksum"):
        verify_payload(header, b"abcdeg")
    with pytest.raises(CorruptChunkError, match="bytes"):
        verify_payload(header, b"abc")
    with pytest.raises(CorruptChunkError):
        ChunkHeader.unpack(b"\0" * 10)
