"""Lossless blosc2 codecs `blosc-lz4` (id 4) and `blosc-zstd` (id 5): bit- or byte-shuffle, then lz4/zstd.

blosc2 splits a chunk into cache-sized blocks, shuffles each (bitshuffle by default: bit planes of
the bf16/fp16 values, whose sign and exponent bits repeat) and compresses the blocks on `threads`
threads, in one C call. Decode writes straight into the caller's CPU buffer (no staging copy).

    payload: [ blosc2 chunk (self-describing: filters, codec, sizes, block offsets) ]

The shuffle, level and block size are encoder choices recorded inside the blosc2 chunk, so one
codec id reads every variant (tests/fixtures/migration_v2 holds chunks of the earlier defaults).
"""

from __future__ import annotations

import logging
from typing import Literal

import blosc2
import numpy
import torch

from kvstore.chunk_format import aligned_empty
from kvstore.errors import ConfigError, CorruptChunkError
from kvstore.layout import KVLayout
from policies.compression.blocks import default_threads
from policies.compression.lossless import chunk_bytes, cpu_bytes_of
from policies.compression.registry import register_codec

logger = logging.getLogger(__name__)

Shuffle = Literal["bit", "byte", "none"]
_FILTERS = {"bit": blosc2.Filter.BITSHUFFLE, "byte": blosc2.Filter.SHUFFLE, "none": blosc2.Filter.NOFILTER}
MAX_CHUNK_BYTES = 2**31 - 1 - blosc2.MAX_OVERHEAD  # one blosc2 chunk per KV chunk
# python-blosc2 holds the GIL through compress2 / decompress2 unless told otherwise (its default is False):
# a store's writer threads then wait on one chunk's encode to write raw chunks or read others, and a Python
# thread beside an encode ran at 0.49x of its speed (0.83x beside zstd, whose libzstd calls release it).
# blosc2 still keeps the GIL for chunks that use a codec or filter registered from Python.
blosc2.set_releasegil(True)


class _BloscCodec:
    """blosc2 compress/decompress of the chunk's bytes with a fixed compressor."""

    name = ""
    codec_id = -1
    lossless = True
    compressor = blosc2.Codec.LZ4
    default_level = 1
    default_block_bytes = 0  # 0: blosc2 picks from the level and type size

    def __init__(self, shuffle: Shuffle = "bit", level: int | None = None, threads: int = 0,
                 block_bytes: int | None = None) -> None:
        if shuffle not in _FILTERS:
            raise ConfigError(f"codec {self.name}: shuffle {shuffle!r} is not one of {', '.join(_FILTERS)}")
        level = self.default_level if level is None else level
        block_bytes = self.default_block_bytes if block_bytes is None else block_bytes
        if not 0 <= level <= 9 or threads < 0 or block_bytes < 0:
            raise ConfigError(f"codec {self.name}: level must be 0..9, threads >= 0 (0 = all cores) and block_bytes "
                              f">= 0 (0 = blosc2's choice), got level={level} threads={threads} block_bytes={block_bytes}")
        self.shuffle, self.level, self.block_bytes = shuffle, level, block_bytes
        self.threads = threads or default_threads()

    def _cparams(self, itemsize: int) -> dict[str, object]:
        return {"codec": self.compressor, "clevel": self.level, "typesize": itemsize, "blocksize": self.block_bytes,
                "filters": [_FILTERS[self.shuffle]], "filters_meta": [0], "nthreads": self.threads}

    def encode(self, chunk: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        raw = chunk_bytes(chunk, layout)
        if raw.numel() > MAX_CHUNK_BYTES:
            raise ConfigError(f"a {raw.numel()}-byte chunk is over blosc2's {MAX_CHUNK_BYTES}-byte chunk limit; "
                              "use smaller chunk_tokens or another codec")
        packed = blosc2.compress2(raw.numpy(), **self._cparams(layout.itemsize))
        # One copy into a 4 KiB-aligned tensor: an O_DIRECT tier writes it in place (a bytearray
        # copy was unaligned, and the tier copied it again through its staging buffer).
        payload = aligned_empty(len(packed))
        payload.numpy()[:] = numpy.frombuffer(packed, dtype=numpy.uint8)
        return payload

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        src = payload.to("cpu").numpy()
        with cpu_bytes_of(out, layout) as dst:
            try:
                nbytes, _, _ = blosc2.get_cbuffer_sizes(src)
                if nbytes != layout.chunk_bytes:
                    raise CorruptChunkError(f"{self.name} payload decodes to {nbytes} bytes, layout chunk is "
                                            f"{layout.chunk_bytes}")
                blosc2.decompress2(src, dst=dst, nthreads=self.threads)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise CorruptChunkError(f"{self.name} payload does not decompress: {exc}") from exc

    def max_encoded_bytes(self, raw_bytes: int) -> int:
        return raw_bytes + blosc2.MAX_OVERHEAD  # blosc2 stores a block raw when it would not shrink


@register_codec
class BloscLZ4Codec(_BloscCodec):
    """blosc2 with LZ4 (level 1 by default): the fast one, for tiers that read at GB/s."""

    name = "blosc-lz4"
    codec_id = 4
    compressor = blosc2.Codec.LZ4
    default_level = 1


@register_codec
class BloscZstdCodec(_BloscCodec):
    """blosc2 with Zstandard (level 1, 1 MiB blocks by default): a better ratio for slow tiers (PFS, remote).

    Picked by `kvstore bench codec_sweep` on the engine model's KV (docs/compression.md): 1 MiB
    blocks against blosc2's own choice gave ratio 1.40 vs 1.31 and decode 0.84 vs 0.43 GB/s at
    equal encode speed (0.29 vs 0.29 GB/s; 2 threads, load 6); level 3 and byte shuffle encode 2-9x
    slower. Chunks written with other settings still decode: blosc2 records them in each chunk.
    """

    name = "blosc-zstd"
    codec_id = 5
    compressor = blosc2.Codec.ZSTD
    default_level = 1
    default_block_bytes = 1 << 20
