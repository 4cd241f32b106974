"""Admission policy name -> class registry; `make_admission_policy` raises on unknown names."""

from __future__ import annotations

from typing import Any

from kvstore.registry import NameRegistry
from policies.admission.base import AdmissionPolicy

_REGISTRY: NameRegistry[AdmissionPolicy] = NameRegistry("admission policy", ["policies.admission.simple"])
register_admission_policy = _REGISTRY.register
admission_policy_names = _REGISTRY.names


def make_admission_policy(name: str, **options: Any) -> AdmissionPolicy:
    """A new admission policy by registry name (`always`, `second_hit`, `ghost`).

    `ghost` takes `capacity` (chunks the tier holds); its ghost list remembers that many keys.
    """
    return _REGISTRY.make(name, **options)
