"""`measured` compression policy: a codec goes on a tier only where the measured speeds say it makes
that tier faster (or, with objective="capacity", larger without making reads slower than a floor).

At start the policy encodes and decodes one sample chunk of the store's layout with each candidate
codec (about a second: `calibrate`), and sets those speeds against the tier's bandwidth (config
figures; else, for a disk tier, its folder probed at start by the store, kvstore/store/levels.py
`probed_bandwidth` over tiers/disk_probe.py; else DEFAULT_TIER_BANDWIDTH measured by `kvstore bench tiers`). A tier has several readers
and writers, so one chunk's decode overlaps another's read and the slower stage sets the pace::

    get_bps(codec) = min(decode_bps, ratio * tier_read_bps)
    put_bps(codec) = min(encode_bps, ratio * tier_write_bps)

objective "throughput": the codec with the highest get_bps among those whose get_bps beats the raw
    tier's read and whose put_bps keeps PUT_FLOOR (0.9) of its write (speed_check.wins; else `none`).
objective "capacity":   the codec with the highest ratio among those whose get_bps is at least
    `min_get_fraction` x the raw tier's read (more chunks fit, at a bounded read cost).
Lossy codecs are candidates only with allow_lossy. `choices` records why each tier got its codec. A
codec fixed in the config that the calibration finds slower than its tier is kept, with a warning
naming the faster choice (`warnings`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from policies.compression.policy import LOSSY, CodecProfile, StaticCompressionPolicy, as_written
from policies.compression.registry import make_codec, register_compression_policy
from policies.compression.speed_check import DEFAULT_TIER_BANDWIDTH, effective_rates, fastest_codec, warn_slow_codecs

__all__ = ["CANDIDATES", "DEFAULT_TIER_BANDWIDTH", "MeasuredCompressionPolicy", "TierChoice", "calibrate",
           "effective_rates"]

logger = logging.getLogger(__name__)

CANDIDATES = ("none", "blosc-lz4", "zstd", "int8", "fp8")


def calibrate(layout: KVLayout, names: tuple[str, ...], *, threads: int = 0, repeats: int = 3,
              sample: torch.Tensor | None = None) -> dict[str, CodecProfile]:
    """Encode/decode speed and ratio of each codec on one chunk (`sample`, else a Gaussian one of the
    layout; at most 8 MiB of it is timed), best of `repeats`."""
    if sample is None:
        gen = torch.Generator().manual_seed(0)
        sample = torch.randn(layout.chunk_shape, generator=gen).to(layout.torch_dtype)
    out = torch.empty_like(sample)
    profiles = {}
    for name in names:
        codec = make_codec(name, threads=threads)
        payload = codec.encode(sample, layout)
        encode_s = _best(lambda c=codec: c.encode(sample, layout), repeats)
        decode_s = _best(lambda c=codec, p=payload: c.decode_into(p, out, layout), repeats)
        profiles[name] = CodecProfile(ratio=layout.chunk_bytes / max(1, payload.numel()),
                                      encode_bytes_per_s=layout.chunk_bytes / encode_s,
                                      decode_bytes_per_s=layout.chunk_bytes / decode_s)
    return profiles


def _best(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return max(min(times), 1e-9)


@dataclass(frozen=True, slots=True)
class TierChoice:
    """The codec a tier got, with the figures that chose it (bytes/s)."""

    codec: str
    get_bytes_per_s: float
    put_bytes_per_s: float
    raw_read_bytes_per_s: float
    raw_write_bytes_per_s: float
    reason: str


@register_compression_policy
class MeasuredCompressionPolicy(StaticCompressionPolicy):
    """Per tier kind, the codec the measured speeds favour (see the module docstring).

    Args:
        tier_codecs: fixed codecs for some tiers (not chosen).
        allow_lossy: let int8/fp8 be candidates.
        layout: the store's layout, for the calibration sample (required unless `profiles` is given).
        tier_bandwidth: {tier kind: (read, write) bytes/s}; defaults DEFAULT_TIER_BANDWIDTH.
        profiles: codec speeds to use instead of calibrating (e.g. from `kvstore bench codecs`).
        objective: "throughput" or "capacity".
        min_get_fraction: the capacity objective's floor on get speed, as a fraction of the raw read.
        codec_threads: threads for the calibration's codecs (0 = every core).
        overflow_tiers: tiers that store raw what their busy encoders cannot take (raw_when_encoder_busy true or
            "auto"): their puts keep the disk's pace whatever the codec, so the get alone decides.
    """

    name = "measured"

    def __init__(self, tier_codecs: Mapping[str, str] | None = None, allow_lossy: bool = False, *,
                 layout: KVLayout | None = None, tier_bandwidth: Mapping[str, tuple[float, float]] | None = None,
                 profiles: Mapping[str, CodecProfile] | None = None,
                 objective: Literal["throughput", "capacity"] = "throughput", min_get_fraction: float = 0.8,
                 codec_threads: int = 0, overflow_tiers: Collection[str] = ()) -> None:
        super().__init__(tier_codecs={}, allow_lossy=allow_lossy)
        if objective not in ("throughput", "capacity"):
            raise ConfigError(f"compression objective {objective!r}: use 'throughput' or 'capacity'")
        if profiles is None and layout is None:
            raise ConfigError("the measured compression policy needs the store's layout (or codec profiles)")
        self.fixed = dict(tier_codecs or {})
        self.bandwidth = {**DEFAULT_TIER_BANDWIDTH, **(tier_bandwidth or {})}
        self.objective, self.min_get_fraction = objective, min_get_fraction
        names = tuple(n for n in CANDIDATES if allow_lossy or n not in LOSSY)
        if profiles is None:
            assert layout is not None
            profiles = calibrate(layout, names, threads=codec_threads)
        self.profiles = {n: p for n, p in profiles.items() if n in names}
        self.choices: dict[str, TierChoice] = {}
        self.overflow = frozenset(overflow_tiers)  # tiers whose busy encoders pass chunks on raw: the get decides
        self.warnings = warn_slow_codecs(as_written(self.fixed), self.profiles, self.bandwidth, overflow_tiers)

    def codec_for(self, tier: str, reuse_probability: float = 0.5) -> str:
        if tier in self.fixed:
            return self.fixed[tier]
        if tier not in self.choices:
            self.choices[tier] = self.choose(tier)
            c = self.choices[tier]
            logger.info("compression on %s: %s (get %.2f GB/s vs raw %.2f, put %.2f vs raw %.2f; %s)", tier, c.codec,
                        c.get_bytes_per_s / 1e9, c.raw_read_bytes_per_s / 1e9, c.put_bytes_per_s / 1e9,
                        c.raw_write_bytes_per_s / 1e9, c.reason)
        return self.choices[tier].codec

    def choose(self, tier: str) -> TierChoice:
        read, write = self.bandwidth.get(tier, DEFAULT_TIER_BANDWIDTH["pfs"])
        rates = {n: effective_rates(p, n, read, write) for n, p in self.profiles.items()}
        rates["none"] = (read, write)
        if self.objective == "throughput":
            overflow = tier in self.overflow
            best = fastest_codec(self.profiles, read, write, overflow=overflow)
            reason = ("no codec beats the raw tier" if best == "none" else
                      "faster than raw on get; puts at the disk's pace (raw when every encoder is busy)" if overflow
                      else "faster than raw on get and put")
        else:
            fits = [n for n, (get, _) in rates.items() if n != "none" and get >= self.min_get_fraction * read]
            best = max(fits, key=lambda n: self.profiles[n].ratio, default="none")
            reason = (f"largest ratio with get >= {self.min_get_fraction:g} x raw" if best != "none"
                      else "every codec reads too slowly")
        get, put = rates[best]
        return TierChoice(best, get, put, read, write, reason)
