"""`[service.kv_events]`: the opt-in ZMQ publisher of vLLM-compatible KV events, its endpoints and bounds.

    [service.kv_events]
    enabled = true
    endpoint = "tcp://127.0.0.1:5557"          # PUB: (topic, seq, payload) frames, as vLLM publishes
    replay_endpoint = "tcp://127.0.0.1:5558"   # ROUTER: batches from a sequence number on, then an end marker
    topic = "kv-events"
    replay_batches = 10000                     # the replay window, in batches ...
    replay_bytes = "32MiB"                     # ... and in payload bytes, whichever is reached first
    max_queue_events = 100000                  # events waiting for the publisher thread; past it, dropped and counted
    max_batch_events = 512                     # events in one batch
    int_block_hashes = false                   # low 64 bits of a key as an int, instead of its 16 bytes
    allow_remote = false                       # a non-loopback tcp endpoint (ZMQ here has no authentication)

The stream names every tenant's store keys, so it is the operator's: loopback or ipc:// by default.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.config_convert import convert
from kvstore.errors import ConfigError
from kvstore.units import ByteCount

_LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVEventsConfig:
    """The KV event publisher's settings; `enabled = false` (the default) publishes nothing.

    Attributes:
        enabled: publish the store's changes as vLLM-compatible KV events (needs pyzmq: the `events` extra).
        endpoint: the PUB socket, tcp://HOST:PORT (loopback unless allow_remote) or ipc://PATH (made 0600).
        replay_endpoint: the ROUTER socket that answers [id, "", start seq] with the window's batches from that
            sequence number on, then an end marker (seq -1); none: no replay.
        topic: the first frame of every message (a subscriber's SUBSCRIBE prefix).
        replay_batches: the replay window in batches.
        replay_bytes: the replay window in payload bytes (whichever of the two is reached first).
        max_queue_events: store changes waiting for the publisher thread; past it a change is dropped, counted
            (kv_events_dropped) and followed by a resync.
        max_batch_events: events in one batch.
        int_block_hashes: a chunk key as its low 64 bits (an int) instead of its 16 bytes.
        allow_remote: accept a non-loopback tcp endpoint (ZMQ here has no authentication; the stream names every
            tenant's store keys).
    """

    enabled: bool = False
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = "tcp://127.0.0.1:5558"
    topic: str = "kv-events"
    replay_batches: int = 10_000
    replay_bytes: ByteCount = 32 << 20
    max_queue_events: int = 100_000
    max_batch_events: int = 512
    int_block_hashes: bool = False
    allow_remote: bool = False

    def __post_init__(self) -> None:
        if self.replay_endpoint == "":  # how a file says none
            object.__setattr__(self, "replay_endpoint", None)
        for name in ("replay_batches", "replay_bytes", "max_queue_events", "max_batch_events"):
            if getattr(self, name) < 1:
                raise ConfigError(f"service.kv_events.{name} must be >= 1, got {getattr(self, name)}")
        endpoints = [("endpoint", self.endpoint)]
        if self.replay_endpoint is not None:
            endpoints.append(("replay_endpoint", self.replay_endpoint))
            if self.replay_endpoint == self.endpoint:
                raise ConfigError(f"service.kv_events: endpoint and replay_endpoint are both {self.endpoint!r}; "
                                  "give the replay socket its own port or path")
        for name, value in endpoints:
            _check_endpoint(name, value, allow_remote=self.allow_remote)


def _check_endpoint(name: str, endpoint: str, *, allow_remote: bool) -> None:
    """tcp://HOST:PORT with a loopback HOST (any HOST with allow_remote), or ipc://PATH."""
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return
    if not endpoint.startswith("tcp://") or ":" not in endpoint[len("tcp://"):]:
        raise ConfigError(f"service.kv_events.{name} = {endpoint!r}: use tcp://127.0.0.1:PORT or ipc:///PATH")
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"service.kv_events.{name} = {endpoint!r}: the port must be a number")
    if allow_remote or _is_loopback(host.strip("[]")):
        return
    raise ConfigError(f"service.kv_events.{name} = {endpoint!r} is not a loopback address: the stream names every "
                      "tenant's store keys and ZMQ has no authentication here; bind 127.0.0.1 or ipc:// (and forward "
                      "it over a channel you secure), or set service.kv_events.allow_remote = true")


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def kv_events_from_dict(raw: Mapping[str, Any] | None) -> KVEventsConfig:
    """The `[service.kv_events]` table; unknown keys are refused, naming the valid ones."""
    return convert(raw or {}, KVEventsConfig, where="service.kv_events.")


def check_pyzmq(config: KVEventsConfig) -> None:
    """Refuse a config that enables events on a machine without pyzmq, in one line naming the fix."""
    if not config.enabled:
        return
    try:
        import zmq  # noqa: F401  (the optional `events` extra)
    except ImportError:
        raise ConfigError("service.kv_events.enabled = true needs pyzmq, which is not installed: "
                          "pip install 'kvstore[events]' (or pyzmq>=26), or set service.kv_events.enabled = false") from None
