"""`kvstore pd-proxy`: the prefill/decode proxy's command (service.pd_proxy; uvicorn loads when it runs)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer

from kvstore.errors import ConfigError
from kvstore.logs import set_log_level

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def pd_proxy_command(
    prefill: Annotated[list[str] | None, typer.Option("--prefill", help="A prefill instance: URL or NODE_ID=URL (repeat)")] = None,
    decode: Annotated[list[str] | None, typer.Option("--decode", help="A decode instance: URL or NODE_ID=URL (repeat)")] = None,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    api_key: Annotated[str | None, typer.Option(help="Bearer token clients must send; also sent upstream",
                                                envvar="KVSTORE_PD_PROXY_API_KEY")] = None,
    max_in_flight: Annotated[int, typer.Option(help="Client requests at once (429 beyond)")] = 256,
    max_body_bytes: Annotated[str, typer.Option(help="Largest request body, e.g. 16MiB (413 beyond)")] = "16MiB",
    connect_timeout: Annotated[float, typer.Option(help="Seconds to connect to an instance")] = 5.0,
    prefill_timeout: Annotated[float, typer.Option(help="Seconds for a prefill answer")] = 300.0,
    decode_timeout: Annotated[float, typer.Option(help="Seconds for a decode answer (streamed: between pieces)")] = 600.0,
    health_interval: Annotated[float, typer.Option(help="Seconds between two /health polls of an instance")] = 3.0,
    kvstore_url: Annotated[str | None, typer.Option(help="A kvstore daemon in a cluster, asked where prefixes live")] = None,
    kvstore_token: Annotated[str | None, typer.Option(help="Tenant token for --kvstore-url",
                                                      envvar="KVSTORE_PD_PROXY_KVSTORE_TOKEN")] = None,
    kv_events: Annotated[list[str] | None, typer.Option("--kv-events", help="A node's daemon KV events, "
                                                        "NODE_ID=tcp://HOST:PORT,tcp://HOST:REPLAY_PORT (repeat): route "
                                                        "from them, with --kvstore-url for the key namespace")] = None,
    local_prefill_tokens: Annotated[int, typer.Option(help="A token-id prompt shorter than this goes straight to "
                                                      "decode (e.g. the connector's chunk_tokens; 0: never)")] = 0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "warning",
) -> None:
    """Prefill/decode disaggregation: each request's prompt on a prefill instance, its answer on a decode instance."""
    set_log_level({"debug": logging.DEBUG, "info": logging.INFO}.get(log_level, logging.WARNING))
    try:
        config = _config(prefill or [], decode or [], api_key=api_key, max_in_flight=max_in_flight,
                         max_body_bytes=max_body_bytes, connect_timeout_s=connect_timeout, prefill_timeout_s=prefill_timeout,
                         decode_timeout_s=decode_timeout, health_interval_s=health_interval,
                         kvstore_url=kvstore_url, kvstore_token=kvstore_token,
                         local_prefill_tokens=local_prefill_tokens, kv_events=kv_events or [])
    except ConfigError as exc:
        typer.echo(f"kvstore pd-proxy: {exc}", err=True)
        raise typer.Exit(2) from None
    if host not in LOOPBACK and not config.api_key:
        typer.echo(f"kvstore pd-proxy: binding {host} without --api-key: anyone who reaches it can generate", err=True)
    _run(config, host, port, log_level)


def _config(prefill: list[str], decode: list[str], *, max_body_bytes: str, kv_events: list[str], **options: Any) -> Any:
    from kvstore.units import parse_bytes
    from service.pd_proxy.config import EventSource, InstanceSpec, ProxyConfig

    return ProxyConfig(prefill=tuple(InstanceSpec.parse(p, option="--prefill") for p in prefill),
                       decode=tuple(InstanceSpec.parse(d, option="--decode") for d in decode),
                       max_body_bytes=parse_bytes(max_body_bytes, field="--max-body-bytes"),
                       kv_events=tuple(EventSource.parse(e) for e in kv_events), **options)


def _run(config: Any, host: str, port: int, log_level: str) -> None:
    import uvicorn

    from service.pd_proxy.app import create_app

    url = f"http://{host}:{port}"

    class ProxyServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"kvstore pd-proxy: ready at {url} ({len(config.prefill)} prefill, "
                      f"{len(config.decode)} decode instances)", file=sys.stderr, flush=True)

    ProxyServer(uvicorn.Config(create_app(config), host=host, port=port, log_level=log_level,
                               timeout_graceful_shutdown=5)).run()
