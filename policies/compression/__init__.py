"""Compression: codecs (none, lz4 (read-only), int8, fp8, blosc-lz4, blosc-zstd (read-only), nvcomp-lz4, zstd) and the policy that picks one per tier and chunk."""

from policies.compression.base import Codec, CompressionPolicy
from policies.compression.registry import (
    codec_by_id,
    codec_names,
    make_codec,
    make_compression_policy,
    writer_codec_name,
)

__all__ = ["Codec", "CompressionPolicy", "codec_by_id", "codec_names", "make_codec", "make_compression_policy",
           "writer_codec_name"]
