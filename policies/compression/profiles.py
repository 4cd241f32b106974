"""`CodecProfile` (a codec's ratio and speeds on KV) and `DEFAULT_PROFILES`, the bench figures the
`static` and `utility` policies judge codecs by (`measured` calibrates its own at start)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecProfile:
    """What a codec costs and gives on this machine's KV (see `kvstore bench codecs`)."""

    ratio: float  # raw bytes / stored bytes
    encode_bytes_per_s: float
    decode_bytes_per_s: float
    quality_risk: float = 0.0  # mean relative error; 0 for lossless


# Measured by `kvstore bench codecs` on the 2-core development VM at load 0.4 (docs/bench/codecs.json:
# 16 MiB chunks of the engine model's bf16 KV); quality risk = measured mean |error| / mean |x|.
# Refine per deployment with `UtilityCompressionPolicy.observe`, or use compression = "measured".
DEFAULT_PROFILES = {
    "none": CodecProfile(ratio=1.0, encode_bytes_per_s=4e10, decode_bytes_per_s=4e10),
    "lz4": CodecProfile(ratio=1.20, encode_bytes_per_s=4.7e8, decode_bytes_per_s=3.6e8),  # read-only now
    "blosc-lz4": CodecProfile(ratio=1.21, encode_bytes_per_s=1.23e9, decode_bytes_per_s=3.9e9),
    # ratio of the 1 MiB blocks (docs/bench/codec_sweep.json); speeds of the earlier blocks (decode ~2x slower)
    "blosc-zstd": CodecProfile(ratio=1.40, encode_bytes_per_s=0.84e9, decode_bytes_per_s=1.46e9),  # read-only now
    # medians of three quiet runs (docs/bench/codecs.json, codecs-run2/3.json: 1.24-1.69 / 3.08-4.00 GB/s)
    "zstd": CodecProfile(ratio=1.50, encode_bytes_per_s=1.39e9, decode_bytes_per_s=3.55e9),
    "int8": CodecProfile(ratio=1.94, encode_bytes_per_s=6.3e8, decode_bytes_per_s=2.0e9, quality_risk=0.0067),
    "fp8": CodecProfile(ratio=1.94, encode_bytes_per_s=5.5e8, decode_bytes_per_s=1.16e9, quality_risk=0.022),
}
