"""Compression policies: which codec a chunk gets in a tier, and compress-in-place vs demote vs drop.

Under pressure a tier must free bytes. EVICPRESS's idea: compressing a chunk in place often
costs less than evicting it, because a later hit then pays a decode instead of a disk read or a
recompute. `UtilityCompressionPolicy` scores each action by bytes freed per second of expected
future cost::

    compress with c:  freed = stored - raw / ratio_c
                      cost  = raw / encode_bw_c  +  p_reuse * raw / decode_bw_c  +  risk_c * quality_cost_s
    demote:           freed = stored
                      cost  = (no copy below ? raw / lower_write_bw : 0)  +  p_reuse * raw / lower_read_bw
    drop:             freed = stored
                      cost  = p_reuse * (copy below ? raw / lower_read_bw : recompute_s)

and takes the action with the most bytes freed per second of cost. Lossy codecs are candidates
only with `allow_lossy=True`; their risk is their measured mean relative error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kvstore.errors import ConfigError
from policies.compression.base import ChunkState, PressureDecision
from policies.compression.registry import codec_names, make_codec, register_compression_policy

logger = logging.getLogger(__name__)

LOSSY = frozenset({"int8", "fp8"})
ENCODE_WEIGHT = 0.1  # encoding runs on background writers, off the request's critical path
# Codec per tier kind when none is configured: raw in memory tiers, lz4 on disk and the network.
DEFAULT_TIER_CODECS = {"gpu": "none", "host": "none", "nvme": "lz4", "pfs": "lz4", "redis": "lz4"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecProfile:
    """What a codec costs and gives on this machine's KV (see `kvstore bench codecs`)."""

    ratio: float  # raw bytes / stored bytes
    encode_bytes_per_s: float
    decode_bytes_per_s: float
    quality_risk: float = 0.0  # mean relative error; 0 for lossless


# Measured by `kvstore bench codecs` on the 2-core CPU dev box (bf16 synthetic KV, 16 MiB chunk);
# quality risk = measured mean |error| / mean |x|. Refine per deployment with `observe`.
DEFAULT_PROFILES = {
    "none": CodecProfile(ratio=1.0, encode_bytes_per_s=4e10, decode_bytes_per_s=4e10),
    "lz4": CodecProfile(ratio=1.146, encode_bytes_per_s=3.6e8, decode_bytes_per_s=3.8e8),
    "int8": CodecProfile(ratio=1.94, encode_bytes_per_s=1.0e8, decode_bytes_per_s=3.0e8, quality_risk=0.026),
    "fp8": CodecProfile(ratio=1.94, encode_bytes_per_s=1.6e8, decode_bytes_per_s=2.1e8, quality_risk=0.020),
}


@register_compression_policy
class StaticCompressionPolicy:
    """One codec per tier (config or DEFAULT_TIER_CODECS); under pressure always demote (or drop)."""

    name = "static"

    def __init__(self, tier_codecs: Mapping[str, str] | None = None, allow_lossy: bool = False) -> None:
        self.tier_codecs = {**DEFAULT_TIER_CODECS, **(tier_codecs or {})}
        self.allow_lossy = allow_lossy
        valid = set(codec_names())
        for tier, codec in self.tier_codecs.items():
            if codec not in valid:
                raise ConfigError(f"tier {tier!r}: unknown codec {codec!r}; valid: {', '.join(sorted(valid))}")
            if codec in LOSSY and not allow_lossy:
                raise ConfigError(f"tier {tier!r} asks for lossy codec {codec!r}; set allow_lossy=True to enable it")

    def codec_for(self, tier: str, reuse_probability: float = 0.5) -> str:
        """The codec a chunk gets when it is written to `tier` (a TierKind value such as "nvme")."""
        return self.tier_codecs.get(tier, "none")

    def read_bytes_per_s(self, tier: str) -> float:
        """Static decisions use no bandwidth model: 1 GB/s for every tier."""
        return 1e9

    def on_pressure(self, tier: str, chunk: ChunkState) -> PressureDecision:
        if chunk.lower_read_bytes_per_s is not None:
            return PressureDecision("demote", None, chunk.stored_bytes, 0.0, "static: demote")
        return PressureDecision("drop", None, chunk.stored_bytes, 0.0, "static: no tier below")


