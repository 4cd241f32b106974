"""`kvstore serve`: run the sidecar daemon (uvicorn) on 127.0.0.1 or a unix socket.

Lifecycle: the store opens and rebuilds its index before the socket is bound, so the first
answer from /healthz means ready. SIGTERM or SIGINT: stop accepting, finish in-flight requests,
reclaim open shared-memory grants, drain the background write queues (store.close()), exit 0.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8765


def serve(config_path: Path | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          uds: str | None = None, log_level: str = "info") -> None:
    """Run the daemon until SIGTERM/SIGINT."""
    import uvicorn

    from service.app import create_app
    from service.config import load_daemon_config, with_shm_host

    store_config, service_config = load_daemon_config(config_path)
    if service_config.shm and service_config.shm_plane == "arena":
        store_config = with_shm_host(store_config, service_config.shm_name or f"kvstore-{os.getpid()}")
    if host not in ("127.0.0.1", "localhost", "::1") and not service_config.auth_enabled and uds is None:
        raise ConfigError(f"refusing to listen on {host} without auth: add [[service.tenants]] with tokens, "
                          "or bind to 127.0.0.1 / a unix socket")
    import torch

    # Requests already run in parallel on the I/O threads; torch's intra-op threads on top of them
    # only contend (a parallel memcpy stalls whenever one of its threads is descheduled).
    torch.set_num_threads(1)
    app = create_app(store_config, service_config, **_cluster_hooks())
    from service.http_guard import guarded_protocol

    server = _server_class()(uvicorn.Config(app, host=host, port=port, uds=uds, log_level=log_level, lifespan="on",
                                           timeout_graceful_shutdown=30, access_log=False,
                                           http=guarded_protocol(service_config.header_timeout_s)))
    logger.info("kvstore serve: %s", uds or f"http://{host}:{port}")
    server.run()
    if not server.started:
        raise SystemExit(3)


def _cluster_hooks() -> dict[str, Any]:
    """Join a Redis cluster when KVSTORE_CLUSTER_URL is set (service/cluster.py; needs the redis extra)."""
    if not os.environ.get("KVSTORE_CLUSTER_URL"):
        return {}
    from service.cluster import attach_cluster, cluster_config_from_env, detach_cluster

    cluster_config = cluster_config_from_env()
    return {"on_startup": [lambda app, store: attach_cluster(app, store, cluster_config)],
            "on_shutdown": [detach_cluster]}


def _server_class() -> type:
    import uvicorn

    class DaemonServer(uvicorn.Server):
        """uvicorn re-raises a caught SIGTERM after its graceful shutdown (exit status -15); the daemon
        has drained its writes by then, so it exits 0 instead."""

        def handle_exit(self, sig: int, frame: Any) -> None:
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
    logging.getLogger().setLevel(logging.INFO if log_level in ("debug", "info") else logging.WARNING)
    try:
        serve(config, host=host, port=port, uds=uds, log_level=log_level)
    except ConfigError as exc:
        typer.echo(f"kvstore serve: {exc}", err=True)
        raise typer.Exit(2) from exc
