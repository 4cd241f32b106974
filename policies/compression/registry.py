"""Codec and compression-policy registries: `make_codec(name)`, `codec_by_id(id)`, `make_compression_policy(name)`."""

from __future__ import annotations

import importlib
import logging
from typing import Any, TypeVar

from kvstore.errors import UnknownNameError, UnknownPolicyError

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=type)
_CODECS: dict[str, type] = {}
_POLICIES: dict[str, type] = {}
_MODULES = ["policies.compression.lossless", "policies.compression.lossy", "policies.compression.policy"]


def register_codec(cls: T) -> T:
    _CODECS[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def register_compression_policy(cls: T) -> T:
    _POLICIES[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def _load_all() -> None:
    for module in _MODULES:
        importlib.import_module(module)


def codec_names() -> list[str]:
    _load_all()
    return sorted(_CODECS, key=lambda n: _CODECS[n].codec_id)  # type: ignore[attr-defined]


def make_codec(name: str, **options: Any) -> Any:
    """A codec by name: `none` (id 0), `lz4` (1), `int8` (2, lossy), `fp8` (3, lossy)."""
    _load_all()
    try:
        return _CODECS[name](**options)
    except KeyError:
        raise UnknownNameError(f"unknown codec {name!r}; valid: {', '.join(codec_names())}") from None


def codec_by_id(codec_id: int) -> Any:
    """The codec whose header id is `codec_id` (for decoding a stored chunk)."""
    _load_all()
    for cls in _CODECS.values():
        if cls.codec_id == codec_id:  # type: ignore[attr-defined]
            return cls()
    valid = ", ".join(f"{n}={_CODECS[n].codec_id}" for n in codec_names())  # type: ignore[attr-defined]
    raise UnknownNameError(f"unknown codec id {codec_id}; valid: {valid}")


def compression_policy_names() -> list[str]:
    _load_all()
    return sorted(_POLICIES)


def make_compression_policy(name: str, **options: Any) -> Any:
    """A compression policy by name: `static` (codec per tier) or `utility` (per chunk, compress-or-demote)."""
    _load_all()
    try:
        cls = _POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown compression policy {name!r}; valid: {', '.join(sorted(_POLICIES))}"
        ) from None
    return cls(**options)
