"""TierKind -> Tier class registry, and `make_tier` which raises on an unknown kind."""

from __future__ import annotations

import importlib
from typing import Any

from kvstore.errors import UnknownTierError
from kvstore.types import TierKind
from tiers.base import Tier

_MODULES = {
    TierKind.GPU: "tiers.gpu",
    TierKind.HOST: "tiers.host",
    TierKind.NVME: "tiers.nvme",
    TierKind.PFS: "tiers.pfs",
    TierKind.REDIS: "tiers.redis_tier",
}
_REGISTRY: dict[TierKind, type[Tier]] = {}


def register_tier(cls: type[Tier]) -> type[Tier]:
    _REGISTRY[cls.kind] = cls
    return cls


def tier_class(kind: TierKind | str) -> type[Tier]:
    kind = TierKind.parse(kind) if isinstance(kind, str) else kind
    if kind not in _REGISTRY:
        try:
            importlib.import_module(_MODULES[kind])
        except ModuleNotFoundError as exc:
            raise UnknownTierError(f"tier {kind.value!r} is not available here: {exc}") from exc
    return _REGISTRY[kind]


def make_tier(kind: TierKind | str, **options: Any) -> Tier:
    """Build a tier by kind; options are the class's keyword arguments."""
    return tier_class(kind)(**options)
