"""`kvstore serve`: run the sidecar daemon (uvicorn) on 127.0.0.1 or a unix socket.

Lifecycle: the process makes itself non-dumpable before anything else (service/hardening.py: a
process of the same uid cannot read its memfds or environment through /proc), reads tokens from
files or the environment and drops them from the environment; the config is checked and the port or socket bound before anything is allocated (a
bad config, a machine too small or a port in use fails in one line, exit 2); the store opens and
rebuilds its index before serving starts, so the first answer from /healthz means ready.
SIGTERM or SIGINT: stop accepting, finish in-flight requests, close the clients' shared-memory segments,
drain the background write queues (store.close()), exit 0.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvstore.errors import ConfigError, KVStoreError
from kvstore.logs import set_log_level

if TYPE_CHECKING:
    from kvstore.capacity_caps import CapacityCap
    from kvstore.config import StoreConfig
    from kvstore.store import TieredStore
    from service.config import ServiceConfig
    from service.kv_events import KVEventPublisher

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8765


def serve(config_path: Path | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          uds: str | None = None, log_level: str = "info") -> None:
    """Run the daemon until SIGTERM/SIGINT.

    Order: read and check the config (names, paths, memory, directory locks: nothing allocated
    yet), bind the port or socket, say where the daemon writes, open the store (arena touched,
    index rebuilt), then serve on the bound socket and say "ready".
    """
    from kvstore.where import where_lines
    from service.hardening import scrub_secret_env
    from service.malloc_tuning import HeapTrimmer, limit_arenas
    from service.startup_checks import bind_listener, close_listener

    store_config, service_config, caps = _checked_config(config_path, host=host, uds=uds)
    scrub_secret_env([*(t.token for t in service_config.tenants), service_config.admin_token,
                      service_config.metrics_token])
    sock = bind_listener(host, port, uds)
    url = f"unix:{uds}" if uds else f"http://{host}:{port}"
    if limit_arenas():  # before the store's threads allocate: service/malloc_tuning.py says why
        logger.info("malloc arenas limited to 2; the C heap is trimmed every 30 s")
    trimmer = HeapTrimmer().start()
    publisher = None
    try:
        publisher = _bind_kv_events(service_config, store_config)
        where = where_lines(store_config, shm_name=None)
        if service_config.shm:
            where.append("shared memory: per-client memfd segments (nothing in /dev/shm), their descriptors "
                         "handed over a 0600 unix socket")
        _say(f"pid {os.getpid()}, listening on {url}; writes to:", *(f"  {line}" for line in where))
        store = _open_store(store_config, caps)
    except BaseException:
        close_listener(sock, uds)
        if publisher is not None:
            publisher.close()
        raise
    import uvicorn

    from service.app import create_app
    from service.http_guard import guarded_protocol

    handed: list[TieredStore] = []  # the app's lifespan takes the store and closes it (writes drained)

    def hand_over(_config: StoreConfig) -> TieredStore:
        handed.append(store)
        return store

    try:
        app = create_app(store_config, service_config, store_factory=hand_over,
                         **_merge_hooks(_cluster_hooks(), _kv_events_hooks(publisher)))
        server = _server_class(url)(uvicorn.Config(app, host=host, port=port, uds=uds, log_level=log_level,
                                                   lifespan="on", timeout_graceful_shutdown=30, access_log=False,
                                                   http=guarded_protocol(service_config.header_timeout_s)))
        server.run(sockets=[sock])
    finally:
        trimmer.close()
        if not handed:  # uvicorn stopped before its lifespan began
            store.close()
        close_listener(sock, uds)
        if publisher is not None:
            publisher.close()  # a second close (after the shutdown hook's) does nothing
    if not server.started:
        raise SystemExit(3)


def _checked_config(config_path: Path | None, *, host: str,
                    uds: str | None) -> tuple[StoreConfig, ServiceConfig, list[CapacityCap]]:
    """The store config (capped tiers at their effective capacity), the service config, and the caps
    (tiers started below their configured capacity at a restart); every start-up check passed."""
    from kvstore.capacity_caps import apply_caps
    from kvstore.config import default_cache_dir
    from kvstore.preflight import check_machine
    from service.config import check_private_host_tier, load_daemon_config

    store_config, service_config = load_daemon_config(config_path)
    check_private_host_tier(store_config)
    if host not in ("127.0.0.1", "localhost", "::1") and not service_config.auth_enabled and uds is None:
        raise ConfigError(f"refusing to listen on {host} without auth: add [[service.tenants]] with tokens, "
                          "or bind to 127.0.0.1 / a unix socket")
    caps = check_machine(store_config, headroom_bytes=service_config.memory_headroom_bytes,
                         creatable_under=default_cache_dir())
    from kvstore.store.config_checks import check_tier_settings  # loads torch: after the machine checks

    check_tier_settings(store_config)
    return apply_caps(store_config, caps), service_config, caps


def _open_store(store_config: StoreConfig, caps: list[CapacityCap]) -> TieredStore:
    """The store, opened before serving."""
    import torch

    from kvstore.store import TieredStore

    # Requests already run in parallel on the I/O threads; torch's intra-op threads on top of them
    # only contend (a parallel memcpy stalls whenever one of its threads is descheduled).
    torch.set_num_threads(1)
    return TieredStore(store_config, caps=caps)


def _say(*lines: str) -> None:
    """Start-up facts an operator needs whatever the log level: on stderr, prefixed, flushed."""
    for line in lines:
        print(f"kvstore serve: {line}", file=sys.stderr, flush=True)


def _cluster_hooks() -> dict[str, Any]:
    """Join a Redis cluster when KVSTORE_CLUSTER_URL is set (service/cluster.py; needs the redis extra)."""
    if not os.environ.get("KVSTORE_CLUSTER_URL"):
        return {}
    from service.cluster import attach_cluster, cluster_config_from_env, detach_cluster

    cluster_config = cluster_config_from_env()
    return {"on_startup": [lambda app, store: attach_cluster(app, store, cluster_config)],
            "on_shutdown": [detach_cluster]}


def _server_class(url: str) -> type:
    import uvicorn

    class DaemonServer(uvicorn.Server):
        """uvicorn re-raises a caught SIGTERM after its graceful shutdown (exit status -15); the daemon
        has drained its writes by then, so it exits 0 instead. "ready" is said once serving has begun
        on the socket bound before the store opened."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # said once, whatever the log level (not logged a second time)
                _say(f"ready at {url}")

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return DaemonServer


