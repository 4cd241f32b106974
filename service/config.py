"""Daemon configuration: tenants, tokens, quotas and limits, read from the store config's [service] table.

Same TOML/YAML file as the store; the `[service]` table is taken out before the rest goes to
`kvstore.config.config_from_dict`::

    model_id = "llama-3-8b"
    [[tiers]]
    kind = "host"
    capacity = "8GiB"
    [service]
    max_body_bytes = "256MiB"
    lease_s = 30
    [[service.tenants]]
    name = "team-a"
    token_file = "/etc/kvstore/team-a.token"   # or token_env = "TEAM_A_TOKEN", or token = "..."
    salt = "a-7f3c"               # part of the hash namespace; keep it stable across restarts
    shm = true                    # default: may use the shared-memory data plane when local (its own
                                  # segments only; set false to keep a tenant on HTTP)
    quota = { host = "2GiB", nvme = "50GiB" }
    memory = "512MiB"             # its shared-memory segments and request buffers (default:
                                  # service.tenant_memory_bytes)
    [service.model_budgets]       # optional: bytes each named model may hold (service/model_budgets.py)
    "Qwen/Qwen3-0.6B" = "4GiB"

Tokens are best read from files (`token_file`, `admin_token_file`, `metrics_token_file`: the
file's content, surrounding whitespace stripped); the environment forms still work, and the
daemon removes every variable holding a token from its environment once read (service/hardening.py).
Shared memory is per-client memfd segments, the one plane (the old "arena" plane and its settings are
refused with a line naming the replacement, RETIRED_KEYS; `shm_plane = "segments"`, once its one accepted
value, is ignored with a warning).

No tenants = no auth: every request is the anonymous tenant "default" (bind to loopback only).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.config import StoreConfig, config_from_dict, default_cache_dir, env_keys
from kvstore.config_convert import convert
from kvstore.config_env import layer_env, read_config_file
from kvstore.errors import ConfigError
from kvstore.types import TierKind
from kvstore.units import ByteCount
from service.kv_events_config import KVEventsConfig, kv_events_from_dict
from service.role_tokens import ROLES, check_role_tokens, read_token_file, role_tokens_from

logger = logging.getLogger(__name__)
DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantConfig:
    """One tenant: its bearer token, hash salt, data-plane right and byte quota per tier (name -> bytes).

    Attributes:
        name: the tenant's name in stats and metrics.
        token: its bearer token (8+ characters): give token_file (mode 0600) or token_env, not the token itself.
        salt: folded into every key of the tenant's chunks: tenants never share a chunk.
        shm: its local clients may use the shared-memory plane (their own segments only); false: HTTP only.
        quota_bytes: bytes it may hold per tier (`quota = { host = "8GiB", nvme = "200GiB" }`); none: no quota.
        memory_bytes: its memory budget in the daemon (segments and request buffers); none: service.tenant_memory_bytes.
    """

    name: str
    token: str = field(repr=False)
    salt: str = field(repr=False)
    shm: bool = True
    quota_bytes: Mapping[str, ByteCount] = field(default_factory=dict)
    memory_bytes: ByteCount | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.token or not self.salt:
            raise ConfigError(f"tenant {self.name!r}: name, token and salt must all be non-empty")
        if len(self.token) < 8:
            raise ConfigError(f"tenant {self.name!r}: token is {len(self.token)} characters; use at least 8")
        object.__setattr__(self, "quota_bytes", {TierKind.parse(t).value: n for t, n in self.quota_bytes.items()})
        for tier, nbytes in self.quota_bytes.items():
            if nbytes <= 0:
                raise ConfigError(f"tenant {self.name!r}: quota for {tier} must be positive, got {nbytes}")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ConfigError(f"tenant {self.name!r}: memory must be positive, got {self.memory_bytes}")

    @property
    def quota_limit_bytes(self) -> int | None:
        """The cap on the tenant's bytes: each chunk enters the top tier and every disk tier, so the
        tightest per-tier quota bounds what the tenant holds anywhere."""
        return min(self.quota_bytes.values()) if self.quota_bytes else None


_ARENA_RETIRED = ('the "arena" shared-memory plane is retired: the default "segments" plane replaces it '
                  '(per-client memfd segments, tenants isolated, one copy into buffers from empty_chunk()); ')
RETIRED_KEYS = {  # settings of the retired arena plane: each refused with one line naming what replaces it
    "shm_plane": _ARENA_RETIRED + 'remove service.shm_plane (docs/security.md, "Migrating from the arena plane")',
    "shm_name": _ARENA_RETIRED + "remove service.shm_name: segments have no name in /dev/shm",
    "max_lease_fraction": _ARENA_RETIRED + "remove service.max_lease_fraction: segments hold no leases",
    "max_lease_total_fraction": _ARENA_RETIRED + "remove service.max_lease_total_fraction: segments hold no leases",
    "max_pin_s": _ARENA_RETIRED + "remove service.max_pin_s: segments pin nothing in the store",
    "pin_window_s": _ARENA_RETIRED + "remove service.pin_window_s: segments pin nothing in the store",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """Limits of the daemon.

    Attributes:
        max_body_bytes: largest request body accepted (413 above).
        max_batch_chunks: most chunks in one batched request.
        max_lookup_tokens: most token ids in one lookup.
        lease_s: a client's shared-memory segment unused for 10 x this is closed (and reported in /v1/info).
        io_threads: threads that run store calls (disk I/O never runs on the event loop).
        shm: offer colocated clients the shared-memory data plane: per-client memfd segments handed over
            a unix socket, chunks copied in and out by the daemon (tenants isolated).
        shm_socket: the unix socket that hands out segment descriptors; None = a per-process path
            in the temp directory.
        shm_socket_deadline_s: a connection to that socket that has not sent its request within this is
            closed (service/fd_server.py serves every connection at once, so this bounds what an idle or
            trickling peer holds, not anyone's wait).
        shm_socket_max_per_peer, shm_socket_max_connections: open connections to that socket per client
            process (SO_PEERCRED pid) and in all; one past a cap is closed at once.
        tenant_memory_bytes: each tenant's memory budget (a tenant's `memory` overrides it): its open
            shared-memory segments plus the staging buffers of its requests in flight (an HTTP put's
            body copy, a get's response buffer), beside its chunk quota; past it, 429 naming it
            (service/memory_budget.py). A shm client holds two segments of up to 64 slots.
        memory_headroom_bytes: RAM (and /dev/shm room) left free at start: a host tier larger than
            MemAvailable minus this is refused before anything is allocated (kvstore/preflight.py).
        durable_puts: acknowledge a put only once its disk copies are written, so a crash
            right after the answer loses nothing acknowledged.
        header_timeout_s: a connection whose request headers are not complete within this is closed.
        request_timeout_s: a store call (other than a put, which has put_timeout_s) not done within
            this is answered 503 and left to finish on its thread.
        max_abandoned_calls: store calls past their deadline whose threads still run (a stalled disk
            or Redis; service/abandoned.py); at this many, new store calls answer 503 at once.
        shared_lookup_timeout_s: a lookup that must ask a shared tier (PFS, Redis) answers 503 after this
            (the client counts it as a miss) rather than wait for a stalled backend. The daemon's side; an
            engine's own `lookup_timeout_s` (connector/deadlines.py) bounds its wait for the answer.
        body_timeout_s: a request whose body is not complete within this gets 408 and is closed.
        admin_token: sees global /v1/stats, per-tenant metrics and the cluster event stream
            (from admin_token_file, else admin_token_env, default KVSTORE_ADMIN_TOKEN; never a tenant's token).
        metrics_token: may read /metrics without being a tenant (from metrics_token_file, else
            metrics_token_env, default KVSTORE_METRICS_TOKEN); without auth and without it, /metrics is open.
        kv_events: the opt-in publisher of vLLM-compatible KV events (`[service.kv_events]`,
            service/kv_events_config.py; docs/operations.md "KV events").
        model_budgets: bytes each named model (its clients' X-KV-Model) may hold in the store; a put past it
            removes that model's own oldest chunks first (service/model_budgets.py). Unnamed models: no cap.
    """

    tenants: tuple[TenantConfig, ...] = ()
    max_body_bytes: ByteCount = 256 << 20
    max_batch_chunks: int = 1024
    max_lookup_tokens: int = 1 << 20
    lease_s: float = 30.0
    io_threads: int = 8
    shm: bool = True
    shm_socket: str | None = None
    shm_socket_deadline_s: float = 1.0
    shm_socket_max_per_peer: int = 8
    shm_socket_max_connections: int = 64
    tenant_memory_bytes: ByteCount = 1 << 30
    durable_puts: bool = True
    memory_headroom_bytes: ByteCount = 1 << 30
    header_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    shared_lookup_timeout_s: float = 0.5
    max_abandoned_calls: int = 16
    body_timeout_s: float = 60.0
    admin_token: str | None = field(default=None, repr=False)
    metrics_token: str | None = field(default=None, repr=False)
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    model_budgets: Mapping[str, ByteCount] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_batch_chunks", "max_lookup_tokens", "io_threads", "max_abandoned_calls",
                     "shm_socket_max_per_peer", "shm_socket_max_connections", "tenant_memory_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"service.{name} must be >= 1, got {getattr(self, name)}")
        if min(self.header_timeout_s, self.body_timeout_s, self.request_timeout_s, self.shared_lookup_timeout_s) <= 0:
            raise ConfigError(f"service: header_timeout_s ({self.header_timeout_s}), body_timeout_s "
                              f"({self.body_timeout_s}), request_timeout_s and shared_lookup_timeout_s must be positive")
        if self.lease_s <= 0:
            raise ConfigError(f"service.lease_s must be positive, got {self.lease_s}")
        if self.shm_socket_deadline_s <= 0:
            raise ConfigError(f"service.shm_socket_deadline_s must be positive, got {self.shm_socket_deadline_s}")
        for attr in ("name", "token", "salt"):
            values = [getattr(t, attr) for t in self.tenants]
            if len(set(values)) != len(values):
                raise ConfigError(f"service.tenants: each tenant needs a distinct {attr}")
        check_role_tokens(self)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tenants)


def load_daemon_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None,
                       ) -> tuple[StoreConfig, ServiceConfig]:
    """The store config (everything but [service], with KVSTORE_* overrides) and the service config."""
    env = os.environ if env is None else env
    data = read_config_file(Path(path)) if path is not None else {}
    service = service_config_from_dict(data.pop("service", None) or {}, env)
    store = config_from_dict(layer_env(data, f"file {path}", env, env_keys()).data, cache_dir=default_cache_dir(env))
    return store, service


def service_config_from_dict(raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> ServiceConfig:
    """The [service] table: tokens read from their files or variables, then the table as a ServiceConfig."""
    raw = dict(raw)
    if str(raw.get("shm_plane", "")).lower() == "segments":  # its one value: nothing to choose any more
        logger.warning("service.shm_plane = 'segments' is no longer a setting (segments are the one plane); remove it")
        raw.pop("shm_plane")
    if "lookup_timeout_s" in raw:  # renamed: the engine side has its own lookup_timeout_s
        logger.warning("service.lookup_timeout_s is now service.shared_lookup_timeout_s; rename it (the old name "
                       "still works for now)")
        raw.setdefault("shared_lookup_timeout_s", raw.pop("lookup_timeout_s"))
        raw.pop("lookup_timeout_s", None)
    retired = sorted(set(raw) & set(RETIRED_KEYS))
    if retired:
        raise ConfigError(RETIRED_KEYS[retired[0]])
    token_keys = [f"{role}_token_{how}" for role in ROLES for how in ("env", "file")]
    tables = raw.pop("tenants", None) or []
    if not isinstance(tables, list):
        raise ConfigError("service.tenants must be a list of tables; write [[service.tenants]] tables")
    tenants = tuple(_tenant_from(t, env or {}) for t in tables)
    kv_events = kv_events_from_dict(raw.pop("kv_events", None))
    tokens = role_tokens_from({k: raw.pop(k) for k in [*token_keys, "admin_token", "metrics_token"] if k in raw},
                              env or {})
    return convert({**raw, **tokens, "tenants": tenants, "kv_events": kv_events}, ServiceConfig, where="service.",
                   also_valid=token_keys)


def _tenant_from(raw: object, env: Mapping[str, str]) -> TenantConfig:
    """One [[service.tenants]] table; its token from `token`, else `token_file`, else the variable `token_env`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"service.tenants: each entry must be a table (name, token_file, salt...), got {raw!r}")
    table = dict(raw)
    name = str(table.get("name", ""))
    token_file, token_env = table.pop("token_file", None), table.pop("token_env", None)
    if table.get("token") is None and token_file:
        table["token"] = read_token_file(token_file, f"tenant {name!r} token_file")
    if table.get("token") is None and token_env:
        table["token"] = env.get(str(token_env))
        if table["token"] is None:
            raise ConfigError(f"tenant {name!r}: environment variable {token_env} (token_env) is not set")
    table.setdefault("token", "")
    table.setdefault("salt", "")
    table.setdefault("name", "")
    return convert(table, TenantConfig, where=f"tenant {name!r}: ", also_valid=("token_env", "token_file"))


def check_private_host_tier(config: StoreConfig) -> None:
    """The daemon keeps its host arena private: a host tier named into /dev/shm (`options.shm_name`,
    which only the retired arena plane used) is refused, since any process of this user could map it."""
    host = config.tier(TierKind.HOST)
    named = host.options.get("shm_name") if host is not None else None
    if named:
        raise ConfigError(f"tier host: options.shm_name = {named!r} would put the daemon's host arena in /dev/shm, "
                          "where any process of this user can map it; remove it (the arena plane that used it is "
                          "retired: clients share memory through per-client segments, README \"Migrating from the "
                          "arena plane\")")