@register_compression_policy
class UtilityCompressionPolicy(StaticCompressionPolicy):
    """Per chunk: codec by expected load cost; under pressure, compress vs demote vs drop by utility.

    Args:
        tier_codecs: fixed codec for some tiers (others are chosen per chunk).
        allow_lossy: let int8/fp8 be chosen (off by default: lossy changes the model's output).
        profiles: codec costs (default DEFAULT_PROFILES); `observe` refines ratios online.
        quality_cost_s: seconds of cost per unit of relative error (weighs lossy codecs).
        tier_read_bytes_per_s: read bandwidth per tier kind, for choosing a codec on write.
    """

    name = "utility"

    def __init__(self, tier_codecs: Mapping[str, str] | None = None, allow_lossy: bool = False,
                 profiles: Mapping[str, CodecProfile] | None = None, quality_cost_s: float = 1.0,
                 tier_read_bytes_per_s: Mapping[str, float] | None = None) -> None:
        super().__init__(tier_codecs={}, allow_lossy=allow_lossy)
        self.fixed = dict(tier_codecs or {})
        for tier, codec in self.fixed.items():
            make_codec(codec)
            if codec in LOSSY and not allow_lossy:
                raise ConfigError(f"tier {tier!r} asks for lossy codec {codec!r}; set allow_lossy=True to enable it")
        self.profiles = dict(profiles or DEFAULT_PROFILES)
        self.quality_cost_s = quality_cost_s
        self.read_bw = {"gpu": 5e11, "host": 2e10, "nvme": 3e9, "pfs": 1e9, "redis": 1e9, **(tier_read_bytes_per_s or {})}

    def read_bytes_per_s(self, tier: str) -> float:
        return self.read_bw.get(tier, 1e9)

    def candidates(self) -> list[str]:
        return [n for n in self.profiles if self.allow_lossy or n not in LOSSY]

    def observe(self, codec: str, raw_bytes: int, stored_bytes: int) -> None:
        """Fold a measured compression ratio into the codec's profile (moving average)."""
        old = self.profiles.get(codec)
        if old is None or stored_bytes <= 0:
            return
        ratio = old.ratio + (raw_bytes / stored_bytes - old.ratio) / 32
        self.profiles[codec] = CodecProfile(ratio=ratio, encode_bytes_per_s=old.encode_bytes_per_s,
                                            decode_bytes_per_s=old.decode_bytes_per_s, quality_risk=old.quality_risk)

    def codec_for(self, tier: str, reuse_probability: float = 0.5) -> str:
        """The codec with the lowest expected cost per raw byte: encode once (on a background writer,
        weighted by ENCODE_WEIGHT), then per reuse a read of the smaller payload overlapped with the
        decode (chunks are read in parallel), plus quality risk."""
        if tier in self.fixed:
            return self.fixed[tier]
        read_bw = self.read_bw.get(tier, 1e9)

        def cost(name: str) -> float:
            p = self.profiles[name]
            per_load = max(1 / (p.ratio * read_bw), 0.0 if name == "none" else 1 / p.decode_bytes_per_s)
            encode = 0.0 if name == "none" else ENCODE_WEIGHT / p.encode_bytes_per_s
            return encode + reuse_probability * per_load + p.quality_risk * self.quality_cost_s / 1e9

        return min(self.candidates(), key=cost)

    def on_pressure(self, tier: str, chunk: ChunkState) -> PressureDecision:
        options = [self._drop(chunk)]
        if chunk.lower_read_bytes_per_s is not None:
            options.append(self._demote(chunk))
        if chunk.codec == "none":
            options += [self._compress(chunk, name) for name in self.candidates() if name != "none"]
        options = [o for o in options if o.bytes_freed > 0]
        return max(options, key=lambda o: o.bytes_freed / (o.cost_s + 1e-9))

    def _compress(self, chunk: ChunkState, name: str) -> PressureDecision:
        p = self.profiles[name]
        freed = int(chunk.stored_bytes - chunk.raw_bytes / p.ratio)
        cost = (chunk.raw_bytes / p.encode_bytes_per_s + chunk.reuse_probability * chunk.raw_bytes / p.decode_bytes_per_s
                + p.quality_risk * self.quality_cost_s)
        return PressureDecision("compress", name, freed, cost, f"compress with {name}: ratio {p.ratio:.2f}")

    def _demote(self, chunk: ChunkState) -> PressureDecision:
        assert chunk.lower_read_bytes_per_s is not None
        write = 0.0 if chunk.has_lower_copy else chunk.raw_bytes / (chunk.lower_write_bytes_per_s or chunk.lower_read_bytes_per_s)
        cost = write + chunk.reuse_probability * chunk.raw_bytes / chunk.lower_read_bytes_per_s
        return PressureDecision("demote", None, chunk.stored_bytes, cost, "demote to the tier below")

    def _drop(self, chunk: ChunkState) -> PressureDecision:
        if chunk.has_lower_copy and chunk.lower_read_bytes_per_s:
            cost = chunk.reuse_probability * chunk.raw_bytes / chunk.lower_read_bytes_per_s
        else:
            cost = chunk.reuse_probability * chunk.recompute_s
        return PressureDecision("drop", None, chunk.stored_bytes, cost, "drop (reload from below or recompute)")
