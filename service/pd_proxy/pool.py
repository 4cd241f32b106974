"""The upstream instances of one role (prefill or decode): their health and in-flight requests, and the
order to try them in (least loaded first).

Everything here runs on the proxy's one event loop, so the counts need no lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

from service.pd_proxy.config import InstanceSpec


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(slots=True)
class Instance:
    """One upstream server: where it is, whether it answered its last health poll, what it is doing now."""

    spec: InstanceSpec
    role: Role
    is_healthy: bool = True  # until a poll or a failed call says otherwise
    num_in_flight: int = 0
    num_sent: int = 0
    num_failed: int = 0

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def node_id(self) -> str | None:
        return self.spec.node_id


class InstancePool:
    """The instances of one role, chosen least loaded first (in-flight requests, then fewest sent)."""

    def __init__(self, role: Role, specs: Sequence[InstanceSpec]) -> None:
        self.role = role
        self.instances = [Instance(spec, role) for spec in specs]

    def by_load(self, *, exclude: Sequence[Instance] = ()) -> list[Instance]:
        """Healthy instances not in `exclude`, least loaded first."""
        healthy = [i for i in self.instances if i.is_healthy and i not in exclude]
        return sorted(healthy, key=lambda i: (i.num_in_flight, i.num_sent))

    def mark_failed(self, instance: Instance) -> None:
        """A call could not reach it: skip it until its /health answers again."""
        instance.num_failed += 1
        instance.is_healthy = False

    @staticmethod
    def begin(instance: Instance) -> None:
        """One more request in flight on `instance`; the caller must `end` it exactly once."""
        instance.num_in_flight += 1
        instance.num_sent += 1

    @staticmethod
    def end(instance: Instance) -> None:
        instance.num_in_flight -= 1

    @contextmanager
    def hold(self, instance: Instance) -> Iterator[Instance]:
        """Count one request in flight on `instance` for the duration of the block."""
        self.begin(instance)
        try:
            yield instance
        finally:
            self.end(instance)