def serve_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config; daemon settings under its service table")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless tenants with tokens are configured)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", envvar="KVSTORE_PORT")] = DEFAULT_PORT,
    uds: Annotated[str | None, typer.Option("--uds", help="Listen on this unix socket instead of TCP")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Run the sidecar daemon: HTTP control plane, shared-memory data plane, auth, metrics."""
    from service.hardening import make_undumpable

    make_undumpable()  # first: nothing of this process may be readable through /proc by its uid
    set_log_level({"debug": logging.DEBUG, "info": logging.INFO}.get(log_level, logging.WARNING))
    try:
        serve(config, host=host, port=port, uds=uds, log_level=log_level)
    except KVStoreError as exc:  # ConfigError, or a tier that cannot open its directory or device
        typer.echo(f"kvstore serve: {_one_line(exc)}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:  # SIGINT before serving began: the store (if open) was closed on the way out
        typer.echo("kvstore serve: interrupted during start-up; stopped before serving", err=True)
        raise typer.Exit(130) from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _bind_kv_events(service_config: ServiceConfig, store_config: StoreConfig) -> KVEventPublisher | None:
    """The KV event publisher with its sockets bound (before the store opens), when service.kv_events is enabled."""
    if not service_config.kv_events.enabled:
        return None
    from service.kv_events_config import check_pyzmq

    check_pyzmq(service_config.kv_events)  # one line naming the fix, before the store opens
    from service.kv_events import KVEventPublisher

    publisher = KVEventPublisher(service_config.kv_events, block_size=store_config.layout.chunk_tokens)
    _say(f"KV events on {service_config.kv_events.endpoint}, replay on {service_config.kv_events.replay_endpoint}, "
         f"topic {service_config.kv_events.topic!r}")
    return publisher


def _kv_events_hooks(publisher: KVEventPublisher | None) -> dict[str, Any]:
    if publisher is None:
        return {}
    return {"on_startup": [lambda app, store: publisher.attach(store)], "on_shutdown": [lambda app: publisher.close()]}


def _merge_hooks(*hooks: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, list[Any]] = {}
    for part in hooks:
        for name, functions in part.items():
            merged.setdefault(name, []).extend(functions)
    return merged
