"""`kvstore stats`: a running daemon's counters (`--url`), or the configured store opened in this process.

With `--url` it asks the daemon (GET /v1/stats; the admin token sees every tier and tenant). Without,
it opens the store itself (rebuilding its index from disk) and prints its stats and where it writes;
when a daemon holds the store's directory it says so in one line, with the `--url` to use, before
anything is allocated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from kvstore.config import StoreConfig
from kvstore.preflight import LOCAL_DIR_KINDS

DEFAULT_URL = "http://127.0.0.1:8765"


def stats_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config")] = None,
    url: Annotated[str | None, typer.Option("--url", help="ask the daemon at this URL (http://HOST:PORT or unix:PATH)")] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="KVSTORE_TOKEN", help="bearer token for --url (admin: every tier and tenant)")] = None,
) -> None:
    """Print the store's counters per tier and where it writes; `--url` asks a running `kvstore serve`."""
    if url is not None:
        typer.echo(json.dumps(daemon_stats(url, token), indent=2))
        return
    from kvstore.cli.checked_config import load_checked_config

    store_config, caps = load_checked_config(config, command="stats", before_checks=refuse_if_daemon_holds)
    from kvstore.store import TieredStore  # torch and the tiers load only once the config is checked
    from kvstore.where import where_lines

    with TieredStore(store_config, caps=caps) as store:
        stats_out = {**store.stats(), "where": where_lines(store_config, shm_name=store.host_shm_name, log=None)}
        typer.echo(json.dumps(stats_out, indent=2))


def daemon_stats(url: str, token: str | None) -> dict[str, object]:
    """GET /v1/stats from the daemon at `url`; an unreachable daemon or a refusal is one line, exit 2."""
    import httpx

    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    if url.startswith("unix:"):
        path = url.removeprefix("unix:").removeprefix("//")
        client = httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://kvstore", headers=headers)
    else:
        client = httpx.Client(base_url=url, headers=headers)
    try:
        with client:
            response = client.get("/v1/stats", timeout=10.0)
    except httpx.HTTPError as exc:
        _fail(f"no kvstore daemon answers at {url} ({type(exc).__name__}: {exc}); start one with `kvstore serve` "
              "or give its address with --url")
    if response.status_code != 200:
        detail = response.text.strip().replace("\n", " ")[:300]
        _fail(f"the daemon at {url} answered {response.status_code}: {detail}; "
              "give a token with --token (or KVSTORE_TOKEN)")
    answer: dict[str, object] = response.json()
    return answer


def refuse_if_daemon_holds(config: StoreConfig) -> None:
    """One line and exit 2 when a running daemon holds one of the store's tier directories."""
    from tiers.dir_lock import holder_pid

    for tier in config.tiers:
        if tier.kind in LOCAL_DIR_KINDS and tier.path and os.path.isdir(tier.path):
            pid = holder_pid(tier.path)
            if pid is not None:
                port = os.environ.get("KVSTORE_PORT")
                url = f"http://127.0.0.1:{port}" if port else DEFAULT_URL
                owner = f"PID {pid}" if pid > 0 else "another process"
                _fail(f"a running kvstore daemon ({owner}) holds this store ({tier.path}); ask it instead: "
                      f"kvstore stats --url {url} (the address `kvstore serve` printed)")


def _fail(message: str) -> None:
    typer.echo(f"kvstore stats: {message}", err=True)
    raise typer.Exit(2)
