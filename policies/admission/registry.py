"""Admission policy name -> class registry; `make_admission_policy` raises on unknown names."""

from __future__ import annotations

import importlib
import logging
from typing import Any, TypeVar

from kvstore.errors import UnknownPolicyError

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=type)
_REGISTRY: dict[str, type] = {}
_MODULES = ["policies.admission.simple"]


def register_admission_policy(cls: T) -> T:
    _REGISTRY[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def _load_all() -> None:
    for module in _MODULES:
        importlib.import_module(module)


def admission_policy_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def make_admission_policy(name: str, **options: Any) -> Any:
    """A new admission policy by registry name (`always`, `second_hit`, `ghost`).

    `ghost` takes `capacity` (chunks the tier holds); its ghost list remembers that many keys.
    """
    _load_all()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown admission policy {name!r}; valid: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return cls(**options)
