"""`NameRegistry`: name -> class maps for policy families; unknown names raise, listing the valid ones."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from kvstore.errors import UnknownNameError, UnknownPolicyError

T = TypeVar("T", bound=type)
P = TypeVar("P")  # what the registered classes make: a policy protocol, a codec...


class NameRegistry(Generic[P]):
    """Classes registered by their `name` attribute; `modules` are imported on first use so that
    every built-in registers itself before a lookup."""

    def __init__(self, what: str, modules: Sequence[str], *, error: type[UnknownNameError] = UnknownPolicyError,
                 attr: str = "name") -> None:
        self.what = what
        self.modules = list(modules)
        self.error = error
        self.attr = attr
        self._classes: dict[str, type[P]] = {}

    def register(self, cls: T) -> T:
        self._classes[getattr(cls, self.attr)] = cls
        return cls

    def _load(self) -> None:
        for module in self.modules:
            importlib.import_module(module)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._classes)

    def classes(self) -> list[type[P]]:
        self._load()
        return list(self._classes.values())

    def get(self, name: str) -> type[P]:
        self._load()
        try:
            return self._classes[name]
        except KeyError:
            raise self.error(f"unknown {self.what} {name!r}; valid: {', '.join(sorted(self._classes))}") from None

    def make(self, name: str, **options: Any) -> P:
        return self.get(name)(**options)
