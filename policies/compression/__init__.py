"""Compression: codecs (none, lz4, int8, fp8) and the policy that picks one per tier and chunk."""

from policies.compression.base import Codec, CompressionPolicy
from policies.compression.registry import codec_by_id, codec_names, make_codec, make_compression_policy

__all__ = ["Codec", "CompressionPolicy", "codec_by_id", "codec_names", "make_codec", "make_compression_policy"]
