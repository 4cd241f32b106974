"""`kvstore stats`: open the configured store (rebuilding its index from disk) and print its stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def stats_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config")] = None,
) -> None:
    """Open the configured store (rebuilding its index from disk) and print its stats."""
    from kvstore.config import load_config
    from kvstore.store import TieredStore

    with TieredStore(load_config(config)) as store:
        typer.echo(json.dumps(store.stats(), indent=2))
