"""Is a codec slower than the tier it serves? The tier-speed model every compression policy shares.

A tier has several readers and writers, so one chunk's decode overlaps another's read and the
slower stage sets the pace (raw KV bytes per second through a tier storing codec c)::

    get_bps(c) = min(decode_bps(c), ratio(c) * tier_read_bps)
    put_bps(c) = min(encode_bps(c), ratio(c) * tier_write_bps)

A codec wins on a tier when its get beats the raw read and its put keeps at least PUT_FLOOR of the raw
write (a cache is read more than it is written: a codec that makes gets faster and puts a little
slower still delivers more KV per second), and is "slower than its tier" otherwise. The `static`
and `utility` policies do not calibrate: they judge with `DEFAULT_PROFILES` (the figures of
`kvstore bench codecs` on the development machine) and say so in a warning that names the faster
choice; `measured` judges with speeds it calibrates at start.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from policies.compression.profiles import CodecProfile

logger = logging.getLogger(__name__)

# (read, write) bytes/s per tier kind when the config gives none: docs/bench/tiers.json raw O_DIRECT
# figures for NVMe, the PFS and Redis rows of the same runs; memory tiers are never worth compressing.
DEFAULT_TIER_BANDWIDTH = {"gpu": (1e12, 1e12), "host": (2e10, 2e10), "nvme": (1.6e9, 2.4e9),
                          "pfs": (1.0e9, 1.0e9), "redis": (0.7e9, 0.7e9)}


PUT_FLOOR = 0.9  # a winning codec's put, as a share of the raw tier's write


def effective_rates(profile: CodecProfile, name: str, read_bps: float, write_bps: float, *,
                    overlapped: bool = True) -> tuple[float, float]:
    """(get, put) bytes/s of raw KV through a tier storing codec `name` (see the module docstring).
    `overlapped=False` charges both stages one after the other: 1 / (1/decode + 1/(ratio*read))."""
    if name == "none":
        return read_bps, write_bps
    if overlapped:
        return (min(profile.decode_bytes_per_s, profile.ratio * read_bps),
                min(profile.encode_bytes_per_s, profile.ratio * write_bps))
    get = 1 / (1 / profile.decode_bytes_per_s + 1 / (profile.ratio * read_bps))
    put = 1 / (1 / profile.encode_bytes_per_s + 1 / (profile.ratio * write_bps))
    return get, put


def wins(get_bps: float, put_bps: float, read_bps: float, write_bps: float) -> bool:
    """Does a codec with these rates win over the raw tier (see the module docstring)?"""
    return get_bps > read_bps and put_bps >= PUT_FLOOR * write_bps


def put_keeps_pace(profile: CodecProfile | None, name: str, write_bps: float) -> bool:
    """Does a tier writing `write_bps` raw keep PUT_FLOOR of that pace when every chunk is encoded with codec
    `name` first? A codec without a profile is taken to keep pace (nothing to judge it by)."""
    if name == "none" or profile is None:
        return True
    return effective_rates(profile, name, write_bps, write_bps)[1] >= PUT_FLOOR * write_bps


def fastest_codec(profiles: Mapping[str, CodecProfile], read_bps: float, write_bps: float, *,
                  overflow: bool = False) -> str:
    """The codec of `profiles` with the highest get among those that win over the raw tier (`wins`);
    `none` when no codec does. `overflow`: the tier stores raw what its busy encoders cannot take, so its
    puts keep the raw write's pace whatever the codec, and the get decides."""
    rates = {n: effective_rates(p, n, read_bps, write_bps) for n, p in profiles.items() if n != "none"}
    faster = [n for n, (get, put) in rates.items()
              if wins(get, max(put, write_bps) if overflow else put, read_bps, write_bps)]
    return max(faster, key=lambda n: rates[n][0], default="none")


def slower_than_tier(tier: str, codec: str, profiles: Mapping[str, CodecProfile],
                     bandwidth: tuple[float, float], *, overflow: bool = False) -> str | None:
    """A message naming the faster choice when `codec` makes `tier` slower than storing raw, else None
    (also None for a codec without a profile: nothing to judge it by). `overflow`: the tier stores raw what
    its busy encoders cannot take (raw_when_encoder_busy), so its puts keep the disk's pace and only the get
    is judged."""
    profile = profiles.get(codec)
    if codec == "none" or profile is None:
        return None
    read, write = bandwidth
    get, put = effective_rates(profile, codec, read, write)
    if get >= read and (overflow or put >= PUT_FLOOR * write):
        return None
    best = fastest_codec(profiles, read, write, overflow=overflow)
    best_get, best_put = effective_rates(profiles[best], best, read, write) if best != "none" else (read, write)
    return (f"tier {tier}: codec {codec!r} makes it slower than storing raw (get {get / 1e9:.2f} GB/s vs the "
            f"tier's read {read / 1e9:.2f}, put {put / 1e9:.2f} vs its write {write / 1e9:.2f}; speeds from "
            f"`kvstore bench codecs`); {best!r} is faster there (get {best_get / 1e9:.2f}, put {best_put / 1e9:.2f}). "
            f"Set codec = {best!r}, or compression = \"measured\" to choose from speeds calibrated on this machine")


def warn_slow_codecs(tier_codecs: Mapping[str, str], profiles: Mapping[str, CodecProfile],
                     bandwidth: Mapping[str, tuple[float, float]], overflow_tiers: Collection[str] = ()) -> list[str]:
    """Log (warning) and return one message per tier whose codec is slower than the tier itself (for the
    `overflow_tiers`, whose busy encoders pass chunks on raw, the get alone is judged)."""
    messages = []
    for tier, codec in tier_codecs.items():
        message = slower_than_tier(tier, codec, profiles, bandwidth.get(tier, DEFAULT_TIER_BANDWIDTH["pfs"]),
                                   overflow=tier in overflow_tiers)
        if message is not None:
            logger.warning("%s", message)
            messages.append(message)
    return messages
