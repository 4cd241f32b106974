"""The Redis tier's values: chunk header + payload in one string, checked on the way out; key names.

    value of  PREFIX:chunk:<key hex>  =  | chunk header (64 B, kvstore/chunk_format.py) | payload |
"""

from __future__ import annotations

import numpy as np
import torch

from kvstore.chunk_format import HEADER_BYTES, ChunkHeader, make_header
from kvstore.errors import CorruptChunkError
from kvstore.types import ChunkMeta
from tiers.base import check_out

# Delete a value only while its header is still the one we found corrupt (another node may have rewritten it).
DELETE_IF_HEADER = (f"if redis.call('GETRANGE', KEYS[1], 0, {HEADER_BYTES - 1}) == ARGV[1] "
                    "then return redis.call('DEL', KEYS[1]) end return 0")


def fill_value(value: np.ndarray, key: bytes, body: np.ndarray, meta: ChunkMeta) -> memoryview:
    """Write header + `body` into `value` (HEADER_BYTES + body.size bytes) and return it as bytes."""
    header = make_header(key=key, payload=body.data, codec_id=meta.codec_id, raw_bytes=meta.raw_bytes,
                         layout_fingerprint=meta.layout_fingerprint)
    value[:HEADER_BYTES] = np.frombuffer(header.pack(), dtype=np.uint8)
    value[HEADER_BYTES:] = body
    return value.data


def header_of(key: bytes, head: memoryview, name: str) -> ChunkHeader:
    """The header at the start of `head` (Redis value `name`); CorruptChunkError unless it is `key`'s."""
    header = ChunkHeader.unpack(head[:HEADER_BYTES])
    if header.key != key:
        raise CorruptChunkError(f"Redis value {name} holds chunk {header.key.hex()}")
    return header


def copy_payload(view: memoryview, header: ChunkHeader, out: torch.Tensor) -> None:
    """Copy a checked value's payload into the caller's buffer (host or GPU)."""
    check_out(out, header.stored_bytes)
    src = np.frombuffer(view, dtype=np.uint8, count=header.stored_bytes, offset=HEADER_BYTES)
    if out.device.type == "cpu":
        out[: header.stored_bytes].numpy()[:] = src
    else:
        out[: header.stored_bytes].copy_(torch.from_numpy(src.copy()))


def meta_of(header: ChunkHeader) -> ChunkMeta:
    return ChunkMeta(codec_id=header.codec_id, raw_bytes=header.raw_bytes, stored_bytes=header.stored_bytes,
                     layout_fingerprint=header.layout_fingerprint)


def key_of_name(name: bytes | str) -> bytes | None:
    """The chunk key in a Redis name `PREFIX:chunk:<hex>`; None for anything else."""
    text = name.decode() if isinstance(name, bytes) else name
    try:
        key = bytes.fromhex(text.rsplit(":", 1)[1])
    except (ValueError, IndexError):
        return None
    return key if len(key) == 16 else None
