"""`kvstore stats`: open the configured store (rebuilding its index from disk) and print its stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def stats_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config")] = None,
) -> None:
    """Open the configured store (rebuilding its index from disk) and print its stats and where it writes."""
    from kvstore.cli.checked_config import load_checked_config
    from kvstore.store import TieredStore
    from kvstore.where import where_lines

    store_config = load_checked_config(config, command="stats")
    with TieredStore(store_config) as store:
        stats_out = {**store.stats(), "where": where_lines(store_config, shm_name=store.host_shm_name, log=None)}
        typer.echo(json.dumps(stats_out, indent=2))
