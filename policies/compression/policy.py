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
from collections.abc import Collection, Mapping

from kvstore.errors import ConfigError
from policies.compression.base import ChunkState, PressureDecision
from policies.compression.profiles import DEFAULT_PROFILES, CodecProfile
from policies.compression.registry import RETIRED_FOR_WRITING, codec_names, make_codec, register_compression_policy
from policies.compression.speed_check import DEFAULT_TIER_BANDWIDTH, effective_rates, put_keeps_pace, warn_slow_codecs

__all__ = ["DEFAULT_PROFILES", "LOSSY", "CodecProfile", "StaticCompressionPolicy", "UtilityCompressionPolicy",
           "as_written", "warn_fixed_codecs", "writable_profiles"]

logger = logging.getLogger(__name__)

LOSSY = frozenset({"int8", "fp8"})
ENCODE_WEIGHT = 0.1  # encoding runs on background writers, off the request's critical path
# Codec per tier kind for codec = "auto": raw in memory and on NVMe (the lossless codecs encode slower than
# an NVMe writes: DEFAULT_PROFILES vs DEFAULT_TIER_BANDWIDTH), zstd on the slower shared tiers (its ratio,
# 1.50 against blosc-lz4's 1.21, and its encode speed both beat blosc-lz4 there).
DEFAULT_TIER_CODECS = {"gpu": "none", "host": "none", "nvme": "none", "pfs": "zstd", "redis": "zstd"}


def as_written(tier_codecs: Mapping[str, str]) -> dict[str, str]:
    """The codec each tier really writes (a retired codec's successor in its place)."""
    return {tier: RETIRED_FOR_WRITING.get(codec, codec) for tier, codec in tier_codecs.items()}


def writable_profiles(profiles: Mapping[str, CodecProfile], allow_lossy: bool) -> dict[str, CodecProfile]:
    """The profiles of codecs a tier may write: never a retired one, lossy ones only with allow_lossy."""
    return {n: p for n, p in profiles.items() if n not in RETIRED_FOR_WRITING and (allow_lossy or n not in LOSSY)}


def warn_fixed_codecs(tier_codecs: Mapping[str, str], tier_bandwidth: Mapping[str, tuple[float, float]],
                      allow_lossy: bool = False, overflow_tiers: Collection[str] = ()) -> list[str]:
    """The static policy's speed check for a store whose tiers all have a fixed codec (no policy is built)."""
    return warn_slow_codecs(as_written(tier_codecs), writable_profiles(DEFAULT_PROFILES, allow_lossy),
                            {**DEFAULT_TIER_BANDWIDTH, **tier_bandwidth}, overflow_tiers)


@register_compression_policy
class StaticCompressionPolicy:
    """One codec per tier (config or DEFAULT_TIER_CODECS); under pressure always demote (or drop).

    A codec slower than its tier (by DEFAULT_PROFILES against `tier_bandwidth`, else
    DEFAULT_TIER_BANDWIDTH) is kept, since the config asked for it, with a warning naming the faster
    choice (`warnings` holds them).
    """

    name = "static"

    def __init__(self, tier_codecs: Mapping[str, str] | None = None, allow_lossy: bool = False, *,
                 tier_bandwidth: Mapping[str, tuple[float, float]] | None = None,
                 overflow_tiers: Collection[str] = ()) -> None:
        self.tier_codecs = {**DEFAULT_TIER_CODECS, **(tier_codecs or {})}
        self.allow_lossy = allow_lossy
        self.bandwidth = {**DEFAULT_TIER_BANDWIDTH, **(tier_bandwidth or {})}
        self.profiles: dict[str, CodecProfile] = dict(DEFAULT_PROFILES)
        valid = set(codec_names())
        for tier, codec in self.tier_codecs.items():
            if codec not in valid:
                raise ConfigError(f"tier {tier!r}: unknown codec {codec!r}; valid: {', '.join(sorted(valid))}")
            if codec in LOSSY and not allow_lossy:
                raise ConfigError(f"tier {tier!r} asks for lossy codec {codec!r}; set allow_lossy=True to enable it")
        self.warnings = warn_slow_codecs(as_written(self.tier_codecs), writable_profiles(DEFAULT_PROFILES, allow_lossy),
                                         self.bandwidth, overflow_tiers)

    def codec_for(self, tier: str, reuse_probability: float = 0.5) -> str:
        """The codec a chunk gets when it is written to `tier` (a TierKind value such as "nvme")."""
        return self.tier_codecs.get(tier, "none")

    def read_bytes_per_s(self, tier: str) -> float:
        """Static decisions use no bandwidth model: 1 GB/s for every tier."""
        return 1e9

    def put_keeps_pace(self, tier: str, codec: str) -> bool:
        """Whether writing every chunk to `tier` through `codec` keeps PUT_FLOOR of the tier's raw write, by this
        policy's codec speeds (`profiles`) and tier bandwidth: where it does not, a tier with
        raw_when_encoder_busy = "auto" stores raw what its busy encoders cannot take."""
        write = self.bandwidth.get(tier, DEFAULT_TIER_BANDWIDTH["pfs"])[1]
        return put_keeps_pace(self.profiles.get(codec), codec, write)

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
                 tier_read_bytes_per_s: Mapping[str, float] | None = None, *,
                 tier_bandwidth: Mapping[str, tuple[float, float]] | None = None,
                 overflow_tiers: Collection[str] = ()) -> None:
        super().__init__(tier_codecs={}, allow_lossy=allow_lossy)
        self.fixed = dict(tier_codecs or {})
        for tier, codec in self.fixed.items():
            make_codec(codec)
            if codec in LOSSY and not allow_lossy:
                raise ConfigError(f"tier {tier!r} asks for lossy codec {codec!r}; set allow_lossy=True to enable it")
        self.profiles = dict(profiles or DEFAULT_PROFILES)
        self.quality_cost_s = quality_cost_s
        self.bandwidth = {**DEFAULT_TIER_BANDWIDTH, **(tier_bandwidth or {})}
        self.read_bw = {tier: read for tier, (read, _) in self.bandwidth.items()} | dict(tier_read_bytes_per_s or {})
        self.warnings = warn_slow_codecs(as_written(self.fixed), writable_profiles(self.profiles, allow_lossy),
                                         self.bandwidth, overflow_tiers)

    def read_bytes_per_s(self, tier: str) -> float:
        return self.read_bw.get(tier, 1e9)

    def candidates(self, tier: str | None = None) -> list[str]:
        """Codecs a chunk may get: lossless unless allow_lossy, never a retired one, and on `tier` only
        those whose encode keeps up with the tier's writes (else its background writers fall behind)."""
        names = [n for n in self.profiles if (self.allow_lossy or n not in LOSSY) and n not in RETIRED_FOR_WRITING]
        if tier is None:
            return names
        read, write = self.read_bw.get(tier, 1e9), self.bandwidth.get(tier, DEFAULT_TIER_BANDWIDTH["pfs"])[1]
        return [n for n in names if effective_rates(self.profiles[n], n, read, write)[1] >= write]

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

        return min(self.candidates(tier), key=cost)

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
