"""Codec and compression-policy registries: `make_codec(name)`, `codec_by_id(id)`, `make_compression_policy(name)`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kvstore.errors import UnknownNameError
from kvstore.registry import NameRegistry

if TYPE_CHECKING:
    from policies.compression.base import Codec, CompressionPolicy

_MODULES = ["policies.compression.lossless", "policies.compression.lossy", "policies.compression.blosc",
            "policies.compression.nvcomp_codec", "policies.compression.zstd_planes", "policies.compression.policy",
            "policies.compression.measured"]
_CODECS: NameRegistry[Codec] = NameRegistry("codec", _MODULES, error=UnknownNameError)
_POLICIES: NameRegistry[CompressionPolicy] = NameRegistry("compression policy", _MODULES)
register_codec = _CODECS.register
register_compression_policy = _POLICIES.register
compression_policy_names = _POLICIES.names
logger = logging.getLogger(__name__)

# Codecs no tier writes any more -> the codec written in their place. Their ids still decode
# (`codec_by_id`), so chunks already stored with them stay readable. `lz4`'s hand-written byte-plane
# shuffle ran at 0.38x / 0.34x the raw O_DIRECT write / read (docs/bench/codecs.json, quiet machine);
# blosc-lz4 does the same shuffle + LZ4 in C on every core, faster than the disk both ways. blosc-zstd
# (level 1 over every byte) encoded at 0.65-0.94x the raw O_DIRECT write; `zstd` codes only the exponent
# byte plane with Zstandard's fast strategy (zstd_planes.py): a better ratio, faster than the disk.
RETIRED_FOR_WRITING = {"lz4": "blosc-lz4", "blosc-zstd": "zstd"}


def codec_names() -> list[str]:
    """Codec names in id order."""
    return [cls.name for cls in sorted(_CODECS.classes(), key=lambda c: c.codec_id)]  # type: ignore[attr-defined]


def make_codec(name: str, **options: Any) -> Codec:
    """A codec by name: `none` (id 0), `lz4` (1), `int8` (2, lossy), `fp8` (3, lossy), `blosc-lz4` (4),
    `blosc-zstd` (5), `nvcomp-lz4` (6), `zstd` (7). Every codec takes `threads` (0 = every core)."""
    return _CODECS.make(name, **options)


def writer_codec_name(name: str, tier: str = "") -> str:
    """The codec a tier configured with `name` writes: `name`, or a retired codec's successor (logged)."""
    successor = RETIRED_FOR_WRITING.get(name)
    if successor is None:
        return name
    logger.warning("tier %s: codec %r is retired for writing (too slow for a disk tier); writing %r instead. "
                   "Chunks already stored as %r still read; set codec = %r to silence this", tier or "?", name,
                   successor, name, successor)
    return successor


def codec_by_id(codec_id: int) -> Codec:
    """The codec whose header id is `codec_id` (for decoding a stored chunk)."""
    for cls in _CODECS.classes():
        if cls.codec_id == codec_id:  # type: ignore[attr-defined]
            return cls()
    valid = ", ".join(f"{cls.name}={cls.codec_id}" for cls in _CODECS.classes())  # type: ignore[attr-defined]
    raise UnknownNameError(f"unknown codec id {codec_id}; valid: {valid}")


def make_compression_policy(name: str, **options: Any) -> CompressionPolicy:
    """A compression policy by name: `static` (codec per tier), `utility` (per chunk, compress-or-demote) or
    `measured` (per tier, the codec the calibrated speeds favour)."""
    return _POLICIES.make(name, **options)
