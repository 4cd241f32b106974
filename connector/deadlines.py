"""`Deadlines`: the engine side's one timeout per kind of call, its save queue's bound and its breaker's settings.

    kind      budget               the calls                                            past it
    lookup    lookup_timeout_s     a prefix lookup (on the scheduler's path)            a miss (0 chunks)
    load      load_timeout_s       a batch of chunk reads                               misses (recomputed)
    save      save_timeout_s       a batch of chunk writes, a remove (off the path)     not stored
    control   control_timeout_s    everything else: info, layout registration,          raised (stats) or
                                   shared-memory segments, stats, route                 logged (segments)

Each budget is applied in one place: `EngineStore._call` (connector/engine_store.py) picks it per call,
and the daemon's client enforces it at the socket (connector/lean_http.py: every send and receive of
the call gets what is left of it), the embedded store by waiting on a worker thread. Nothing else on
the engine's side has a timeout of its own. These are engine-side options (an engine's extra config
map, connector/plugin_store.py); the daemon's own limits are `[service]` settings (service/config.py).

The defaults keep a frozen or overloaded daemon from holding up an engine: a lookup on the scheduler's
path waits at most 0.5 s, a load 5 s (then vLLM recomputes), and after the first call that ran out of
its budget nothing waits at all until a probe succeeds (the breaker, kvstore/breaker.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from kvstore.errors import ConfigError


class CallKind(Enum):
    """The kinds of store call, each with one budget in `Deadlines`."""

    LOOKUP = "lookup"
    LOAD = "load"
    SAVE = "save"
    CONTROL = "control"


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadlines:
    """Engine-side budgets (each an option of the engine's extra config under the same name).

    Args:
        lookup_timeout_s: a prefix lookup on the scheduler's path; past it the answer is a miss.
        load_timeout_s: one batch of chunk reads; past it the chunks count as failed loads (recomputed).
        save_timeout_s: one batch of chunk writes (off the engine's path); past it they count as not stored.
        control_timeout_s: any other call to the daemon (start-up info, layout registration, shared-memory
            segments, stats, route).
        save_queue_chunks: chunks waiting to be saved; more are dropped (counted, logged once per interval).
        breaker_failures: failures in a row that open the breaker (one timeout opens it at once).
        breaker_cooldown_s: how long an open breaker answers misses before it lets one probe call through.
        breaker: False for a client nothing waits on (`patient`): its breaker never opens. Not an engine option.
    """

    lookup_timeout_s: float = 0.5
    load_timeout_s: float = 5.0
    save_timeout_s: float = 10.0
    control_timeout_s: float = 10.0
    save_queue_chunks: int = 64
    breaker_failures: int = 3
    breaker_cooldown_s: float = 5.0
    breaker: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "breaker":
                continue
            value = getattr(self, f.name)
            if not value > 0:
                raise ConfigError(f"kvstore option {f.name}={value!r} must be > 0 (default {f.default})")

    @classmethod
    def patient(cls, timeout_s: float) -> Deadlines:
        """A client nothing waits on (a script, a test, a bench): every kind gets `timeout_s`, and no breaker."""
        return cls(lookup_timeout_s=timeout_s, load_timeout_s=timeout_s, save_timeout_s=timeout_s,
                   control_timeout_s=timeout_s, breaker=False)

    def budget_s(self, kind: CallKind) -> float:
        """The one timeout of a kind of call."""
        return {CallKind.LOOKUP: self.lookup_timeout_s, CallKind.LOAD: self.load_timeout_s,
                CallKind.SAVE: self.save_timeout_s, CallKind.CONTROL: self.control_timeout_s}[kind]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Deadlines:
        """The deadline options found in an engine's extra-config map (other keys are ignored here)."""
        picked: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data and f.name != "breaker":
                kind = int if f.name in ("save_queue_chunks", "breaker_failures") else float
                try:
                    picked[f.name] = kind(data[f.name])
                except (TypeError, ValueError):
                    raise ConfigError(f"kvstore option {f.name}={data[f.name]!r} is not a number "
                                      f"(default {f.default})") from None
        return cls(**picked)

    @staticmethod
    def names() -> set[str]:
        return {f.name for f in fields(Deadlines)} - {"breaker"}
